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


def get_capped(client: httpx.Client, url: str) -> tuple[int, bytes]:
    """(status, body) of GET `url` (absolute, or relative to the client's base URL); BodyTooLong past
    MAX_BODY_BYTES, the rest left unread and the connection closed."""
    with client.stream("GET", url) as r:
        parts: list[bytes] = []
        held = 0
        for data in r.iter_bytes():
            held += len(data)
            if held > MAX_BODY_BYTES:
                raise BodyTooLong(str(r.url))
            parts.append(data)
        return r.status_code, b"".join(parts)
