"""HTTP transports for the streaming loop: the hot path of the whole harness.

Each feeds a `Stream` with every SSE `data:` payload, stamped with the time of the network read that
carried it (one clock read per read, not per event). `auto` (the default) picks `raw` (rawhttp.py) for
http:// and aiohttp for https://: measured here (docs/results/harness.md) raw stamps the first token
within a fraction of a millisecond of the packet on the wire even at concurrency 256, where aiohttp's
stamps lag by tens of ms and httpx's by seconds; their CPU per token is alike for raw and aiohttp.
"""

from __future__ import annotations

import asyncio
import time
from types import ModuleType, SimpleNamespace
from typing import Any, AsyncIterator, Awaitable, Callable, Protocol, TypeVar

from dflash_bench.client.protocol import Stream, error_message, event_stream_refusal
from dflash_bench.http_limits import MAX_ERROR_BODY, BodyTooLong, WholeBody

T = TypeVar("T")

TRANSPORTS = ("auto", "raw", "aiohttp", "httpx")
_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}


class Transport(Protocol):
    async def stream(self, path: str, body: bytes, st: Stream) -> None: ...
    async def get(self, path: str) -> tuple[int, bytes]: ...
    async def close(self) -> None: ...

    def fresh_connection(self) -> None:
        """Make some request of the measured window open a new connection, whose TCP handshake it then times
        (connect_ms); a no-op where the transport times no handshake apart (aiohttp, httpx)."""


class AiohttpTransport:
    def __init__(self, base_url: str, connections: int):
        import aiohttp

        self._aiohttp = aiohttp
        self.base = base_url.rstrip("/")
        conn = aiohttp.TCPConnector(limit=connections, limit_per_host=connections, ttl_dns_cache=3600)
        self.session = aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None),
                                             auto_decompress=False, trace_configs=[_aiohttp_trace(aiohttp)])

    async def stream(self, path: str, body: bytes, st: Stream) -> None:
        try:
            async with self.session.post(self.base + path, data=body, headers=_HEADERS, trace_request_ctx=st) as resp:
                if resp.status != 200:
                    st.error = error_message(resp.status, await _error_body(resp.content.iter_any()))
                    if not resp.content.at_eof():
                        resp.close()  # its rest unread: the connection cannot carry another request
                    return
                await _read_sse(st, resp.headers.get("Content-Type"), resp.content.iter_any())
        except self._aiohttp.ClientPayloadError as err:
            st.error = f"stream dropped: {err}"
        except self._aiohttp.ClientError as err:
            st.error = f"connection failed: {type(err).__name__}: {err}"

    async def get(self, path: str) -> tuple[int, bytes]:
        url = self.base + path
        async with self.session.get(url) as resp:
            try:
                return resp.status, await _whole_body(url, resp.headers.get("Content-Length"), resp.content.iter_any())
            except BodyTooLong:
                resp.close()  # its rest unread: the connection cannot carry another request
                raise

    async def close(self) -> None:
        await self.session.close()

    def fresh_connection(self) -> None:
        """Nothing: this transport does not time the TCP handshake apart from its wait (connect_wait_ms)."""


def _aiohttp_trace(aiohttp: ModuleType) -> Any:
    """Connect time and the moment the request was written, onto the request's Stream (see rawhttp)."""
    config = aiohttp.TraceConfig()

    async def connect_start(session: object, ctx: SimpleNamespace, params: object) -> None:  # noqa: ARG001
        ctx.t_connect = time.perf_counter()

    async def connect_end(session: object, ctx: SimpleNamespace, params: object) -> None:  # noqa: ARG001
        st = ctx.trace_request_ctx
        if isinstance(st, Stream):  # the handshake is not seen apart from the loop's wait: all of it is the wait
            st.connection = "new"
            st.connect_wait_s = (st.connect_wait_s or 0.0) + time.perf_counter() - ctx.t_connect

    async def reused(session: object, ctx: SimpleNamespace, params: object) -> None:  # noqa: ARG001
        st = ctx.trace_request_ctx
        if isinstance(st, Stream) and st.connection is None:
            st.connection = "reused"

    async def headers_sent(session: object, ctx: SimpleNamespace, params: object) -> None:  # noqa: ARG001
        st = ctx.trace_request_ctx
        if isinstance(st, Stream):
            st.t_write = time.perf_counter()

    config.on_connection_create_start.append(connect_start)
    config.on_connection_create_end.append(connect_end)
    config.on_connection_reuseconn.append(reused)
    config.on_request_headers_sent.append(headers_sent)
    return config


def _httpx_trace(st: Stream) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
    """httpx's per-request trace extension: connect time and the request's write, onto `st`."""
    started = [0.0]

    async def trace(event: str, info: dict[str, Any]) -> None:  # noqa: ARG001
        if event == "connection.connect_tcp.started":
            started[0] = time.perf_counter()
        elif event == "connection.connect_tcp.complete":  # as aiohttp's: the handshake is not seen apart
            st.connection = "new"
            st.connect_wait_s = (st.connect_wait_s or 0.0) + time.perf_counter() - started[0]
        elif event == "http11.send_request_headers.started":
            st.connection = st.connection or "reused"
            st.t_write = time.perf_counter()

    return trace


async def _read_sse(st: Stream, content_type: str | None, chunks: AsyncIterator[bytes]) -> None:
    """Stamp each read as it arrives and hand it to the SSE parser (aiohttp and httpx alike), which holds the
    transports to its limits (protocol.py): a line past MAX_LINE_BYTES, or a 200 that is not an event stream,
    ends the request with the reason, and the connection with it (its body is left unread)."""
    st.error = event_stream_refusal(content_type)
    if st.error:
        return
    clock = time.perf_counter
    async for data in chunks:
        t = clock()
        if st.t_first_byte is None:
            st.t_first_byte = t
        st.feed_bytes(t, data)
        if st.error:
            return


async def _whole_body(url: str, length: str | None, chunks: AsyncIterator[bytes]) -> bytes:
    """A GET's answer (aiohttp and httpx alike), kept as a WholeBody, as the raw transport keeps it."""
    body = WholeBody(url, length)
    async for data in chunks:
        body.add(data)
    return body.value()


async def _error_body(chunks: AsyncIterator[bytes]) -> bytes:
    """The first MAX_ERROR_BODY bytes of an error answer, which say why; the rest is not read (aiohttp and httpx
    alike, as the raw transport)."""
    parts: list[bytes] = []
    held = 0
    async for data in chunks:
        parts.append(data[:MAX_ERROR_BODY - held])
        held += len(data)
        if held >= MAX_ERROR_BODY:
            break
    return b"".join(parts)


class HttpxTransport:
    def __init__(self, base_url: str, connections: int):
        import httpx

        self._httpx = httpx
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self.client = httpx.AsyncClient(base_url=base_url.rstrip("/"), limits=limits, timeout=None)

    async def stream(self, path: str, body: bytes, st: Stream) -> None:
        try:
            async with self.client.stream("POST", path, content=body, headers=_HEADERS,
                                          extensions={"trace": _httpx_trace(st)}) as resp:
                if resp.status_code != 200:  # leaving `stream` closes the connection if the rest is unread
                    st.error = error_message(resp.status_code, await _error_body(resp.aiter_bytes()))
                    return
                await _read_sse(st, resp.headers.get("Content-Type"), resp.aiter_raw())
        except (self._httpx.RemoteProtocolError, self._httpx.ReadError) as err:
            st.error = f"stream dropped: {err}"
        except self._httpx.HTTPError as err:
            st.error = f"connection failed: {type(err).__name__}: {err}"

    async def get(self, path: str) -> tuple[int, bytes]:
        async with self.client.stream("GET", path) as resp:  # leaving it closes the connection if the rest is unread
            return resp.status_code, await _whole_body(str(resp.url), resp.headers.get("Content-Length"),
                                                       resp.aiter_bytes())

    async def close(self) -> None:
        await self.client.aclose()

    def fresh_connection(self) -> None:
        """Nothing: this transport does not time the TCP handshake apart from its wait (connect_wait_ms)."""


def make_transport(name: str, base_url: str, connections: int) -> Transport:
    if name == "auto":
        name = "raw" if base_url.startswith("http://") else "aiohttp"
    if name == "raw":
        from dflash_bench.client.rawhttp import RawTransport

        return RawTransport(base_url, connections)
    if name == "aiohttp":
        return AiohttpTransport(base_url, connections)
    if name == "httpx":
        return HttpxTransport(base_url, connections)
    raise ValueError(f"unknown transport {name!r}; choose one of {', '.join(TRANSPORTS)}")


async def with_timeout(coro: Awaitable[T], seconds: float | None) -> T:
    """Run `coro` under a deadline; None means no deadline."""
    if seconds is None:
        return await coro
    async with asyncio.timeout(seconds):
        return await coro
