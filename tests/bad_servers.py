"""Small misbehaving OpenAI-style servers on 127.0.0.1, for tests and benchmarks/faults.py.

`BadServer(kind)` runs one in a daemon thread (its own event loop) and serves until `close()`:
- "plain": a third-party shape (guidellm's mock-server): one token per SSE chunk, no per-chunk usage
  (only the final usage chunk), and /metrics answers 404.
- "hang": accepts every connection and never answers.
- "script": like plain, but the model's text is planted HTML (`<script>` ...), to check escaping.
- "abort": a request refused inside a 200 stream. `/generate` answers as SGLang 0.5.16's DFLASH answered
  `return_logprob` on an H100: one token, then `finish_reason {"type": "abort", "status_code": 400, ...}`;
  the OpenAI routes as vLLM ends an aborted request: one token, then `finish_reason "abort"`.
Connections are kept alive, so a client's connect count is observable (`connections`).
`accept_delay_s`: the server accepts each connection that long after it is pending (the kernel completed its
handshake), one at a time, and records when (`accepted`, perf_counter).
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
import time

SCRIPT = "<script>alert('x')</script><img src=x onerror=alert(1)>"
WORDS = ["alpha", " beta", " gamma", " delta", " epsilon", " zeta", " eta", " theta"]


class BadServer:
    def __init__(self, kind: str = "plain", tokens: int = 8, accept_delay_s: float = 0.0):
        self.kind, self.tokens, self.accept_delay_s = kind, tokens, accept_delay_s
        self.accepted: list[float] = []
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "BadServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closing = True
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._closing = False
        if self.accept_delay_s:
            listener = socket.create_server(("127.0.0.1", 0), backlog=64)
            self._server = None
            self.port = listener.getsockname()[1]
            threading.Thread(target=self._accept_late, args=(listener,), daemon=True).start()
        else:
            self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    def _accept_late(self, listener: socket.socket) -> None:
        with listener:
            while not self._closing:
                if not select.select([listener], [], [], 0.05)[0]:
                    continue  # nothing pending
                time.sleep(self.accept_delay_s)
                conn, _ = listener.accept()
                self.accepted.append(time.perf_counter())
                conn.setblocking(False)
                asyncio.run_coroutine_threadsafe(self._serve_accepted(conn), self._loop)

    async def _serve_accepted(self, conn: socket.socket) -> None:
        reader, writer = await asyncio.open_connection(sock=conn)
        await self._handle(reader, writer)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if self.kind == "hang":
                    await asyncio.sleep(3600)
                lines = head.decode().split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = next((int(ln.split(":", 1)[1]) for ln in lines if ln.lower().startswith("content-length")), 0)
                body = await reader.readexactly(length) if length else b""
                await self._route(method, path, body, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _route(self, method: str, path: str, body: bytes, w: asyncio.StreamWriter) -> None:
        if path == "/v1/models":
            data = json.dumps({"object": "list", "data": [{"id": "bad-model", "object": "model"}]}).encode()
            w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
        elif method == "POST" and path == "/generate" and self.kind == "abort":
            await self._abort(w)
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            await self._stream(path.endswith("chat/completions"), w)
        else:
            w.write(b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 9\r\n\r\nnot found")
        await w.drain()

    async def _stream(self, chat: bool, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        pieces = [SCRIPT] + WORDS[: self.tokens - 1] if self.kind == "script" else \
            [WORDS[i % len(WORDS)] for i in range(self.tokens)]
        if self.kind == "abort":
            pieces = pieces[:1]
        for piece in pieces:  # one token per chunk, no usage in it
            choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            await self._event(w, {"id": "x", "object": "chunk", "choices": [choice]})
            await asyncio.sleep(0.001)
        finish = "abort" if self.kind == "abort" else "length"
        await self._event(w, {"id": "x", "choices": [{"index": 0, "delta": {}, "text": "", "finish_reason": finish}]})
        await self._event(w, {"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": len(pieces),
                                                                  "total_tokens": 5 + len(pieces)}})
        w.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")

    async def _abort(self, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        reason = {"type": "abort", "message": "DFLASH speculative decoding does not support return_logprob yet.",
                  "status_code": 400, "err_type": "BadRequestError"}
        await self._event(w, {"text": " (", "output_ids": [374], "meta_info": {
            "id": "x", "finish_reason": reason, "prompt_tokens": 5, "completion_tokens": 1}})
        w.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")

    @staticmethod
    async def _event(w: asyncio.StreamWriter, obj: dict) -> None:
        w.write(_chunk(b"data: " + json.dumps(obj).encode() + b"\n\n"))
        await w.drain()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)
