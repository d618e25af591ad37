"""The load generator against servers that fail (the emulator's injected faults, benchmarks/fixtures/bad_servers.py):
failed records with their reasons, timeouts, crashes, aborts, what a server does not report."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_bench.client import measure_cell
from dflash_bench.emulator import EmulatorProcess
from benchmarks.fixtures.bad_servers import BadServer
from benchmarks.fixtures.emulator_truth import prompts
from client_helpers import cell, measured


@pytest.mark.parametrize("kind,reason", [("error", "HTTP 500"), ("stream-error", "server error in stream"),
                                         ("drop", "stream dropped"), ("malformed", "malformed SSE event")])
@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_server_failures_become_failed_records(tmp_path: Path, kind: str, reason: str, transport: str):
    with EmulatorProcess(mode="ar", ttft_ms=2, itl_ms=1, output_len=8, fail_every=3, fail_kind=kind) as em:
        s = measure_cell(em.url, prompts(9), concurrency=3, cell_dir=cell(tmp_path), warmup=False, timeout=20,
                         transport=transport)
    assert s.status == "partial" and s.failure_reason.startswith("3 of 9 measured requests failed: ")
    assert (s.num_requests, s.num_ok, s.num_failed) == (9, 6, 3)
    recs = measured(tmp_path)
    failed = [r for r in recs if r.error]
    assert len(failed) == 3 and all(r.error.startswith(reason) for r in failed), [r.error for r in failed]
    assert s.failures == {reason.split(":")[0]: 3}
    # failures carry no tokens into the statistics
    assert s.total_output_tokens == sum(r.output_tokens for r in recs if r.ok)


@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_hung_stream_times_out(tmp_path: Path, transport: str):
    with EmulatorProcess(mode="ar", ttft_ms=2, itl_ms=1, output_len=8, fail_every=2, fail_kind="hang") as em:
        s = measure_cell(em.url, prompts(4), concurrency=2, cell_dir=cell(tmp_path), warmup=False, timeout=0.6,
                         transport=transport)
    assert (s.num_ok, s.num_failed) == (2, 2)
    assert all(r.error.startswith("timeout") for r in measured(tmp_path) if r.error)


@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_server_crash_mid_cell_is_a_partial_cell(tmp_path: Path, transport: str):
    em = EmulatorProcess(mode="ar", ttft_ms=2, itl_ms=2, output_len=16, crash_after_requests=5)
    try:
        s = measure_cell(em.url, prompts(12), concurrency=2, cell_dir=cell(tmp_path), warmup=False, timeout=20,
                         transport=transport)
    finally:
        code = em.close()
    assert code == 3
    assert s.num_ok >= 4 and s.num_failed == 12 - s.num_ok
    assert set(s.failures) <= {"connection failed", "stream dropped", "stream ended before [DONE] (dropped by the server)"}
    assert s.status == "partial" and f"{s.num_failed} of 12 measured requests failed" in s.failure_reason


def test_everything_failing_marks_the_cell_failed(tmp_path: Path):
    with EmulatorProcess(mode="ar", fail_every=1, fail_kind="error") as em:
        s = measure_cell(em.url, prompts(3), concurrency=1, cell_dir=cell(tmp_path), warmup=False)
    assert s.status == "failed" and "HTTP 500 (3)" in s.failure_reason
    assert (tmp_path / "sw" / "cells" / "c" / "summary.json").exists()


def test_raw_transport_for_https_is_a_user_error(tmp_path: Path):
    from dflash_bench.errors import UserError

    with pytest.raises(UserError, match="plain http"):
        measure_cell("https://127.0.0.1:9", prompts(1), concurrency=1, cell_dir=cell(tmp_path), transport="raw")
    assert not (tmp_path / "sw").exists()


# ---------------------------------------------------------------- measurement gaps and timeouts


@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
def test_itl_is_derived_from_chunks_when_the_server_sends_no_per_chunk_usage(tmp_path: Path, transport: str):
    from benchmarks.fixtures.bad_servers import BadServer

    with BadServer("plain", tokens=6) as srv:
        s = measure_cell(srv.url, prompts(3), concurrency=1, cell_dir=cell(tmp_path), warmup=False, transport=transport)
    assert s.status == "complete" and s.total_output_tokens == 18
    assert s.itl_ms is not None and s.itl_ms.n == 15  # 5 gaps per request, one token each
    assert s.chunk_gap_ms.n == 15 and s.tokens_per_chunk.mean == 1.0
    assert "no per-chunk usage" in s.not_measured["itl_ms"]
    recs = measured(tmp_path)
    assert all(r.chunk_tokens == [1, 2, 3, 4, 5, 6] and r.chunk_tokens_from == "text" for r in recs)


def test_a_dflash_cell_without_acceptance_source_is_flagged(tmp_path: Path):
    from benchmarks.fixtures.bad_servers import BadServer

    with BadServer("plain") as srv:
        s = measure_cell(srv.url, prompts(2), concurrency=1, cell_dir=cell(tmp_path), mode="dflash", warmup=False)
        ar = measure_cell(srv.url, prompts(2), concurrency=1, cell_dir=cell(tmp_path, "ar"), mode="ar", warmup=False)
    assert s.status == "complete" and s.acceptance_length is None
    assert "no acceptance source" in s.dflash_warning and "HTTP 404" in s.dflash_warning
    assert ar.dflash_warning is None  # AR is expected not to speculate


def test_a_dflash_cell_whose_drafts_were_never_accepted_is_flagged():
    from dflash_bench.client.summary import dflash_warning
    from dflash_bench.store import CellSummary, ServerMetrics

    base = dict(cell_id="c", engine="vllm", mode="dflash", suite="s", concurrency=1, num_ok=4, total_output_tokens=40)
    none = ServerMetrics(url="http://s/metrics")
    assert "never accepted" in dflash_warning(CellSummary(**base, acceptance_length=1.01, num_drafts=100,
                                                          num_accepted_tokens=1), none)
    assert dflash_warning(CellSummary(**base, acceptance_length=3.0), none) is None
    idle = ServerMetrics(url="http://s/metrics", delta={"vllm:spec_decode_num_drafts_total": 0.0})
    assert "did not move" in dflash_warning(CellSummary(**base), idle)
    # no warning where no request had room for a verify step: max_tokens 2, or every request ended at its first token
    assert dflash_warning(CellSummary(**base, settings={"max_tokens": 2}), idle) is None
    assert "did not move" in dflash_warning(CellSummary(**base, settings={"max_tokens": 3}), idle)
    assert dflash_warning(CellSummary(**{**base, "total_output_tokens": 4}), idle) is None


def test_models_request_obeys_the_timeout(tmp_path: Path):
    from benchmarks.fixtures.bad_servers import BadServer

    from dflash_bench.errors import UserError

    with BadServer("hang") as srv:
        with pytest.raises(UserError, match=r"did not answer GET /v1/models within 0.5 s"):
            measure_cell(srv.url, prompts(1), concurrency=1, cell_dir=cell(tmp_path), timeout=0.5)
    assert not (tmp_path / "sw").exists()


@pytest.mark.parametrize("api", ["generate", "chat"])
def test_a_request_aborted_inside_its_stream_fails_with_the_servers_reason(tmp_path: Path, api: str):
    """SGLang 0.5.16's DFLASH answered `return_logprob` with a 200 stream whose one event says finish_reason
    abort (status 400): measured on an H100, the harness had counted those requests as complete. vLLM ends an
    aborted request with finish_reason "abort" on its OpenAI routes."""
    from benchmarks.fixtures.bad_servers import BadServer

    with BadServer("abort") as srv:
        s = measure_cell(srv.url, prompts(3), concurrency=1, cell_dir=cell(tmp_path), api=api,
                         engine="sglang" if api == "generate" else "vllm", save_token_ids=True, warmup=False)
    assert s.num_ok == 0 and s.num_failed == 3 and s.status != "complete"
    recs = measured(tmp_path)
    assert len(recs) == 3 and all("server aborted the request" in r.error for r in recs)
    if api == "generate":  # SGLang's own reason is kept
        assert all("return_logprob" in r.error for r in recs)


@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
def test_a_line_past_the_limit_fails_the_request_and_one_below_it_is_read(tmp_path: Path, transport: str):
    """One SSE event of more than MAX_LINE_BYTES (sent as one HTTP chunk) fails its request in one sentence, on
    every transport; an event of a megabyte, well below the limit, is read whole."""
    from dflash_bench.http_limits import MAX_LINE_BYTES

    with BadServer("long-line", line_bytes=MAX_LINE_BYTES + 2**20) as srv:
        s = measure_cell(srv.url, prompts(2), concurrency=1, cell_dir=cell(tmp_path), warmup=False, timeout=120,
                         transport=transport)
    errors = [r.error for r in measured(tmp_path)]
    assert s.status == "failed" and s.failures == {"stream line too long": 2}, errors
    assert all(e == errors[0] and f"{MAX_LINE_BYTES >> 20} MiB" in e and "MAX_LINE_BYTES" in e for e in errors)
    with BadServer("long-line", line_bytes=2**20) as srv:
        s = measure_cell(srv.url, prompts(2), concurrency=1, cell_dir=cell(tmp_path, "ok"), warmup=False,
                         timeout=120, transport=transport)
    assert s.status == "complete", s.failure_reason
    texts = {r.output_text or "" for r in measured(tmp_path, "ok")}  # the event's text, whole
    assert len(texts) == 1 and set(text := texts.pop()) == {"x"} and 2**20 - 128 < len(text) < 2**20, len(text)


@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
def test_a_get_answer_past_the_limit_fails_in_one_sentence_and_one_below_it_is_read(transport: str):
    """Every transport keeps a GET's answer (/metrics, /v1/models) whole only up to MAX_BODY_BYTES: a /metrics past
    it fails the scrape in one sentence naming its URL and the limit, and its connection is not reused (the next
    request opens another); one of a megabyte is parsed, and its connection carries the next request."""
    import asyncio

    from dflash_bench.client.cell import scrape_metrics
    from dflash_bench.http_limits import MAX_BODY_BYTES
    from dflash_bench.client.transport import make_transport

    async def scrape_twice(url: str) -> tuple[dict | None, str | None]:
        tr = make_transport(transport, url, 1)
        try:
            got = await scrape_metrics(tr, 120)
            await tr.get("/v1/models")
            return got
        finally:
            await tr.close()

    with BadServer("big-metrics", line_bytes=MAX_BODY_BYTES + 2**20) as srv:
        counters, why = asyncio.run(scrape_twice(srv.url))
        connections = srv.connections
    assert counters is None and connections == 2
    assert why == (f"/metrics: the answer of {srv.url}/metrics is longer than {MAX_BODY_BYTES >> 20} MiB, past the "
                   "client's limit for a whole body (MAX_BODY_BYTES)"), why
    with BadServer("big-metrics", line_bytes=2**20) as srv:
        counters, why = asyncio.run(scrape_twice(srv.url))
        connections = srv.connections
    assert why is None and counters is not None and counters["counters"] == {"requests_total": 7.0}
    assert connections == 1


def test_a_blocking_get_keeps_an_answer_only_up_to_the_limit():
    """What the harness asks of a server outside a measured request (its KV slots from /metrics, the identity of a
    server given by URL) reads the answer only up to MAX_BODY_BYTES: past it the GET fails in one sentence naming its
    URL, and the callers go on without it; an answer below the limit is read whole."""
    import httpx

    from dflash_bench.http_limits import get_capped
    from dflash_bench.http_limits import MAX_BODY_BYTES, BodyTooLong
    from dflash_bench.client.server_slots import server_slots
    from dflash_bench.launch.identity import fingerprint

    with BadServer("big-metrics", line_bytes=MAX_BODY_BYTES + 2**20) as srv:
        with httpx.Client(timeout=120) as client, pytest.raises(BodyTooLong) as err:
            get_capped(client, srv.url + "/metrics")
        assert str(err.value) == (f"the answer of {srv.url}/metrics is longer than {MAX_BODY_BYTES >> 20} MiB, past "
                                  "the client's limit for a whole body (MAX_BODY_BYTES)")
        assert server_slots(srv.url, 120) is None
        assert fingerprint(srv.url, 120) == (["bad-model"], None)
    with BadServer("big-metrics", line_bytes=2**20) as srv, httpx.Client(timeout=120) as client:
        status, body = get_capped(client, srv.url + "/metrics")
    assert status == 200 and 2**20 - 4096 < len(body) <= 2**20 + 4096 and body.rstrip().endswith(b"requests_total 7")


@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
def test_an_error_answer_is_read_only_as_far_as_its_reason(tmp_path: Path, transport: str):
    """An HTTP 500 whose body never ends fails each request with the status and the body's first bytes, on every
    transport: the client stops reading at MAX_ERROR_BODY (reading to the end would wait out the timeout)."""
    with BadServer("endless-error") as srv:
        s = measure_cell(srv.url, prompts(2), concurrency=1, cell_dir=cell(tmp_path), warmup=False, timeout=120,
                         transport=transport)
    errors = [r.error or "" for r in measured(tmp_path)]
    assert s.status == "failed" and s.num_failed == 2, errors
    assert all(e.startswith("HTTP 500: upstream overloaded: xxx") for e in errors), errors


@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
def test_a_200_that_is_not_an_event_stream_is_named_by_its_content_type(tmp_path: Path, transport: str):
    with BadServer("html") as srv:
        s = measure_cell(srv.url, prompts(2), concurrency=1, cell_dir=cell(tmp_path), warmup=False, timeout=20,
                         transport=transport)
    errors = [r.error or "" for r in measured(tmp_path)]
    assert s.status == "failed" and s.failures == {"not an event stream": 2}, errors
    assert all("200" in e and "'text/html; charset=utf-8'" in e and "text/event-stream" in e for e in errors), errors
