"""Connect measured as what it is: a new connection's TCP handshake, SYN to SYN-ACK as the
kernel timed it, apart from the rest of the wait for it (the client's event loop), and every measured request
says whether it opened a connection or reused one. Against a real server that accepts each connection late:
the kernel completes the handshake before the server accepts, so that wait is the server's, in TTFT."""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace

import pytest

from benchmarks.fixtures.bad_servers import BadServer
from dflash_bench.client.loadgen import LoadGenerator, LoadSettings
from dflash_bench.client.protocol import RequestSettings
from dflash_bench.client.rawhttp import RawTransport
from dflash_bench.metrics.definitions import summarize, ttft_ms

DELAY_S = 1.0  # how long after the handshake the server accepts each connection


def _load(url: str, concurrency: int, n: int):
    async def go():
        tr = RawTransport(url, concurrency)
        try:
            gen = LoadGenerator(tr, RequestSettings(max_tokens=8), LoadSettings(concurrency=concurrency, warmup=False))
            res = await gen.run([SimpleNamespace(id=f"p{i}", turns=[f"prompt {i}"]) for i in range(n)])
            return res
        finally:
            await tr.close()

    return asyncio.run(go())


@pytest.mark.skipif(not hasattr(socket, "TCP_INFO"), reason="the kernel's handshake timing needs TCP_INFO (Linux)")
def test_the_connect_is_the_handshake_not_the_wait_for_accept():
    with BadServer("plain", accept_delay_s=DELAY_S) as srv:
        res = _load(srv.url, 1, 2)
        accepted = list(srv.accepted)
    first, second = sorted(res.records, key=lambda r: r.t_send)
    assert (first.connection, second.connection) == ("new", "reused")  # every request says which
    assert second.connect_ms is None and second.connect_wait_ms is None
    assert first.connect_ms is not None and first.connect_wait_ms is not None
    # both parts lie inside dispatch -> write; the request was written before the server accepted the
    # connection, so the connect did not wait for the accept; the first token came after it (in TTFT)
    assert (first.connect_ms + first.connect_wait_ms) / 1000.0 <= first.t_write - first.t_send
    (accept,) = accepted
    assert res.t0 + first.t_write < accept < res.t0 + first.t_first_token
    assert ttft_ms(first) >= (accept - res.t0 - first.t_write) * 1000.0


def test_every_measured_request_says_new_or_reused_at_concurrency():
    with BadServer("plain", accept_delay_s=0.05) as srv:
        res = _load(srv.url, 4, 12)
        connections = srv.connections
    assert all(r.connection in ("new", "reused") for r in res.records)
    new = [r for r in res.records if r.connection == "new"]
    assert len(new) == connections >= 4  # what the requests say is what the server saw
    s = summarize(res.records)
    assert s["connections_reused"] == 12 - len(new) and s["connect_wait_ms"].n == len(new)
    if hasattr(socket, "TCP_INFO"):
        assert s["connect_ms"].n == len(new)


def _cell(url: str, concurrency: int, transport):
    """As a cell runs: the /v1/models probe, the warm-up, then the measured requests, over one transport."""
    async def go():
        tr = transport(url, concurrency + 2)
        try:
            await tr.get("/v1/models")
            gen = LoadGenerator(tr, RequestSettings(max_tokens=8), LoadSettings(concurrency=concurrency))
            return await gen.run([SimpleNamespace(id=f"p{i}", turns=[f"prompt {i}"]) for i in range(2 * concurrency)])
        finally:
            await tr.close()

    return asyncio.run(go())


@pytest.mark.parametrize("concurrency", [1, 8])
def test_every_cell_opens_a_connection_in_its_measured_window(concurrency):
    """At concurrency 1 the probe's connection would carry every request, and at 8 every new connection
    would fall in the warm-up: the measured window opens one of its own, so connect_ms is measured, or says why."""
    from dflash_bench.metrics.definitions import not_measured

    with BadServer("plain") as srv:
        res = _cell(srv.url, concurrency, RawTransport)
    measured = [r for r in res.records if not r.warmup]
    assert sum(r.connection == "new" for r in measured) >= 1
    if hasattr(socket, "TCP_INFO"):
        assert summarize(res.records)["connect_ms"].n >= 1 and "connect_ms" not in not_measured(res.records)
    pytest.importorskip("aiohttp")
    from dflash_bench.client.transport import AiohttpTransport

    with BadServer("plain") as srv:  # a transport that times no handshake apart: the summary says why
        res = _cell(srv.url, concurrency, AiohttpTransport)
    why = not_measured(res.records)["connect_ms"]
    assert why.startswith("every measured request reused a connection") or "handshake was not timed" in why
