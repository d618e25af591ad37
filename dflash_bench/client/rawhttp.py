"""A minimal HTTP/1.1 client on asyncio Protocols, for the streaming hot path (plain http:// only).

Why: the harness's own cost per output token and the lag of its timestamps behind the wire both come
from the client's event-loop work per chunk. Here each network read is timestamped in `data_received`,
the moment the event loop reads the socket, and parsed right there (chunked transfer decoding, SSE line
splitting, JSON) with no task switch per chunk. docs/results/harness.md has the method and the command of
the measurements that made this the default; aiohttp and httpx remain selectable (and serve https://).

Scope: keep-alive connection pool, `POST` with a JSON body, `GET`; responses with chunked encoding,
Content-Length, or read-until-close. No TLS, no proxies, no redirects, no compression.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from urllib.parse import urlsplit

from dflash_bench.client.protocol import Stream, error_message, event_stream_refusal
from dflash_bench.http_limits import MAX_BODY_BYTES, MAX_ERROR_BODY, BodyTooLong

_clock = time.perf_counter
_TCPI_RTT = 68  # struct tcp_info (linux/tcp.h): byte offset of tcpi_rtt, microseconds


def handshake_s(sock: socket.socket) -> float | None:
    """The TCP handshake of a socket that just connected, SYN to SYN-ACK, as the kernel timed it: Linux's first
    RTT sample (TCP_INFO tcpi_rtt) is the handshake's, taken before any data moved. None where the OS does not
    say (no TCP_INFO), or a SYN was retransmitted (no sample: the kernel's initial value would read as one)."""
    opt = getattr(socket, "TCP_INFO", None)
    if opt is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, opt, 104)
    except OSError:
        return None
    if len(info) < _TCPI_RTT + 4 or info[2]:  # info[2]: tcpi_retransmits
        return None
    return struct.unpack_from("I", info, _TCPI_RTT)[0] / 1e6


MAX_HEAD_BYTES = 64 * 2**10  # a response's status line and headers: a server's run a few hundred bytes
MAX_CHUNK_LINE = 4 * 2**10  # a chunk-size line (the size in hex, any extensions)

class _Response:
    """Parser state of one response; feeds an SSE Stream or collects a whole body. Everything it holds is bounded
    (headers, a chunk-size line, a whole body, an error body; the stream's unended line by the Stream), and every byte is
    handled a fixed number of times, however the server cuts its answer into reads and chunks."""

    __slots__ = ("st", "url", "status", "head", "chunked", "remaining", "body", "held", "buf", "chunk_left", "skip",
                 "content_type", "done", "keep_alive", "fut")

    def __init__(self, st: Stream | None, fut: asyncio.Future, url: str):
        self.st = st
        self.url = url  # named when a whole body is past MAX_BODY_BYTES
        self.fut = fut
        self.status = 0
        self.head = True
        self.chunked = False
        self.remaining = -1  # Content-Length left; -1: until close
        self.body: list[bytes] = []
        self.held = 0  # bytes in `body`
        self.buf = b""  # the headers, or a chunk-size line, not yet ended
        self.chunk_left = 0  # bytes of the current chunk's data still to come
        self.skip = 0  # bytes of the CRLF after a chunk's data still to come
        self.content_type: str | None = None
        self.done = False
        self.keep_alive = True

    def feed(self, t: float, data: bytes) -> None:
        if self.head:
            buf = (self.buf + data if self.buf else data).lstrip(b"\r\n")  # a previous response's last CRLF may arrive late
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise ValueError(f"response headers longer than {MAX_HEAD_BYTES >> 10} KiB")
                self.buf = buf
                return
            self._headers(buf[:end])
            self.buf, data = b"", buf[end + 4:]
            if self.st is not None and self.status == 200:
                self.st.error = event_stream_refusal(self.content_type)
                if self.st.error:
                    return  # its body is not read: the connection is closed
        if data and self.st is not None and self.st.t_first_byte is None:
            self.st.t_first_byte = t  # the first byte of the body, as the other transports stamp it
        if self.chunked:
            self._chunks(t, data)
        else:
            if self.remaining >= 0:
                data, extra = data[:self.remaining], data[self.remaining:]
                self.remaining -= len(data)
                if extra:
                    self.keep_alive = False
            self._payload(t, data)
            if self.remaining == 0:
                self.done = True

    def _headers(self, raw: bytes) -> None:
        lines = raw.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        self.status = int(parts[1])
        if parts[0] == b"HTTP/1.0":
            self.keep_alive = False
        self.head = False
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            k = k.strip().lower()
            v = v.strip().lower()
            if k == b"transfer-encoding" and b"chunked" in v:
                self.chunked = True
            elif k == b"content-length":
                self.remaining = int(v)
            elif k == b"connection" and v == b"close":
                self.keep_alive = False
            elif k == b"content-type":
                self.content_type = v.decode("latin-1")
        if self.remaining < 0 and not self.chunked:
            self.keep_alive = False

    def _chunks(self, t: float, data: bytes) -> None:
        """Chunked transfer decoding as the bytes come: a chunk whole in this read goes on at once; one cut by the
        read goes on piece by piece as it arrives (never held until it is whole), so a chunk of any size costs its
        length once."""
        pos, n = 0, len(data)
        while pos < n:
            if self.chunk_left:  # the rest of a chunk an earlier read began
                take = min(self.chunk_left, n - pos)
                self._payload(t, data[pos:pos + take] if take < n else data)
                self.chunk_left -= take
                pos += take
                if not self.chunk_left:
                    self.skip = 2  # the CRLF that ends the chunk's data
                continue
            if self.skip:
                step = min(self.skip, n - pos)
                pos, self.skip = pos + step, self.skip - step
                continue
            eol = data.find(b"\n", pos)
            if eol < 0:
                self.buf += data[pos:]
                if len(self.buf) > MAX_CHUNK_LINE:
                    raise ValueError(f"a chunk-size line longer than {MAX_CHUNK_LINE >> 10} KiB")
                return
            line = self.buf + data[pos:eol] if self.buf else data[pos:eol]
            self.buf = b""
            size = int(line.split(b";", 1)[0], 16)  # int() takes the line's CR off
            if size <= 0:
                if size < 0:
                    raise ValueError(f"a negative chunk size {size}")
                self.done = True  # last chunk (trailers, if any, are ignored)
                return
            start = eol + 1
            if start + size + 2 <= n:  # the whole chunk and its CRLF in this read: the common case
                self._payload(t, data[start:start + size])
                pos = start + size + 2
            else:
                self.chunk_left, pos = size, start

    def _payload(self, t: float, data: bytes) -> None:
        st = self.st
        if st is None:  # a whole body (a GET), kept up to MAX_BODY_BYTES
            if self.held + len(data) > MAX_BODY_BYTES:
                raise BodyTooLong(self.url)
        elif self.status != 200:  # an error answer to a stream: its first bytes say why, the rest is left unread
            data = data[:max(MAX_ERROR_BODY - self.held, 0)]
        else:
            if not st.error:
                st.feed_bytes(t, data)
            return
        self.body.append(data)
        self.held += len(data)


class _Conn(asyncio.Protocol):
    def __init__(self, pool: "RawTransport"):
        self.pool = pool
        self.tr: asyncio.Transport | None = None
        self.resp: _Response | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tr = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        r = self.resp
        if r is None:
            return
        t = _clock()
        try:
            r.feed(t, data)
        except BodyTooLong as err:
            self._finish(err)
            return
        except (ValueError, IndexError) as err:
            self._finish(ValueError(f"malformed HTTP response: {err}"))
            return
        if r.done or (r.st is not None and (r.st.error or (r.status != 200 and r.held >= MAX_ERROR_BODY))):
            self._finish(None)  # an error answer past MAX_ERROR_BODY: what it says is kept, the connection closed

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        r = self.resp
        if r is not None:
            if r.remaining < 0 and not r.chunked and not r.head:
                r.done = True  # a read-until-close body ends here
                self._finish(None)
            else:
                self._finish(ConnectionResetError("the server closed the connection mid-response"))

    def _finish(self, err: Exception | None) -> None:
        r, self.resp = self.resp, None
        if r is None:
            return
        if err is not None or not r.done or not r.keep_alive:
            self.close()  # an unread rest or a broken connection cannot carry the next request
        if not r.fut.done():
            r.fut.set_exception(err) if err is not None else r.fut.set_result(r)

    def close(self) -> None:
        self.closed = True
        if self.tr is not None:
            self.tr.close()


class RawTransport:
    """Keep-alive pool of raw HTTP/1.1 connections to one http:// server."""

    def __init__(self, base_url: str, connections: int):
        u = urlsplit(base_url)
        if u.scheme != "http":
            raise ValueError("the raw transport speaks plain http:// only; use --transport aiohttp for https://")
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.prefix = u.path.rstrip("/")
        self.hosthdr = f"{self.host}:{self.port}".encode()
        self.idle: list[_Conn] = []
        self.all: set[_Conn] = set()
        self._addr: tuple | None = None  # the server's resolved address (resolved once)

    async def _acquire(self, st: Stream | None = None) -> tuple[_Conn, bool]:
        while self.idle:
            c = self.idle.pop()
            if not c.closed:
                if st is not None and st.connection is None:
                    st.connection = "reused"
                return c, True
        loop = asyncio.get_running_loop()
        t = _clock()
        try:
            if self._addr is None:
                family, _, _, _, addr = (await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM))[0]
                self._addr = (family, addr)
            family, addr = self._addr
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, addr)
            except BaseException:
                sock.close()
                raise
            handshake = handshake_s(sock)
            _, conn = await loop.create_connection(lambda: _Conn(self), sock=sock)
        except OSError as err:
            raise ConnectionError(f"cannot connect to {self.host}:{self.port}: {err.strerror or err}") from None
        self.all.add(conn)
        if st is not None:  # the connect is its own figure, never part of TTFT
            waited = _clock() - t
            st.connection = "new"
            if handshake is not None:
                st.connect_s = (st.connect_s or 0.0) + handshake
            st.connect_wait_s = (st.connect_wait_s or 0.0) + max(waited - (handshake or 0.0), 0.0)
        return conn, False

    def _release(self, c: _Conn) -> None:
        if c.closed:
            self.all.discard(c)
        else:
            self.idle.append(c)

    async def _request(self, method: bytes, path: str, body: bytes, st: Stream | None) -> _Response:
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n" \
               b"Content-Length: %d\r\n\r\n" % (method, (self.prefix + path).encode(), self.hosthdr, len(body))
        while True:
            c, reused = await self._acquire(st)
            r = c.resp = _Response(st, asyncio.get_running_loop().create_future(),
                                   f"http://{self.host}:{self.port}{self.prefix}{path}")
            if st is not None:
                st.t_write = _clock()
            assert c.tr is not None  # connection_made set it before create_connection returned
            c.tr.write(head + body)
            try:
                return await r.fut
            except ConnectionResetError:
                if reused and r.head and not r.buf:
                    continue  # the server closed an idle keep-alive connection as we reused it: retry once fresh
                raise
            except BaseException:
                c.resp = None
                c.close()  # cancelled (timeout) or failed mid-response: the connection is unusable
                raise
            finally:
                self._release(c)

    async def stream(self, path: str, body: bytes, st: Stream) -> None:
        try:
            r = await self._request(b"POST", path, body, st)
        except ConnectionResetError as err:
            st.error = f"stream dropped: {err}"
            return
        except (ConnectionError, ValueError) as err:
            st.error = f"connection failed: {err}"
            return
        if r.status != 200:
            st.error = error_message(r.status, b"".join(r.body))

    async def get(self, path: str) -> tuple[int, bytes]:
        r = await self._request(b"GET", path, b"", None)
        return r.status, b"".join(r.body)

    async def close(self) -> None:
        for c in list(self.all):
            c.close()
        self.all.clear()
        self.idle.clear()

    def fresh_connection(self) -> None:
        """Close the oldest idle connection: a request of the measured window that finds the pool one short
        opens a new one, so its handshake is timed (at concurrency 1 the probe's and warm-up's connection would
        carry every request; at 8 every new connection would fall in the warm-up)."""
        while self.idle:
            c = self.idle.pop(0)
            self.all.discard(c)
            if not c.closed:
                c.close()
                return
