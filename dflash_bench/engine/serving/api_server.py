"""The OpenAI-compatible HTTP server of the builtin engine (FastAPI + uvicorn; `serve` runs the engine in a process
of its own, `engine_process.py`).

Endpoints: /v1/chat/completions and /v1/completions (SSE streaming with usage and continuous usage
stats, or one JSON body; usage's `prompt_tokens_details.cached_tokens`: the prompt tokens read from the engine's
prefix cache), /v1/models, /health, /metrics (vLLM's counter names), POST /reset_prefix_cache (vLLM's: the engine
forgets the prompts it keeps, on its own thread between steps; answered {"success": true} once it has).
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable, Literal

import asyncio
import copy
import dataclasses
import logging
import signal
import socket
import sys

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from dflash_bench.engine.serving.api import (
    BadRequest, ChatRequest, CompletionRequest, Formatter, StreamOptions, chat_prompt, completion_prompt,
)
from dflash_bench.engine.bookkeeping import Delta, out_of_vocabulary
from dflash_bench.engine.config import EngineConfig
from dflash_bench.engine.serving.engine_process import EngineProcess
from dflash_bench.engine.serving.loop import SWITCH_INTERVAL_S, EngineLoop
from dflash_bench.engine.serving.metrics_endpoint import render
from dflash_bench.errors import UserError
from dflash_bench.openai_format import new_id

log = logging.getLogger("dflash_bench.engine")


def _error(status: int, message: str) -> JSONResponse:
    kind = "BadRequestError" if status == 400 else "InternalServerError"
    return JSONResponse({"object": "error", "message": message, "type": kind, "param": None, "code": status},
                        status_code=status)


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class Outbox:
    """The engine thread's results for the event loop, handed over once per step (`EngineLoop.flush`).

    One `call_soon_threadsafe` per request per step wakes the event loop 32 times a step at concurrency 32,
    each wake-up taking the GIL from the engine thread; one per step carries them all.
    """

    def __init__(self) -> None:
        self.pending: list[tuple[asyncio.Queue, object]] = []  # appended and swapped on the engine thread only
        self.aloop: asyncio.AbstractEventLoop | None = None

    def sink(self, queue: asyncio.Queue) -> Callable[[object], None]:
        self.aloop = asyncio.get_running_loop()  # the server's one event loop
        return lambda d: self.pending.append((queue, d))

    def flush(self) -> None:
        if self.pending and self.aloop is not None:
            batch, self.pending = self.pending, []
            self.aloop.call_soon_threadsafe(_deliver, batch)


def _deliver(batch: list[tuple[asyncio.Queue, object]]) -> None:
    for queue, item in batch:
        queue.put_nowait(item)


def _settle(done: asyncio.Future, err: Exception | None) -> None:
    if not done.done():  # a handler cancelled meanwhile (its client went away) wants nothing
        done.set_result(err)


def coalesce(first: Delta, queue: asyncio.Queue) -> tuple[Delta, Exception | None]:
    """`first` and the deltas of its request already waiting in `queue`, as one (one SSE chunk), and an error
    that waited behind them: an event loop that fell behind its engine catches up in fewer, larger chunks, as
    vLLM's does."""
    parts, error = [first], None
    while parts[-1].finish is None and not queue.empty():
        item = queue.get_nowait()
        if isinstance(item, Exception):
            error = item
            break
        parts.append(item)
    if len(parts) == 1:
        return first, error
    last = parts[-1]
    lps = None if last.logprobs is None else [e for d in parts for e in (d.logprobs or [])]
    return dataclasses.replace(last, token_ids=[t for d in parts for t in d.token_ids],
                               text="".join(d.text for d in parts), logprobs=lps), error


def build_app(loop: EngineLoop | EngineProcess, model_name: str) -> FastAPI:
    """The FastAPI app serving `loop`'s engine under `model_name` (an `EngineLoop` in this process, or the
    `EngineProcess` that stands for one in a process of its own)."""
    app = FastAPI(title="dflash-bench builtin engine")
    engine = loop.engine
    outbox = Outbox()
    loop.flush = outbox.flush
    # A tokenizer of its own: HF fast tokenizers can fail ("Already borrowed") when one instance encodes on
    # this thread while the engine thread decodes with it.
    tok = copy.deepcopy(engine.tok)
    # --fast --synthetic-acceptance (benchmarking only): every response body and chunk says so
    synthetic = engine.synthetic_acceptance

    def _label(obj: dict) -> dict:
        if synthetic is not None:
            obj["synthetic_acceptance"] = synthetic
        return obj

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, exc: RequestValidationError) -> JSONResponse:
        e = exc.errors()[0] if exc.errors() else {}
        if e.get("type") == "json_invalid":
            return _error(400, f"the request body is not valid JSON ({e.get('ctx', {}).get('error', 'parse error')})")
        where = ".".join(str(x) for x in e.get("loc", ())[1:]) or "body"
        return _error(400, f"invalid request: {where}: {e.get('msg', 'bad value')}")

    @app.exception_handler(BadRequest)
    async def _bad(_req: Request, exc: BadRequest) -> JSONResponse:
        return _error(400, str(exc))

    @app.get("/health")
    async def health() -> Response:  # 503 once the engine thread is gone: requests would wait forever
        return Response(status_code=200 if loop.thread.is_alive() else 503)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "dflash-bench", "max_model_len": engine.max_model_len}]}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render(loop.counters(), model_name), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> JSONResponse:
        """vLLM's route (served in its dev mode; a sweep empties the cache through it before each cell): the engine
        forgets every prompt it keeps for reuse. Answered once the engine thread ran it, between two steps, so a
        request sent after the answer computes its whole prompt (requests running meanwhile run on)."""
        if not loop.thread.is_alive():
            return _error(503, "the engine is not running")
        aloop = asyncio.get_running_loop()
        ran: asyncio.Future = aloop.create_future()

        def done(err: Exception | None) -> None:  # on the engine thread (or the engine process's results thread)
            try:
                aloop.call_soon_threadsafe(_settle, ran, err)
            except RuntimeError:  # the event loop is closed: the server stops, nobody waits
                pass

        loop.reset_prefix_cache(done)
        err = await ran
        if err is not None:
            return JSONResponse({"success": False, "message": f"the prefix cache was not reset: {err}"},
                                status_code=500)
        return JSONResponse({"success": True})

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, raw: Request) -> Response:
        return await _serve("chat", req, chat_prompt(tok, req), raw)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, raw: Request) -> Response:
        return await _serve("completions", req, completion_prompt(tok, req), raw)

    async def _serve(kind: Literal["chat", "completions"], req: ChatRequest | CompletionRequest, prompt: list[int],
                     raw: Request) -> Response:
        if req.model and req.model != model_name:
            return JSONResponse({"object": "error", "message": f"the model {req.model!r} does not exist; this server has {model_name!r}",
                                 "type": "NotFoundError", "param": None, "code": 404}, status_code=404)
        if why := out_of_vocabulary(prompt, engine.vocab_size):
            raise BadRequest(why)
        room = engine.max_model_len - engine.B - 1
        max_tokens = req.wanted_max_tokens() or max(1, room - len(prompt))
        why = engine.check(len(prompt), max_tokens)
        if why:
            raise BadRequest(why)
        params = req.sampling(max_tokens, req.wanted_logprobs())
        if engine.greedy_only and not params.greedy:
            raise BadRequest("this server runs the fast path, which decodes greedily: use temperature 0")
        fmt = Formatter(kind, model_name, tok, req.return_tokens_as_token_ids)
        queue: asyncio.Queue = asyncio.Queue()
        req_id = new_id("req")
        loop.submit(req_id, prompt, params, outbox.sink(queue))
        if req.stream:
            opts = req.stream_options
            return StreamingResponse(_stream(req_id, queue, fmt, opts), media_type="text/event-stream")
        collect = asyncio.ensure_future(_collect(queue))
        gone = asyncio.ensure_future(_disconnect(raw))
        try:  # a client that goes away stops its generation (Starlette does not cancel the handler)
            await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            left = not collect.done()
            if left:
                collect.cancel()
                loop.abort(req_id)
        if left:
            return Response(status_code=499)  # nobody reads it
        result = collect.result()
        if isinstance(result, Exception):
            return _error(500, f"generation failed: {result}")
        return JSONResponse(_label(fmt.full(result, engine.B)))

    async def _collect(queue: asyncio.Queue) -> list[Delta] | Exception:
        deltas: list[Delta] = []
        while not deltas or not deltas[-1].finish:
            d = await queue.get()
            if isinstance(d, Exception):
                return d
            deltas.append(d)
        return deltas

    async def _disconnect(raw: Request) -> None:
        while (await raw.receive())["type"] != "http.disconnect":
            pass

    async def _stream(req_id: str, queue: asyncio.Queue, fmt: Formatter, opts: StreamOptions | None
                      ) -> AsyncIterator[bytes]:
        usage_each = bool(opts and opts.include_usage and opts.continuous_usage_stats)
        done = False
        try:
            if fmt.kind == "chat":
                yield _sse(fmt.role_chunk())
            error: Exception | None = None
            while not done:
                d = error or await queue.get()
                if not isinstance(d, Exception):
                    d, error = coalesce(d, queue)
                if isinstance(d, Exception):
                    yield _sse({"error": {"message": f"generation failed: {d}", "code": 500}})
                    done = True
                    break
                done = d.finish is not None
                yield _sse(_label(fmt.chunk(d, with_usage=usage_each)))
            if opts and opts.include_usage and not isinstance(d, Exception):
                yield _sse(_label(fmt.usage_chunk(d, engine.B)))
            yield b"data: [DONE]\n\n"
        finally:
            if not done:
                loop.abort(req_id)

    return app


def _check_port(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as err:
            raise UserError(f"cannot listen on {host}:{port} ({err.strerror}); pick another --port") from err


def _stopped(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def serve(config: EngineConfig, *, host: str = "127.0.0.1", port: int = 8000, served_model_name: str | None = None,
          log_level: str = "warning") -> None:
    """Load the model(s) as `config` says (`EngineConfig.from_options`: the `dflash-bench serve` command's) and serve
    until interrupted."""
    import uvicorn

    from dflash_bench.engine.build import load_tokenizer, resolved

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")  # before the build's lines

    _check_port(host, port)
    # uvicorn re-raises the SIGTERM it stopped on once it has; by default that would end this process before the
    # engine's is stopped below
    signal.signal(signal.SIGTERM, _stopped)
    config = resolved(config)  # a config no engine runs is refused here, before the engine's process starts
    # the engine steps in a process of its own: this one's GIL, busy with HTTP and SSE, never holds a step back
    engine = EngineProcess(config, load_tokenizer(config.model))
    try:
        sys.setswitchinterval(SWITCH_INTERVAL_S)  # each step's results reach the event loop without a 5 ms wait
        name = served_model_name or config.model
        app = build_app(engine, name)
        log.info("serving %s (mode %s, block size %d, prefill %s) on http://%s:%d", name, config.mode,
                 engine.engine.B, config.step.prefill, host, port)
        uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)
    finally:
        engine.stop()
