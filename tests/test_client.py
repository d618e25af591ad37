"""The load generator against a real emulator process: failure records, token ids, SGLang /generate,
multi-turn, Poisson arrivals, both transports."""

from __future__ import annotations

import statistics
from pathlib import Path

import orjson
import pytest

from dflash_bench.client import measure_cell
from dflash_bench.client.loadgen import arrival_offsets
from dflash_bench.client.protocol import RequestSettings, build_body
from dflash_bench.emulator import Emulator, EmulatorConfig, EmulatorProcess
from dflash_bench.store import SweepDir
from benchmarks.fixtures.emulator_truth import P, prompts


def cell(tmp_path: Path, name: str = "c") -> Path:
    return tmp_path / "sw" / "cells" / name


def measured(tmp_path: Path, name: str = "c"):
    return [r for r in SweepDir(tmp_path / "sw").read_requests(name) if not r.warmup]


@pytest.mark.parametrize("kind,reason", [("error", "HTTP 500"), ("stream-error", "server error in stream"),
                                         ("drop", "stream dropped"), ("malformed", "malformed SSE event")])
@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_server_failures_become_failed_records(tmp_path: Path, kind: str, reason: str, transport: str):
    with EmulatorProcess(mode="ar", ttft_ms=2, itl_ms=1, output_len=8, fail_every=3, fail_kind=kind) as em:
        s = measure_cell(em.url, prompts(9), concurrency=3, cell_dir=cell(tmp_path), warmup=False, timeout=20,
                         transport=transport)
    assert s.status == "complete"
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
def test_server_crash_mid_cell_completes_with_failures(tmp_path: Path, transport: str):
    em = EmulatorProcess(mode="ar", ttft_ms=2, itl_ms=2, output_len=16, crash_after_requests=5)
    try:
        s = measure_cell(em.url, prompts(12), concurrency=2, cell_dir=cell(tmp_path), warmup=False, timeout=20,
                         transport=transport)
    finally:
        code = em.close()
    assert code == 3
    assert s.num_ok >= 4 and s.num_failed == 12 - s.num_ok
    assert set(s.failures) <= {"connection failed", "stream dropped", "stream ended before [DONE] (dropped by the server)"}
    assert s.status == "complete"


def test_everything_failing_marks_the_cell_failed(tmp_path: Path):
    with EmulatorProcess(mode="ar", fail_every=1, fail_kind="error") as em:
        s = measure_cell(em.url, prompts(3), concurrency=1, cell_dir=cell(tmp_path), warmup=False)
    assert s.status == "failed" and "HTTP 500 (3)" in s.failure_reason
    assert (tmp_path / "sw" / "cells" / "c" / "summary.json").exists()


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_token_ids_and_top2_logprobs_are_saved(tmp_path: Path, api: str):
    ps = prompts(4)
    with EmulatorProcess(mode="dflash", ttft_ms=2, itl_ms=1, output_len=20, seed=3) as em:
        measure_cell(em.url, ps, concurrency=2, cell_dir=cell(tmp_path), api=api, save_token_ids=True, max_tokens=64)
    plans = {p.id: Emulator(EmulatorConfig(output_len=20, seed=3)).plan(p.turns[0], 64) for p in ps}
    for r in measured(tmp_path):
        assert r.token_ids == plans[r.prompt_id].ids  # the AR emulator's ids: DFlash is lossless here
        assert len(r.top_logprobs) == len(r.token_ids) and all(len(t) == 2 for t in r.top_logprobs)
        assert [t[0][0] for t in r.top_logprobs] == r.token_ids


def test_sglang_generate_reads_tau_from_meta_info(tmp_path: Path):
    ps = prompts(10)
    cfg = EmulatorConfig(mode="dflash", ttft_ms=2, itl_ms=1, output_len=40, acceptance_length=4.0)
    with EmulatorProcess(mode="dflash", ttft_ms=2, itl_ms=1, output_len=40, acceptance_length=4.0) as em:
        s = measure_cell(em.url, ps, concurrency=4, cell_dir=cell(tmp_path), engine="sglang", api="generate",
                         save_token_ids=True, max_tokens=128)
    plans = [Emulator(cfg).plan(p.turns[0], 128) for p in ps]
    assert s.acceptance_source == "sglang-meta"
    assert s.acceptance_length == pytest.approx(sum(len(p.ids) for p in plans) / sum(len(p.steps) for p in plans))
    assert s.acceptance_length_req_weighted == pytest.approx(
        statistics.mean(len(p.ids) / len(p.steps) for p in plans))
    assert s.total_output_tokens == sum(len(p.ids) for p in plans)
    assert all(r.token_ids and len(r.token_ids) == r.output_tokens for r in measured(tmp_path))


def test_vllm_per_request_spec_metrics_give_request_weighted_tau(tmp_path: Path):
    with EmulatorProcess(mode="dflash", ttft_ms=2, itl_ms=1, output_len=40, per_request_spec_metrics=True) as em:
        s = measure_cell(em.url, prompts(8), concurrency=4, cell_dir=cell(tmp_path))
    assert s.acceptance_source == "vllm-metrics"
    assert s.acceptance_length_req_weighted is not None and 1 < s.acceptance_length_req_weighted <= 16
    recs = measured(tmp_path)
    steps = sum(r.spec_verify_ct for r in recs)
    assert s.num_drafts == steps  # the counters and the per-request stats reconcile
    assert s.acceptance_length == pytest.approx(1 + sum(r.spec_accepted_tokens for r in recs) / steps)


def test_multi_turn_sends_the_models_own_reply(tmp_path: Path):
    conv = [P("mt/1", ["first turn", "second turn"]), P("mt/2", ["hello", "and again"])]
    with EmulatorProcess(mode="ar", ttft_ms=2, itl_ms=1, output_len=12) as em:
        s = measure_cell(em.url, conv, concurrency=2, cell_dir=cell(tmp_path), warmup=False)
    assert s.num_requests == 4 and s.num_ok == 4
    em_model = Emulator(EmulatorConfig(output_len=12))
    by = {(r.prompt_id, r.turn): r for r in measured(tmp_path)}
    for p in conv:
        first = by[(p.id, 0)]
        assert first.output_text == "".join(f" w{t}" for t in em_model.plan(p.turns[0], 2048).ids)
        # the emulator sees the whole conversation: user turn, the model's reply, user turn
        second = em_model.plan("\n".join([p.turns[0], first.output_text, p.turns[1]]), 2048)
        assert by[(p.id, 1)].output_tokens == len(second.ids)
        assert by[(p.id, 1)].t_send >= first.t_end


def test_poisson_arrivals_are_exponential_and_seeded():
    offsets = arrival_offsets(4001, 100.0, seed=1)
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    mean = statistics.mean(gaps)
    assert 0.0095 < mean < 0.0105  # 1 / (100 req/s) = 10 ms, over 4000 seeded draws
    assert 0.9 < statistics.stdev(gaps) / mean < 1.1  # exponential gaps (CV 1), not a fixed clock
    assert arrival_offsets(50, 100.0, seed=1) == arrival_offsets(50, 100.0, seed=1) != arrival_offsets(50, 100.0, seed=2)


def test_open_loop_sends_no_request_before_its_arrival_time(tmp_path: Path):
    with EmulatorProcess(mode="ar", ttft_ms=1, itl_ms=1, output_len=2) as em:
        s = measure_cell(em.url, prompts(60), concurrency=60, cell_dir=cell(tmp_path), request_rate=100.0,
                         warmup=False, seed=1)
    planned = dict(zip((p.id for p in prompts(60)), arrival_offsets(60, 100.0, seed=1)))
    sends = {r.prompt_id: r.t_send for r in measured(tmp_path)}
    # the records' clock starts before the schedule does, so a send can only be at or after its arrival time
    assert all(sends[pid] >= planned[pid] - 1e-6 for pid in planned)
    assert max(planned.values()) > 0.3  # so the last sends waited for a schedule that spread them out
    assert s.settings.request_rate == 100.0


def test_all_transports_agree(tmp_path: Path):
    ps = prompts(6)
    with EmulatorProcess(mode="dflash", ttft_ms=2, itl_ms=1, output_len=24) as em:
        out = {t: measure_cell(em.url, ps, concurrency=3, cell_dir=cell(tmp_path, t), transport=t, save_token_ids=True)
               for t in ("raw", "aiohttp", "httpx")}
    ids = lambda n: {r.prompt_id: r.token_ids for r in measured(tmp_path, n)}  # noqa: E731
    for t, s in out.items():
        assert s.num_ok == 6 and s.total_output_tokens == out["raw"].total_output_tokens, t
        assert ids(t) == ids("raw") and s.acceptance_length is not None
        for r in measured(tmp_path, t):
            assert r.t_send < r.t_first_byte <= r.t_first_token <= r.chunk_times[-1] <= r.t_end, t


def test_request_body_sends_temperature_thinking_and_logprobs():
    s = RequestSettings(api="chat", model="m", max_tokens=7, temperature=0.0, save_token_ids=True, enable_thinking=False)
    body = orjson.loads(build_body(s, [{"role": "user", "content": "hi"}]))
    assert body["temperature"] == 0.0 and body["max_tokens"] == 7 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["logprobs"] is True and body["top_logprobs"] == 2 and body["return_tokens_as_token_ids"] is True
    assert "ignore_eos" not in body
    gen = orjson.loads(build_body(RequestSettings(api="generate", max_tokens=5), [{"role": "user", "content": "x"}]))
    assert gen["sampling_params"] == {"max_new_tokens": 5, "temperature": 0.0} and gen["text"] == "x"
    plain = orjson.loads(build_body(RequestSettings(api="chat", model="m"), [{"role": "user", "content": "x"}]))
    assert "chat_template_kwargs" not in plain and "logprobs" not in plain


def test_generate_renders_the_chat_template(tmp_path: Path):
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]")
    fast.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    fast.save_pretrained(tmp_path / "tok")
    import httpx

    with EmulatorProcess(mode="dflash", ttft_ms=1, itl_ms=1, output_len=8) as em:
        s = measure_cell(em.url, prompts(2), concurrency=1, cell_dir=cell(tmp_path), engine="sglang", api="generate",
                         tokenizer=str(tmp_path / "tok"), warmup=False)
        seen = [e["prompt"] for e in httpx.get(em.url + "/emulator/requests").json()]
    assert s.num_ok == 2 and s.settings.prompt_rendering.startswith("chat template of")
    assert sorted(seen) == sorted(f"<|user|>{p.turns[0]}\n<|assistant|>" for p in prompts(2))
    with pytest.raises(Exception, match="cannot load the tokenizer"):
        with EmulatorProcess(mode="ar") as em:
            measure_cell(em.url, prompts(1), concurrency=1, cell_dir=cell(tmp_path, "x"), api="generate",
                         tokenizer=str(tmp_path / "missing"))


def test_progress_reports_measured_requests_and_tokens(tmp_path: Path):
    calls = []
    with EmulatorProcess(mode="ar", ttft_ms=1, itl_ms=1, output_len=8) as em:
        s = measure_cell(em.url, prompts(6), concurrency=2, cell_dir=cell(tmp_path),
                         on_progress=lambda *a: calls.append(a))
    assert [c[0] for c in calls] == list(range(1, 7)) and all(c[1] == 6 for c in calls)  # warm-ups not counted
    assert calls[-1][2] == s.total_output_tokens
    assert all(b[3] >= a[3] >= 0 for a, b in zip(calls, calls[1:]))


def test_raw_parser_is_indifferent_to_how_bytes_are_split():
    import asyncio
    import random

    from dflash_bench.client.protocol import Stream
    from dflash_bench.client.rawhttp import _Response

    events = [b'data: {"choices":[{"delta":{"role":"assistant","content":""}}],"usage":{"completion_tokens":0}}\n\n']
    events += [b'data: {"choices":[{"delta":{"content":" t%d"},"finish_reason":%s}],"usage":{"prompt_tokens":2,'
               b'"completion_tokens":%d}}\n\n' % (i, b'"stop"' if i == 5 else b"null", i) for i in range(1, 6)]
    events += [b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":5}}\n\n', b"data: [DONE]\n\n"]
    wire = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    wire += b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    loop = asyncio.new_event_loop()
    try:
        rng = random.Random(0)
        for sizes in ([len(wire)], [1] * len(wire), [rng.randint(1, 40) for _ in range(len(wire))]):
            st, r, pos = Stream("chat", False), _Response(None, loop.create_future()), 0
            r.st = st
            for i, n in enumerate(sizes):  # the connection stops feeding a response once it is done
                r.feed(float(i), wire[pos:pos + n])
                pos += n
                if r.done or pos >= len(wire):
                    break
            assert wire[pos:] in (b"", b"\r\n", b"\n")  # at most the terminator's last CRLF is left
            assert r.done and r.status == 200 and st.done and st.error is None
            assert st.tokens == [1, 2, 3, 4, 5] and st.output_text() == " t1 t2 t3 t4 t5" and st.finish == "stop"
    finally:
        loop.close()


@pytest.mark.parametrize("incremental", [False, True])
def test_generate_events_cumulative_or_incremental(incremental: bool):
    from dflash_bench.client.protocol import Stream

    ids = [11, 12, 13, 14, 15]
    cuts = [1, 3, 5]
    st, prev = Stream("generate", True), 0
    for i, c in enumerate(cuts):
        part = ids[prev:c] if incremental else ids[:c]
        text = "".join(f" w{x}" for x in part)
        tops = [[[-0.1, x, None], [-2.0, x + 1, None]] for x in part]
        meta = {"completion_tokens": c, "prompt_tokens": 4, "output_top_logprobs": tops,
                "finish_reason": {"type": "length", "length": 5} if c == 5 else None}
        if c == 5:
            meta.update(spec_verify_ct=2, spec_accept_token_num=3)
        st.feed(float(i), orjson.dumps({"text": text, "output_ids": part, "meta_info": meta}))
        prev = c
    st.feed(9.0, b"[DONE]")
    assert st.ids == ids and [t[0][0] for t in st.tops] == ids and len(st.tops) == 5
    assert st.output_text() == "".join(f" w{x}" for x in ids)
    assert st.tokens == cuts and st.finish == "length" and (st.spec_steps, st.spec_accepted) == (2, 3)


@pytest.mark.parametrize("api,event", [
    ("chat", b'{"choices":[{"delta":{"content":"a"}}],"usage":[1]}'),  # usage not an object
    ("chat", b'{"choices":[{"delta":{"content":"a"},"logprobs":{"content":[{"logprob":-1}]}}]}'),  # no token
    ("generate", b'{"text":"a","output_ids":[1],"meta_info":{"completion_tokens":1,"output_top_logprobs":[[[1]]]}}'),
])
def test_an_event_of_the_wrong_shape_fails_the_request_not_the_cell(api: str, event: bytes):
    from dflash_bench.client.protocol import Stream

    st = Stream(api, True)
    st.feed(0.0, event)  # must not raise: a raise escapes the transport and aborts the whole cell
    assert st.error is not None and st.error.startswith("malformed SSE event")


def test_raw_transport_for_https_is_a_user_error(tmp_path: Path):
    from dflash_bench.errors import UserError

    with pytest.raises(UserError, match="plain http"):
        measure_cell("https://127.0.0.1:9", prompts(1), concurrency=1, cell_dir=cell(tmp_path), transport="raw")
    assert not (tmp_path / "sw").exists()


# ---------------------------------------------------------------- issue 19's measurement gaps, issue 22's timeouts


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


def test_tokens_are_spread_by_characters_when_chunks_and_tokens_differ():
    from dflash_bench.client.protocol import Stream

    st = Stream("chat", False)
    for t, text in ((1.0, "ab"), (2.0, "abcdef"), (3.0, "ab")):  # 2 + 6 + 2 characters
        st.feed(t, orjson.dumps({"choices": [{"index": 0, "delta": {"content": text}}]}))
    st.feed(4.0, orjson.dumps({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 10}}))
    st.finish_tokens()
    assert st.tokens == [2, 8, 10] and st.tokens_from == "text" and st.times == [1.0, 2.0, 3.0]


def test_usage_per_chunk_is_kept_as_reported(tmp_path: Path):
    with EmulatorProcess(mode="dflash", ttft_ms=1, itl_ms=1, output_len=24) as em:
        s = measure_cell(em.url, prompts(2), concurrency=1, cell_dir=cell(tmp_path), warmup=False)
    assert s.not_measured == {} and all(r.chunk_tokens_from == "usage" for r in measured(tmp_path))


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

    base = dict(cell_id="c", engine="vllm", mode="dflash", suite="s", concurrency=1, num_ok=4)
    none = ServerMetrics(url="http://s/metrics")
    assert "never accepted" in dflash_warning(CellSummary(**base, acceptance_length=1.01, num_drafts=100,
                                                          num_accepted_tokens=1), none)
    assert dflash_warning(CellSummary(**base, acceptance_length=3.0), none) is None
    idle = ServerMetrics(url="http://s/metrics", delta={"vllm:spec_decode_num_drafts_total": 0.0})
    assert "did not move" in dflash_warning(CellSummary(**base), idle)


@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
def test_connect_time_is_kept_out_of_ttft(tmp_path: Path, transport: str):
    """--no-warmup: the first request of each connection waits for a TCP connect, recorded on its own."""
    from dflash_bench.metrics.definitions import ttft_ms

    with EmulatorProcess(mode="ar", ttft_ms=1, itl_ms=1, output_len=4) as em:
        s = measure_cell(em.url, prompts(9), concurrency=3, cell_dir=cell(tmp_path), warmup=False, transport=transport)
    recs = sorted(measured(tmp_path), key=lambda r: r.t_send)
    connected = [r for r in recs if r.connection == "new"]
    assert all(r.connection in ("new", "reused") for r in recs)  # every request says which
    # a new connection for some of the first 3 (GET /v1/models left one open to reuse), none after: kept alive
    assert 1 <= len(connected) <= 3 and all(r in recs[:3] for r in connected) and s.connect_wait_ms.n == len(connected)
    if transport == "raw":  # the handshake apart from the loop's wait (aiohttp and httpx do not show it apart)
        assert s.connect_ms.n == len(connected) and all(r.connect_ms is not None for r in connected)
    for r in recs:
        assert r.t_send <= r.t_write <= r.t_first_token
        assert ttft_ms(r) == pytest.approx((r.t_first_token - r.t_write) * 1000.0)


def test_models_request_obeys_the_timeout(tmp_path: Path):
    from benchmarks.fixtures.bad_servers import BadServer

    from dflash_bench.errors import UserError

    with BadServer("hang") as srv:
        with pytest.raises(UserError, match=r"did not answer GET /v1/models within 0.5 s"):
            measure_cell(srv.url, prompts(1), concurrency=1, cell_dir=cell(tmp_path), timeout=0.5)
    assert not (tmp_path / "sw").exists()


@pytest.mark.parametrize("api", ["chat", "generate"])
def test_ignore_eos_runs_every_request_to_max_tokens(tmp_path: Path, api: str):
    # the emulator's answers end on their own between 0.5x and 1.5x output_len: with ignore_eos none may
    with EmulatorProcess(mode="ar", ttft_ms=1, itl_ms=0, output_len=20, seed=5) as em:
        measure_cell(em.url, prompts(6), concurrency=2, cell_dir=cell(tmp_path, "free"), api=api, max_tokens=24,
                     warmup=False)
        s = measure_cell(em.url, prompts(6), concurrency=2, cell_dir=cell(tmp_path, "fixed"), api=api, max_tokens=24,
                         warmup=False, ignore_eos=True)
    assert s.settings.ignore_eos is True
    assert {r.output_tokens for r in measured(tmp_path, "fixed")} == {24}
    assert min(r.output_tokens for r in measured(tmp_path, "free")) < 24


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
