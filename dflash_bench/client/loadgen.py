"""The load generator: closed loop (exactly N requests in flight) or Poisson arrivals under a cap, or a steady
stream (`LoadSettings.steady_requests`): N requests kept in flight, each finished one replaced at once, the prompts
cycled (ids "<id>~2", ...), until the window's last completion; then nothing more is sent and the requests still in
flight (the tail) finish and are recorded. metrics/definitions.py measures the window between.

A warm-up of N requests (N = concurrency) runs first and is recorded but excluded from every statistic.
Multi-turn prompts send turn k+1 after the model's own reply to turn k, in the same slot.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Iterator, Protocol, Sequence

from dflash_bench.client.protocol import PATHS, RequestSettings, Stream, build_body
from dflash_bench.client.transport import Transport, with_timeout
from dflash_bench.store import RequestRecord
from dflash_bench.store.cells import History

class Conversation(Protocol):
    """What the load sends of a prompt: its id and its user turns (suites.Prompt, or one sent again)."""

    @property
    def id(self) -> str: ...

    @property
    def turns(self) -> Sequence[str]: ...


ProgressFn = Callable[[int, int, int, float], None]  # (requests done, total, output tokens, s since measuring began)


@dataclass
class LoadSettings:
    """How a cell's requests are sent: how many at once, at what rate, over which transport."""

    concurrency: int = 1
    request_rate: float | None = None  # requests/s (Poisson); None: closed loop
    warmup: bool = True
    warmup_max_tokens: int = 64
    timeout: float | None = 600.0  # per request, seconds
    seed: int = 0
    transport: str = "auto"  # client/transport.py TRANSPORTS
    # the measured window lasts at least this long: the prompts are sent again (ids "<id>~2", "~3", ...) until it
    # does, so that a short cell lasts long enough for its energy to be measured (--min-cell-seconds)
    min_seconds: float = 0.0
    # a steady stream (--steady-requests): the window holds this many completions, after `steady_ramp` (None: the
    # concurrency) completions of ramp-up; None: the prompts are sent once as a closed batch
    steady_requests: int | None = None
    steady_ramp: int | None = None
    # what a later turn carries of the earlier ones' answers: "answers", the server's own (a real conversation), or
    # "blank", empty ones (random weights: each engine's answers are noise of its own, and would make its later
    # prompts its own: one's decode to newlines, another's to nothing)
    history: History = "answers"

    @property
    def ramp(self) -> int:
        """Completions before a steady stream's window opens."""
        return self.concurrency if self.steady_ramp is None else self.steady_ramp


@dataclass
class LoadResult:
    records: list[RequestRecord]
    t_start: float  # perf_counter of the first measured dispatch
    t_end: float  # perf_counter when the last measured request ended
    t0: float  # perf_counter origin of the records' times
    notes: list[str] = field(default_factory=list)
    passes: int = 1  # times the prompt list was sent (more than once: --min-cell-seconds)


class LoadGenerator:
    def __init__(self, transport: Transport, req: RequestSettings, load: LoadSettings,
                 on_progress: ProgressFn | None = None, between: Callable[[], Awaitable[None]] | None = None):
        self.tr = transport
        self.req = req
        self.load = load
        self.on_progress = on_progress
        self.between = between  # awaited after warm-up, before the measured window (metrics scrape)
        self.path = PATHS[req.api]
        self.records: list[RequestRecord] = []
        self.t0 = time.perf_counter()
        self._seq = 0
        self._done = 0
        self._tokens = 0
        self._total = 0
        self._t_start = self.t0  # reset when the measured window starts (progress tok/s excludes warm-up)
        self._closed = False  # a steady stream's window has closed: send nothing more

    async def one(self, prompt_id: str, turn: int, messages: list[dict], warmup: bool,
                  max_tokens: int | None = None) -> Stream:
        """Send one streaming request and record it (whatever happens)."""
        st = Stream(self.req.api, self.req.save_token_ids and not warmup)
        body = build_body(self.req, messages, max_tokens)
        t_send = time.perf_counter()
        try:
            await with_timeout(self.tr.stream(self.path, body, st), self.load.timeout)
        except TimeoutError:
            st.error = f"timeout: no complete response within {self.load.timeout:g} s"
        if st.error is None and not st.done:
            st.error = "stream ended before [DONE] (dropped by the server)"
        if st.error is None and st.output_tokens is None:
            st.error = "the server sent no usage (token counts); cannot measure this request"
        if st.error is None:
            st.finish_tokens()
        t_end = st.t_end if st.t_end is not None else time.perf_counter()
        self.records.append(self._record(st, prompt_id, turn, warmup, t_send, t_end))
        if not warmup:
            self._done += 1
            if self.load.steady_requests and self._done >= self.load.ramp + self.load.steady_requests:
                self._closed = True
            if st.error is None:
                self._tokens += st.output_tokens or 0
            if self.on_progress:
                self.on_progress(self._done, self._total, self._tokens, time.perf_counter() - self._t_start)
        return st

    def _record(self, st: Stream, prompt_id: str, turn: int, warmup: bool, t_send: float, t_end: float) -> RequestRecord:
        t0 = self.t0
        self._seq += 1
        # microseconds are finer than anything measured here and halve requests.jsonl
        rel = lambda t: None if t is None else round(t - t0, 6)  # noqa: E731
        return RequestRecord(
            request_id=f"{'w' if warmup else 'r'}{self._seq}", prompt_id=prompt_id, turn=turn, warmup=warmup,
            t_send=rel(t_send), t_write=rel(st.t_write),
            connect_ms=None if st.connect_s is None else round(st.connect_s * 1000.0, 3),
            connect_wait_ms=None if st.connect_wait_s is None else round(st.connect_wait_s * 1000.0, 3),
            connection=st.connection, t_first_byte=rel(st.t_first_byte), t_first_token=rel(st.t_first_token),
            t_end=rel(t_end), chunk_times=[round(t - t0, 6) for t in st.times], chunk_tokens=st.tokens,
            chunk_tokens_from=st.tokens_from if st.tokens else None,
            prompt_tokens=st.prompt_tokens, cached_prompt_tokens=st.cached_tokens, output_tokens=st.output_tokens,
            finish_reason=st.finish,
            error=st.error, spec_verify_ct=st.spec_steps, spec_accepted_tokens=st.spec_accepted,
            spec_draft_tokens=st.spec_drafted,
            output_text=st.output_text(), **st.saved_ids())

    async def conversation(self, prompt_id: str, turns: Sequence[str], warmup: bool = False) -> None:
        messages: list[dict] = []
        for i, text in enumerate(turns):
            if self._closed and not warmup:
                return
            messages.append({"role": "user", "content": text})
            mt = min(self.req.max_tokens, self.load.warmup_max_tokens) if warmup else None
            st = await self.one(prompt_id, i, list(messages), warmup, mt)
            if st.error is not None:
                return  # a later turn needs this turn's reply
            messages.append({"role": "assistant", "content": st.output_text() if self.load.history == "answers" else ""})

    async def warm_up(self, prompts: Sequence[Conversation]) -> None:
        """The warm-up (LoadSettings.warmup): `concurrency` requests at once of the first prompts, recorded and
        excluded from every statistic; their text altered so the measured prompts find nothing of theirs in a
        prefix cache."""
        if self.load.warmup and prompts:
            warm = [prompts[i % len(prompts)] for i in range(self.load.concurrency)]
            await asyncio.gather(*(self.conversation(f"warmup/{p.id}", [f"(warm-up {i}) {p.turns[0]}"], True)
                                   for i, p in enumerate(warm)))

    @property
    def output_tokens(self) -> int:
        """Output tokens of the measured requests that succeeded so far."""
        return self._tokens

    def open_window(self, total: int) -> float:
        """The measured window opens now, `total` requests to come (for progress); its perf_counter time. Some
        request of it opens a new connection (`Transport.fresh_connection`): connect_ms is measured in every cell."""
        self.tr.fresh_connection()
        self._total = total
        self._t_start = time.perf_counter()
        return self._t_start

    async def run(self, prompts: Sequence[Conversation]) -> LoadResult:
        n = self.load.concurrency
        await self.warm_up(prompts)
        if self.between is not None:
            await self.between()
        t_start = self.open_window(sum(len(p.turns) for p in prompts))
        if self.load.steady_requests and prompts:
            self._total = self.load.ramp + self.load.steady_requests
            passes = await self._steady(prompts)
            return LoadResult(self.records, t_start, time.perf_counter(), self.t0, [], passes)
        passes = 0
        while not passes or (prompts and self._window() < self.load.min_seconds):
            passes += 1
            batch = prompts if passes == 1 else [_again(p, passes) for p in prompts]
            if passes > 1:
                self._total += sum(len(p.turns) for p in prompts)
            if self.load.request_rate:
                await self._open_loop(batch)
            else:
                it = iter(batch)
                await asyncio.gather(*(self._worker(it) for _ in range(min(n, len(batch)))))
        t_end = time.perf_counter()
        notes = [f"the prompts were sent {passes} times so that the cell lasted at least {self.load.min_seconds:g} s "
                 "(--min-cell-seconds)"] if passes > 1 else []
        return LoadResult(self.records, t_start, t_end, self.t0, notes, passes)

    async def _steady(self, prompts: Sequence[Conversation]) -> int:
        """Keep `concurrency` conversations going, the prompts cycled, until the window closes; the passes begun."""
        passes = [0]

        def feed() -> Iterator[Conversation]:
            while True:
                passes[0] += 1
                yield from (prompts if passes[0] == 1 else [_again(p, passes[0]) for p in prompts])

        it = feed()

        async def slot() -> None:
            while not self._closed:
                p = next(it)
                await self.conversation(p.id, p.turns)

        await asyncio.gather(*(slot() for _ in range(self.load.concurrency)))
        return passes[0]

    def _window(self) -> float:
        """Seconds from the first measured dispatch to the last measured completion (the cell's duration_s)."""
        measured = [r for r in self.records if not r.warmup]
        ends = [r.t_end for r in measured if r.t_end is not None]
        return max(ends) - min(r.t_send for r in measured) if ends else 0.0

    async def _worker(self, it: Iterator[Conversation]) -> None:
        for p in it:  # a shared iterator: each worker takes the next prompt when its last one ends
            await self.conversation(p.id, p.turns)

    async def _open_loop(self, prompts: Sequence[Conversation]) -> None:
        offsets = arrival_offsets(len(prompts), self.load.request_rate or 0.0, self.load.seed)
        sem = asyncio.Semaphore(self.load.concurrency)
        tasks = []
        t = time.perf_counter()

        async def go(p: Conversation) -> None:
            try:
                await self.conversation(p.id, p.turns)
            finally:
                sem.release()

        for p, offset in zip(prompts, offsets):  # prompt i is never sent before t + offsets[i]
            delay = t + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await sem.acquire()
            tasks.append(asyncio.create_task(go(p)))
        await asyncio.gather(*tasks)


@dataclass(frozen=True)
class _Again:
    """A prompt sent again to lengthen a cell, under its own id (`<id>~<pass>`)."""

    id: str
    turns: Sequence[str]


def _again(p: Conversation, n: int) -> _Again:
    return _Again(f"{p.id}~{n}", p.turns)


def arrival_offsets(n: int, rate: float, seed: int) -> list[float]:
    """Open-loop arrival times in seconds after the first: a Poisson process of `rate` requests/s, seeded."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out
