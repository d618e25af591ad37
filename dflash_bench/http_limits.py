"""What the harness keeps of a server's answers, whoever sent them (a server it launched, one given by URL, a
hostile one): the longest stream line, the longest whole answer, how much of an error answer is read, and a blocking
GET held to those limits (/metrics and /v1/models outside a measured request: the KV slots, a server's identity).
Every transport of client/ holds a server to the same limits (client/protocol.py, transport.py, rawhttp.py)."""

from __future__ import annotations

import httpx

# The longest SSE line a request's stream may hold before its line end: memory per connection stays below it, and
# a server that sends more without a newline fails the request. A real event is a few KB (SGLang's /generate
# repeats the text so far: about 4 bytes a token), so 8 MiB leaves a thousand times that.
MAX_LINE_BYTES = 8 * 2**20
# A whole answer the client keeps (GET /metrics, /v1/models): vLLM's /metrics runs to tens of KB, so a server past
# this would grow the client's memory without end, as a stream's line past MAX_LINE_BYTES would.
MAX_BODY_BYTES = 64 * 2**20
# What is kept of an error answer's body (a status other than 200): its first bytes say why; the rest is not read.
MAX_ERROR_BODY = 64 * 2**10


class BodyTooLong(ValueError):
    """A GET's answer past MAX_BODY_BYTES: the request fails in one sentence naming its URL and the limit, and its
    connection is closed with the rest unread."""

    def __init__(self, url: str):
        super().__init__(f"the answer of {url} is longer than {MAX_BODY_BYTES >> 20} MiB, past the client's limit "
                         "for a whole body (MAX_BODY_BYTES)")


class WholeBody:
    """A GET's answer kept up to MAX_BODY_BYTES, whatever client reads it: BodyTooLong, naming `url`, where its
    Content-Length says it is longer or as soon as it turns out to be (the rest left unread)."""

    def __init__(self, url: str, length: str | None = None) -> None:
        if length is not None and length.strip().isdigit() and int(length) > MAX_BODY_BYTES:
            raise BodyTooLong(url)
        self.url = url
        self.parts: list[bytes] = []
        self.held = 0

    def add(self, data: bytes) -> None:
        self.held += len(data)
        if self.held > MAX_BODY_BYTES:
            raise BodyTooLong(self.url)
        self.parts.append(data)

    def value(self) -> bytes:
        return b"".join(self.parts)


def get_capped(client: httpx.Client, url: str) -> tuple[int, bytes]:
    """(status, body) of GET `url` (absolute, or relative to the client's base URL), the body a WholeBody."""
    with client.stream("GET", url) as r:
        body = WholeBody(str(r.url), r.headers.get("Content-Length"))
        for data in r.iter_bytes():
            body.add(data)
        return r.status_code, body.value()
