"""The emulator's HTTP side: a minimal asyncio HTTP/1.1 server (keep-alive, chunked SSE) and its routes.

No web framework, so it starts in well under a second and spends little CPU per chunk. Routes: GET
/health, /v1/models, /metrics; POST /v1/chat/completions, /v1/completions (vLLM format, streaming or not)
and /generate (SGLang native format), /reset_prefix_cache (vLLM's). See `model.py` for the timing model.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from contextlib import aclosing
from typing import Any, AsyncGenerator

import orjson

from dflash_bench.emulator.model import EmulatorModel, EmulatorConfig, Plan, logprob_entry, token_text
from dflash_bench.openai_format import Reply, usage

_DONE = b"data: [DONE]\n\n"
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal EmulatorServer Error"}


def _text(ids: list[int]) -> str:
    return "".join(token_text(t) for t in ids)


def _logprobs(ids: list[int], chat: bool) -> dict:
    """vLLM's logprobs of a chunk: chat's per-token entries, or the completions' parallel lists."""
    ents = [logprob_entry(t) for t in ids]
    if chat:
        return {"content": ents}
    return {"tokens": [e["token"] for e in ents], "token_logprobs": [e["logprob"] for e in ents],
            "top_logprobs": [{x["token"]: x["logprob"] for x in e["top_logprobs"]} for e in ents]}


async def _sleep_until(loop: asyncio.AbstractEventLoop, t: float) -> None:
    d = t - loop.time()
    await asyncio.sleep(d if d > 0 else 0)


class _EmulatorConn:
    """One response on a keep-alive connection: plain JSON or a chunked event stream."""

    def __init__(self, writer: asyncio.StreamWriter):
        self.w = writer

    def json(self, status: int, obj: object, ctype: bytes = b"application/json") -> None:
        body = obj if isinstance(obj, bytes) else orjson.dumps(obj)
        head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n" % (
            status, _REASONS.get(status, "Error").encode(), ctype, len(body))
        self.w.write(head + body)

    def start_stream(self) -> None:
        self.w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")

    async def event(self, payload: bytes) -> None:
        self.w.write(b"%x\r\n%s\r\n" % (len(payload), payload))
        await self.w.drain()

    async def data(self, obj: object) -> None:
        await self.event(b"data: " + orjson.dumps(obj) + b"\n\n")

    async def end_stream(self) -> None:
        await self.event(_DONE)
        self.w.write(b"0\r\n\r\n")
        await self.w.drain()


class EmulatorServer:
    def __init__(self, cfg: EmulatorConfig):
        self.em = EmulatorModel(cfg)
        self.cfg = cfg
        self.log: deque[dict] = deque(maxlen=200_000)

    # ---- connection handling ---------------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line.strip():
                    break
                method, target, _ = line.decode("latin-1").split(" ", 2)
                headers: dict[str, str] = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                n = int(headers.get("content-length") or 0)
                body = await reader.readexactly(n) if n else b""
                try:
                    keep = await self.route(method, target.split("?", 1)[0], body, _EmulatorConn(writer))
                except (ConnectionError, asyncio.CancelledError):
                    raise
                except Exception as err:  # noqa: BLE001 - a bad request must not take the server down
                    _EmulatorConn(writer).json(500, {"error": {"message": f"emulator error: {err!r}"[:300], "code": 500}})
                    keep = False
                await writer.drain()
                if not keep or headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    async def route(self, method: str, path: str, body: bytes, conn: _EmulatorConn) -> bool:
        if method == "GET":
            if path == "/health":
                conn.json(200, b"")
            elif path == "/v1/models":
                conn.json(200, {"object": "list", "data": [{"id": self.cfg.model, "object": "model",
                                                            "owned_by": "dflash-bench-emulator", "max_model_len": 32768}]})
            elif path == "/emulator/requests":
                conn.json(200, list(self.log))
            elif path == "/metrics":
                conn.json(200, self.em.metrics_text().encode(), b"text/plain; version=0.0.4; charset=utf-8")
            else:
                conn.json(404, {"error": {"message": f"no route {path}", "type": "NotFoundError", "code": 404}})
            return True
        if path == "/reset_prefix_cache":  # vLLM's (served with VLLM_SERVER_DEV_MODE=1)
            self.em.reset_prefix_cache()
            conn.json(200, {"success": True})
            return True
        if path not in ("/v1/chat/completions", "/v1/completions", "/generate"):
            conn.json(404, {"error": {"message": f"no route {path}", "type": "NotFoundError", "code": 404}})
            return True
        try:
            req = orjson.loads(body)
            if not isinstance(req, dict):
                raise ValueError("body is not a JSON object")
        except ValueError as err:
            conn.json(400, {"error": {"message": f"invalid JSON body: {err}", "type": "BadRequestError", "code": 400}})
            return True
        if path == "/generate":
            return await self.generate(req, conn)
        return await self.openai(req, conn, chat=path.endswith("chat/completions"))

    # ---- the shared timeline -----------------------------------------------------------------------
    async def timeline(self, plan: Plan, t0: float, prompt: str) -> AsyncGenerator[tuple[int, int], None]:
        """Yield (start, end) token slices at the emulated times: first token, then one per verify step.

        What really happened (on the system-wide monotonic clock that time.perf_counter also reads) goes
        to the log served at GET /emulator/requests: arrival, first and last token (stamped just before
        their chunks are written)."""
        em, loop = self.em, asyncio.get_running_loop()
        em.c.running += 1
        em.c.prompt_tokens += plan.prompt_tokens
        n = len(plan.ids)
        try:
            t = t0 + self.cfg.ttft_ms / 1000.0
            await _sleep_until(loop, t)
            em.c.generation_tokens += 1
            t_first = t_last = time.perf_counter()  # stamped just before the chunk is written
            yield 0, 1
            pos = 1
            for k in plan.steps:
                t += em.step_s()
                await _sleep_until(loop, t)
                em.count_step(k)
                end = min(pos + k, n)
                em.c.generation_tokens += end - pos
                t_last = time.perf_counter()
                yield pos, end
                pos = end
            self.log.append({"prompt": prompt[:200], "t_arrival": t0, "t_first": t_first, "t_last": t_last,
                             "tokens": n, "steps": len(plan.steps), "cached_tokens": plan.cached_tokens})
        finally:
            em.c.running -= 1

    def _done(self) -> None:
        self.em.c.requests_ok += 1
        self.em.finished()

    def spec_summary(self, plan: Plan) -> dict:
        b1 = self.cfg.block_size - 1
        steps, acc = len(plan.steps), sum(k - 1 for k in plan.steps)
        hist = [0] * (b1 + 1)
        for k in plan.steps:
            hist[k - 1] += 1
        return {"mean_acceptance_length": 1 + acc / steps if steps else None, "num_spec_steps": steps,
                "num_accepted_draft_tokens": acc, "num_draft_tokens": steps * b1, "num_spec_tokens": b1,
                "draft_acceptance_rate": acc / (steps * b1) if steps else None, "acceptance_histogram": hist}

    # ---- OpenAI-compatible (vLLM format) -----------------------------------------------------------
    async def openai(self, req: dict, conn: _EmulatorConn, chat: bool) -> bool:
        t0 = asyncio.get_running_loop().time()
        if chat:
            msgs = req.get("messages")
            if not isinstance(msgs, list) or not msgs:
                conn.json(400, {"error": {"message": "messages must be a non-empty list", "type": "BadRequestError", "code": 400}})
                return True
            prompt = "\n".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
        else:
            raw = req.get("prompt")
            prompt = raw if isinstance(raw, str) else orjson.dumps(raw).decode()
        max_tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 2048)
        plan = self.em.plan(prompt, max_tokens, ignore_eos=req.get("ignore_eos") is True)
        fault = self.em.fault()
        if fault == "error":
            conn.json(500, {"error": {"message": "planted server error", "type": "InternalServerError", "code": 500}})
            return True
        plan.cached_tokens = self.em.lookup(prompt, plan.prompt_tokens)
        said = self.em.reported(plan)  # the cached tokens its usage says, or None
        reply = Reply("chat" if chat else "completions", self.cfg.model,
                      ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:16])
        want_lp = bool(req.get("logprobs")) if chat else req.get("logprobs") is not None
        if not req.get("stream"):
            async with aclosing(self.timeline(plan, t0, prompt)) as tl:
                async for _ in tl:
                    pass
            self._done()
            conn.json(200, reply.full(_text(plan.ids), plan.finish, usage(plan.prompt_tokens, len(plan.ids), said)))
            return True
        so = req.get("stream_options") or {}
        usage_each = bool(so.get("include_usage") and so.get("continuous_usage_stats"))
        conn.start_stream()

        def chunk(a: int, b: int, finish: str | None) -> dict:
            ids = plan.ids[a:b]
            lp = _logprobs(ids, chat) if want_lp else None
            return reply.chunk(_text(ids), finish, lp, usage(plan.prompt_tokens, b, said) if usage_each else None)

        n = len(plan.ids)
        async with aclosing(self.timeline(plan, t0, prompt)) as tl:
            async for a, b in tl:
                if a == 0 and chat:
                    await conn.data(reply.role_chunk(usage(plan.prompt_tokens, 0, said) if usage_each else None))
                if fault and a > 0:
                    return await self._fault(fault, conn)
                await conn.data(chunk(a, b, plan.finish if b == n else None))
        if so.get("include_usage"):
            metrics = None
            if self.cfg.per_request_spec_metrics and self.cfg.mode == "dflash":
                metrics = {"speculative_decoding": self.spec_summary(plan)}
            await conn.data(reply.usage_chunk(usage(plan.prompt_tokens, n, said), metrics))
        await conn.end_stream()
        self._done()
        return True

    async def _fault(self, kind: str, conn: _EmulatorConn) -> bool:
        if kind == "stream-error":
            await conn.data({"error": {"message": "planted mid-stream error", "type": "InternalServerError",
                                       "param": None, "code": 500}})
            await conn.end_stream()
            return True
        if kind == "malformed":
            await conn.event(b'data: {"id": "broken", "choices": [\n\n')
            await conn.end_stream()
            return True
        if kind == "drop":
            conn.w.transport.abort()
            return False
        await asyncio.sleep(3600)  # hang: the client's timeout must fire
        return False

    # ---- SGLang native /generate ---------------------------------------------------------------------
    async def generate(self, req: dict, conn: _EmulatorConn) -> bool:
        t0 = asyncio.get_running_loop().time()
        sp = req.get("sampling_params") or {}
        prompt = req.get("text")
        if not isinstance(prompt, str):
            prompt = orjson.dumps(req.get("input_ids")).decode()
        plan = self.em.plan(prompt, int(sp.get("max_new_tokens") or 128), ignore_eos=sp.get("ignore_eos") is True)
        fault = self.em.fault()
        if fault == "error":
            conn.json(500, {"object": "error", "message": "planted server error", "type": "InternalServerError", "code": 500})
            return True
        plan.cached_tokens = self.em.lookup(prompt, plan.prompt_tokens)
        rid = uuid.uuid4().hex
        n = len(plan.ids)

        def event(b: int) -> dict:
            done = b == n
            fr = None
            if done:
                fr = {"type": "stop", "matched": 2} if plan.finish == "stop" else {"type": "length", "length": n}
            meta: dict[str, Any] = {"id": rid, "finish_reason": fr, "prompt_tokens": plan.prompt_tokens, "completion_tokens": b,
                    "cached_tokens": plan.cached_tokens or 0}
            if done:
                meta["e2e_latency"] = asyncio.get_running_loop().time() - t0
                if self.cfg.mode == "dflash" and plan.steps:
                    s = self.spec_summary(plan)
                    meta.update(spec_verify_ct=s["num_spec_steps"], spec_accept_length=n / s["num_spec_steps"],
                                spec_accept_rate=s["draft_acceptance_rate"],
                                spec_accept_token_num=s["num_accepted_draft_tokens"],
                                spec_draft_token_num=s["num_draft_tokens"])
            return {"text": _text(plan.ids[:b]), "output_ids": plan.ids[:b], "meta_info": meta}

        if not req.get("stream"):
            async with aclosing(self.timeline(plan, t0, prompt)) as tl:
                async for _ in tl:
                    pass
            self._done()
            conn.json(200, event(n))
            return True
        conn.start_stream()
        async with aclosing(self.timeline(plan, t0, prompt)) as tl:
            async for a, b in tl:
                if fault and a > 0:
                    return await self._fault(fault, conn)
                await conn.data(event(b))
        await conn.end_stream()
        self._done()
        return True


async def _serve(cfg: EmulatorConfig, host: str, port: int) -> None:
    server = EmulatorServer(cfg)
    srv = await asyncio.start_server(server.handle, host, port, backlog=4096, limit=1 << 20)
    bound = srv.sockets[0].getsockname()[1]
    print(f"emulator ({cfg.mode}) listening on http://{host}:{bound}", flush=True)
    async with srv:
        await srv.serve_forever()


def serve(cfg: EmulatorConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the emulator until interrupted. Port 0 picks a free port; the first stdout line names it."""
    try:
        asyncio.run(_serve(cfg, host, port))
    except KeyboardInterrupt:
        pass
