"""The engine thread: admits requests into free slots (prefill), then steps every running sequence together.

A request that arrives while others decode joins at the next step: every waiting prompt that fits a free slot
is prefilled before the next step, one prefill group at a time, those that arrive meanwhile included (the
batch fills before it steps, as a scheduler that puts prefills first does). Results go to each request's `sink`
(a callable run on the engine thread); after each prefill group, each step and each drop of aborted requests
the loop calls `flush` once, so a server can hand a whole step's results to its event loop in one wake-up
rather than one per request.
The loop also keeps how long its thread spent prefilling, stepping and handing results over (`seconds`);
`counters` snapshots them with the engine's own counters for /metrics: where a served run's time goes.
`reset_prefix_cache` queues the engine's `reset_prefix_cache` (POST /reset_prefix_cache) behind what was submitted
before it: the engine thread runs it as it takes it from the inbox, between steps, before any request submitted
after it is prefilled, and then says so to the caller.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, NamedTuple

from dflash_bench.engine.bookkeeping import Delta, Seq, Stats
from dflash_bench.engine.interface import Engine
from dflash_bench.engine.sampling_params import SamplingParams
from dflash_bench.metrics.phases import PHASES  # queue, prefill, decode: a request's time on the server, as vLLM splits it

log = logging.getLogger("dflash_bench.engine")

# The engine thread waits for the GPU without the GIL, then needs it back at once to launch the next step; while
# the event loop writes SSE chunks, CPython makes it wait a whole switch interval (5 ms by default, most of an AR
# step). A short interval bounds that wait.
SWITCH_INTERVAL_S = 0.0002


ResetDone = Callable[[Exception | None], None]  # told, on the engine thread, that a reset ran (None) or why it failed


@dataclass
class _Req:
    req_id: str
    prompt: list[int]
    params: SamplingParams
    sink: Callable[[Delta | Exception], None]
    arrived: float = field(default_factory=time.perf_counter)  # when the loop was handed it


@dataclass
class _Reset:
    """A queued `reset_prefix_cache` and whom to tell once it ran."""

    done: ResetDone


class Event(NamedTuple):
    """A request admitted or finished, after `step` decode steps, while `running` were in the batch."""

    step: int
    kind: str  # "admit" or "finish"
    req_id: str
    running: tuple[str, ...]


@dataclass(frozen=True)
class LoopCounters:
    """What /metrics reports of a loop and its engine, as of one moment (picklable: an engine in another process
    sends it with each step's results)."""

    stats: Stats
    running: int
    waiting: int
    steps: int
    groups: int
    seconds: dict[str, float]
    block_size: int
    slots: int | None  # the KV pool's slots, where the engine has a pool
    mixed_prefills: int | None  # the fast path's prompts that rode in a decode step
    width_policy: str
    synthetic_acceptance: float | None
    # the finished requests' seconds by phase (PHASES), summed, and how many requests they are
    phase_seconds: dict[str, float] = field(default_factory=dict)
    phased_requests: int = 0
    prefix_cache_resets: int = 0  # engine.reset_prefix_cache calls that ran (POST /reset_prefix_cache)


class EngineLoop:
    """Runs an `Engine` on its own thread; `submit` and `abort` are safe to call from any thread."""

    def __init__(self, engine: Engine, flush: Callable[[], None] | None = None):
        """`flush`: called on the engine thread after the sinks of each prefill group and of each step have run."""
        self.engine = engine
        self.flush = flush
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.waiting: deque[_Req] = deque()
        self.running: list[Seq] = []
        self.sinks: dict[str, Callable] = {}
        self._aborted: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.steps = 0  # decode steps run
        self.groups = 0  # prefill groups admitted (requests admitted / groups: prompts per prefill forward)
        self.events: deque[Event] = deque(maxlen=4096)  # the latest admissions and finishes (for tests and logs)
        # seconds the engine thread spent per phase: prefill (admission), step (launch, wait, bookkeeping),
        # emit (sinks and flush, i.e. the hand-over to the server); written by the engine thread only
        self.seconds = {"prefill": 0.0, "step": 0.0, "emit": 0.0}
        # the finished requests' seconds by phase (PHASES), summed, and how many they are: /metrics's
        # vllm:request_<phase>_time_seconds; the running ones' [arrived, prefill started, first token] times
        self.phase_seconds = dict.fromkeys(PHASES, 0.0)
        self.phased = 0
        self._times: dict[str, list[float]] = {}
        self.resets = 0  # prefix cache resets run
        self.thread = threading.Thread(target=self._run, name="dflash-engine", daemon=True)

    def start(self) -> "EngineLoop":
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.inbox.put(None)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():  # a reset the thread will never take is told so, not left waiting
            while not self.inbox.empty():
                item = self.inbox.get_nowait()
                if isinstance(item, _Reset):
                    self._tell(item, RuntimeError("the engine stopped before it reset its prefix cache"))

    def submit(self, req_id: str, prompt: list[int], params: SamplingParams, sink: Callable) -> None:
        self.inbox.put(_Req(req_id, prompt, params, sink))

    def reset_prefix_cache(self, done: ResetDone) -> None:
        """Have the engine forget the prompts it keeps for reuse (`Engine.reset_prefix_cache`), on the engine
        thread between steps, before any request submitted after this call is prefilled; `done` is called on the
        engine thread once it ran (None) or failed (the error). Requests already submitted may be prefilled
        after it."""
        self.inbox.put(_Reset(done))

    def abort(self, req_id: str) -> None:
        """Stop generating for a request (client went away); its slot is freed at the next step."""
        with self._lock:
            self._aborted.add(req_id)
        self.inbox.put(None)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def counters(self) -> LoopCounters:
        """The loop's and its engine's counters now (a copy: the engine thread goes on writing them)."""
        e, st = self.engine, self.engine.stats
        book = getattr(e, "book", None)
        stats = replace(st, accepted_per_pos=list(st.accepted_per_pos), verified_per_pos=list(st.verified_per_pos),
                        widths=dict(st.widths))
        return LoopCounters(stats=stats, running=len(self.running), waiting=len(self.waiting), steps=self.steps,
                            groups=self.groups, seconds=dict(self.seconds), block_size=e.B,
                            slots=getattr(book, "slots", None), mixed_prefills=getattr(e, "mixed_prefills", None),
                            width_policy=getattr(book, "width_policy", "full"),
                            synthetic_acceptance=e.synthetic_acceptance,
                            phase_seconds=dict(self.phase_seconds), phased_requests=self.phased,
                            prefix_cache_resets=self.resets)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._take(block=not self.running and not self.waiting)
            self._drop_aborted()
            while self._admit():
                self._take(block=False)  # what arrived during that prefill joins before the step too
            if self.running:
                self._step()

    def _take(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
            while True:
                if isinstance(item, _Reset):  # in the inbox's order: before whatever was submitted after it
                    self._reset(item)
                elif item is not None:
                    self.waiting.append(item)
                item = self.inbox.get_nowait()
        except queue.Empty:
            pass

    def _reset(self, item: _Reset) -> None:
        """Run a queued reset (on the engine thread: no prefill or step is under way) and say how it went."""
        try:
            self.engine.reset_prefix_cache()
        except Exception as err:  # the engine keeps serving; the caller hears why
            log.exception("resetting the prefix cache failed")
            self._tell(item, err)
            return
        self.resets += 1
        self._tell(item, None)

    @staticmethod
    def _tell(item: _Reset, err: Exception | None) -> None:
        try:
            item.done(err)
        except Exception:  # whoever waited is gone (its event loop closed): the engine thread goes on
            log.exception("could not say that the prefix cache was reset")

    def _drop_aborted(self) -> None:
        with self._lock:
            gone, self._aborted = self._aborted, set()
        if not gone:
            return
        self._take(block=False)  # a request is submitted before its abort: it is in the inbox at the latest now
        self.waiting = deque(r for r in self.waiting if r.req_id not in gone)
        for s in [s for s in self.running if s.req_id in gone]:
            self._finish(s)
        self._flush()  # what counts the running requests hears of it, with no step to follow

    def _admit(self) -> bool:
        """Prefill the oldest waiting requests, as many as the engine's admission takes (the free slots, one
        prefill forward); whether any was taken. Each group's first tokens go out as soon as it is done."""
        if not self.waiting:
            return False
        k = self.engine.admission(r.prompt for r in self.waiting)
        batch = [self.waiting.popleft() for _ in range(k)]
        if batch:
            self._admit_group(batch)
        return bool(batch)

    def _admit_group(self, batch: list[_Req]) -> None:
        self.groups += 1
        t = time.perf_counter()
        started = self._prefill(batch)
        t1 = time.perf_counter()
        for req, seq, delta in started:
            self._start(req, seq, delta, t)
        self._flush()
        self.seconds["prefill"] += t1 - t
        self.seconds["emit"] += time.perf_counter() - t1

    def _prefill(self, batch: list[_Req]) -> list[tuple[_Req, Seq, Delta | None]]:
        """Prefill `batch` (batched when it can); a request whose prefill fails gets the error in its sink."""
        if len(batch) > 1:
            try:
                results = self.engine.add_many([(r.req_id, r.prompt, r.params) for r in batch])
            except Exception:  # retry one by one below, so that only the failing request gets the error
                log.exception("batched prefill failed")
            else:
                return [(req, seq, delta) for req, (seq, delta) in zip(batch, results)]
        started = []
        for req in batch:
            try:
                [(seq, delta)] = self.engine.add_many([(req.req_id, req.prompt, req.params)])
            except Exception as err:  # a failing request must not take the server down
                log.exception("prefill failed")
                req.sink(err)
                continue
            started.append((req, seq, delta))
        return started

    def _start(self, req: _Req, seq: Seq, delta: Delta | None, scheduled: float) -> None:
        """A request in the batch, whose prefill started at `scheduled`; `delta` None: its prefill runs on, its first
        token comes with a step."""
        self._log("admit", req.req_id)
        self.sinks[req.req_id] = req.sink
        self._times[req.req_id] = [req.arrived, scheduled]
        self.running.append(seq)
        if delta is not None:
            self._emit(seq, delta)

    def _step(self) -> None:
        t = time.perf_counter()
        try:
            deltas = self.engine.step(self.running)
        except Exception as err:
            log.exception("decode step failed")
            for s in list(self.running):
                self.sinks[s.req_id](err)
                self._finish(s)
            self._flush()
            return
        t1 = time.perf_counter()
        self.steps += 1
        by_req = {d.req_id: d for d in deltas}  # a pipelined engine may step a request it just admitted later
        for s in list(self.running):
            if s.req_id in by_req:
                self._emit(s, by_req[s.req_id])
        self._flush()
        self.seconds["step"] += t1 - t
        self.seconds["emit"] += time.perf_counter() - t1

    def _flush(self) -> None:
        if self.flush is not None:
            self.flush()

    def _emit(self, seq: Seq, delta: Delta) -> None:
        times = self._times.get(seq.req_id)
        if times is not None and len(times) == 2:  # its first token
            times.append(time.perf_counter())
        self.sinks[seq.req_id](delta)
        if seq.finish:
            self._finish(seq)

    def _finish(self, seq: Seq) -> None:
        self.engine.release(seq)
        self.running.remove(seq)
        self.sinks.pop(seq.req_id, None)
        times = self._times.pop(seq.req_id, None)
        if times is not None and len(times) == 3:  # it had its first token (an abort before it has no phases)
            arrived, scheduled, first = times
            for phase, seconds in zip(PHASES, (scheduled - arrived, first - scheduled, time.perf_counter() - first)):
                self.phase_seconds[phase] += seconds
            self.phased += 1
        self._log("finish", seq.req_id)

    def _log(self, kind: str, req_id: str) -> None:
        self.events.append(Event(self.steps, kind, req_id, tuple(s.req_id for s in self.running)))
