"""The engine in a process of its own, beside the HTTP server's (vLLM's AsyncLLM and EngineCore are the model).

In one process the engine thread and the event loop share one GIL: every SSE chunk the event loop writes
(Starlette, uvicorn and h11: ~50-100 us of Python a chunk) holds back the engine thread's next launch, so a
served step grew with its rows far past the engine's own (benchmarks/speed/serve_profile.py). Here `serve` runs
the `EngineLoop` in a child process and keeps HTTP, chat templates and SSE in its own; two pipes join them:

- requests, server to engine: ("submit", req_id, prompt, params), ("abort", req_id), ("reset", token) (POST
  /reset_prefix_cache: `EngineLoop.reset_prefix_cache`), ("stop",);
- results, engine to server: ("ready", facts, counters) once the engine is built (or ("failed", sentence)), once a
  reset ran ("reset", [token, None or why it failed], counters), then at
  each flush of the loop (after a prefill group, a step, or dropped requests) ("step", results, counters or None):
  every (req_id, Delta or error) since the last as JSON (`encode`: a Delta's fields as a list, an error as its
  sentence; a tenth of pickling the dataclasses), one write a step. The loop's counters (for /metrics) ride along
  only when `counters_due`: a request finished or failed in it (so /metrics counts a request once its client has
  its last token), nothing runs any more, or COUNTERS_EVERY_S passed since the last; snapshotting and pickling
  them each step cost the GIL of both processes tens of microseconds a token.

`EngineProcess` stands where an `EngineLoop` stands for the server (`api_server.build_app`, /metrics): `submit`,
`abort`, `reset_prefix_cache`, `flush`, `counters`, `engine` (what the server asks of an engine: `EngineFacts`)
and `thread` (alive while the engine is). The engine's process ignores Ctrl-C and SIGTERM, as tensor-parallel ranks do: the server
decides, stopping it on its way out, and the engine's process ends by itself when the server's is gone. An engine's
process that ends by itself (a dead rank, a crash) fails the requests in flight with a sentence and stops the server.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Callable

import orjson

from dflash_bench.engine.bookkeeping import Delta, request_refusal
from dflash_bench.engine.config import EngineConfig
from dflash_bench.engine.sampling_params import SamplingParams
from dflash_bench.engine.serving.loop import SWITCH_INTERVAL_S, EngineLoop, LoopCounters, ResetDone
from dflash_bench.errors import UserError

log = logging.getLogger("dflash_bench.engine")

STOP_S = 60.0  # the engine's process is given this long to stop (a tensor-parallel engine stops its ranks)
COUNTERS_EVERY_S = 0.1  # the loop's counters go to the server at least this often while requests run


@dataclass(frozen=True)
class EngineFacts:
    """What the server asks of an engine that runs elsewhere: the `protocol.Engine` facts it reads."""

    tok: Any  # the target's tokenizer, loaded by the server's process
    B: int
    max_model_len: int
    vocab_size: int
    greedy_only: bool
    synthetic_acceptance: float | None

    def check(self, n_prompt: int, max_tokens: int) -> str | None:
        """Why a request cannot be served (None when it can): the engine's own rule."""
        return request_refusal(n_prompt, max_tokens, self.max_model_len, self.B)


class EngineProcess:
    """An `EngineLoop` in a child process, driven over two pipes (see the module)."""

    def __init__(self, config: EngineConfig, tokenizer: Any) -> None:
        """Start the engine's process and wait until its engine is built (`config`: resolved, `build.resolved`);
        a failure to build is a UserError with the engine's sentence."""
        ctx = multiprocessing.get_context("spawn")
        requests, self._requests = ctx.Pipe(duplex=False)
        self._results, results = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=engine_main, args=(config, requests, results), name="dflash-bench-engine")
        self.proc.start()
        requests.close()
        results.close()
        self.flush: Callable[[], None] | None = None
        self._sinks: dict[str, Callable[[Any], None]] = {}
        self._resets: dict[int, ResetDone] = {}  # the resets sent, by token, until the engine says they ran
        self._tokens = itertools.count()
        self._send_lock = threading.Lock()
        self._counters: LoopCounters | None = None
        self._stopping = False
        try:
            msg = self._results.recv()
        except EOFError:
            self.stop()
            raise UserError(f"the engine's process ended before its engine was built (exit code "
                            f"{self.proc.exitcode}; its log is above)") from None
        except BaseException:  # Ctrl-C or SIGTERM while the engine builds: nobody will ask it for anything
            self.proc.kill()
            self.proc.join(10)
            raise
        if msg[0] == "failed":
            self.stop()
            raise UserError(msg[1])
        facts = msg[1]
        self.engine = EngineFacts(tok=tokenizer, **facts)
        self._counters = msg[2]
        self.thread = threading.Thread(target=self._read, name="dflash-engine-results", daemon=True)
        self.thread.start()

    def submit(self, req_id: str, prompt: list[int], params: SamplingParams, sink: Callable[[Any], None]) -> None:
        self._sinks[req_id] = sink
        self._send(("submit", req_id, prompt, params))

    def abort(self, req_id: str) -> None:
        """Stop generating for a request (client went away); what the engine still sends for it is dropped."""
        self._sinks.pop(req_id, None)
        self._send(("abort", req_id))

    def reset_prefix_cache(self, done: ResetDone) -> None:
        """`EngineLoop.reset_prefix_cache` in the engine's process: queued behind what was submitted before, ahead
        of what is submitted after (one pipe, in order); `done` is called on the results thread once it ran."""
        token = next(self._tokens)
        self._resets[token] = done
        self._send(("reset", token))
        if not self.thread.is_alive():  # the engine is gone (its results thread told those it knew of before)
            self._reset_done(token, RuntimeError("the engine's process is gone"))

    def _reset_done(self, token: int, err: Exception | None) -> None:
        done = self._resets.pop(token, None)  # whichever thread pops it tells it, once
        if done is not None:
            done(err)

    def counters(self) -> LoopCounters:
        """The loop's counters as the engine last sent them (`counters_due`: at most COUNTERS_EVERY_S old while
        requests run, current once a request finished or the engine is idle)."""
        assert self._counters is not None
        return self._counters

    def _send(self, msg: tuple) -> None:
        with self._send_lock:  # the event loop and a stopping thread may both send
            try:
                self._requests.send(msg)
            except (BrokenPipeError, OSError):
                pass  # the engine is gone: /health says so, and the request's stream ends with the server

    def _read(self) -> None:
        """The results thread: each step's results to their requests' sinks, then one `flush` for all of them."""
        try:
            while True:
                kind, data, counters = self._results.recv()
                if counters is not None:  # before the sinks: a client that has its last token finds it counted
                    self._counters = counters
                if kind == "reset":
                    token, why = data
                    self._reset_done(token, None if why is None else RuntimeError(why))
                    continue
                results = decode(data)
                for req_id, item in results:
                    sink = self._sinks.get(req_id)
                    if sink is not None:
                        sink(item)
                    if not isinstance(item, Delta) or item.finish is not None:
                        self._sinks.pop(req_id, None)
                if results and self.flush is not None:
                    self.flush()
        except (EOFError, OSError):
            for token in list(self._resets):
                self._reset_done(token, RuntimeError("the engine's process ended before it reset its prefix cache"))
            if self._stopping:
                return
            self.proc.join(10)
            why = f"the engine's process ended by itself (exit code {self.proc.exitcode})"
            log.error("%s: failing the %d requests in flight; the server stops", why, len(self._sinks))
            for sink in list(self._sinks.values()):  # their streams end with the sentence, not in a wait forever
                sink(RuntimeError(why))
            self._sinks.clear()
            if self.flush is not None:
                self.flush()
            # no engine, no server (as a dead tensor-parallel rank takes it down): uvicorn ends what it has begun
            os.kill(os.getpid(), signal.SIGTERM)

    def stop(self) -> None:
        """Stop the engine (and its ranks) and its process; a process that does not end in STOP_S is killed."""
        self._stopping = True
        self._send(("stop",))
        self.proc.join(STOP_S)
        if self.proc.is_alive():
            log.warning("the engine's process did not stop in %.0f s: killing it", STOP_S)
            self.proc.kill()
            self.proc.join(10)
        self._requests.close()


def encode(items: list[tuple[str, Delta | Exception]]) -> bytes:
    """A step's results for the pipe: a Delta as its fields after req_id, in their order (`decode` passes them back
    positionally, so a field added to Delta is added here too), an error as its sentence."""
    return orjson.dumps([(rid, [d.token_ids, d.text, d.prompt_tokens, d.completion_tokens, d.finish, d.logprobs,
                                d.steps, d.accepted, d.drafted, d.cached_tokens] if isinstance(d, Delta) else str(d))
                         for rid, d in items])


def decode(data: bytes) -> list[tuple[str, Delta | Exception]]:
    """`encode`'s inverse (an error comes back as a RuntimeError with its sentence)."""
    return [(rid, Delta(rid, *row) if isinstance(row, list) else RuntimeError(row)) for rid, row in orjson.loads(data)]


def counters_due(items: list[tuple[str, Delta | Exception]], running: int, since_s: float) -> bool:
    """Whether a flush carrying `items` sends the loop's counters too: a request in it finished or failed, no request
    runs any more (/metrics then reads what the engine ends at), or COUNTERS_EVERY_S passed since they were last
    sent (`since_s` ago)."""
    return (since_s >= COUNTERS_EVERY_S or not running
            or any(not isinstance(d, Delta) or d.finish is not None for _, d in items))


def engine_main(config: EngineConfig, requests: Connection, results: Connection) -> None:
    """The engine's process: build the engine, run its loop, take requests until told to stop or the server is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the server decides
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # and so does a SIGTERM sent to the group (launch/)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from dflash_bench.engine.build import build

    try:
        engine = build(config)
    except UserError as err:
        results.send(("failed", str(err)))
        return
    except Exception as err:
        log.exception("the engine could not be built")
        results.send(("failed", f"the engine could not be built: {type(err).__name__}: {err}"))
        return
    pending: list[tuple[str, Delta | Exception]] = []
    loop = EngineLoop(engine)
    sent = [time.monotonic()]  # when the counters were last sent

    def flush() -> None:  # on the engine thread, after a prefill group's, a step's or a drop's sinks
        now = time.monotonic()
        counters = loop.counters() if counters_due(pending, len(loop.running), now - sent[0]) else None
        if counters is not None:
            sent[0] = now
        elif not pending:
            return
        batch = encode(pending)
        pending.clear()
        results.send(("step", batch, counters))

    def sink(req_id: str) -> Callable[[Delta | Exception], None]:
        return lambda d: pending.append((req_id, d))

    def reset_done(token: int) -> ResetDone:  # on the engine thread, as `flush`: one writer of the results pipe
        def done(err: Exception | None) -> None:
            try:
                results.send(("reset", [token, None if err is None else str(err)], loop.counters()))
            except (BrokenPipeError, OSError):
                pass  # the server is gone
        return done

    loop.flush = flush
    results.send(("ready", dict(B=engine.B, max_model_len=engine.max_model_len, vocab_size=engine.vocab_size,
                                greedy_only=engine.greedy_only, synthetic_acceptance=engine.synthetic_acceptance),
                  loop.counters()))
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # this thread takes requests while the engine thread steps
    loop.start()
    try:
        while True:
            msg = requests.recv()
            if msg[0] == "submit":
                _, req_id, prompt, params = msg
                loop.submit(req_id, prompt, params, sink(req_id))
            elif msg[0] == "abort":
                loop.abort(msg[1])
            elif msg[0] == "reset":
                loop.reset_prefix_cache(reset_done(msg[1]))
            else:
                break
    except EOFError:  # the server's process is gone
        pass
    finally:
        loop.stop()
        close = getattr(engine, "close", None)  # a tensor-parallel engine's other ranks end with it
        if close is not None:
            close()
