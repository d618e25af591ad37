"""Metric definitions, Prometheus parsing and acceptance length on hand-built inputs with known answers."""

from __future__ import annotations

import pytest

from dflash_bench.metrics import prometheus
from dflash_bench.metrics.acceptance import cell_acceptance, per_request
from dflash_bench.metrics.definitions import summarize
from dflash_bench.metrics.stats import describe, describe_weighted, percentile
from dflash_bench.store import RequestRecord

# servers.md section 3.1 fixture (abridged further): DFlash b16, 8 requests; tau = 1 + 5870/1000 = 6.87
FIXTURE = """\
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="qwen3-8b"} 6874.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="qwen3-8b"} 1000.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="qwen3-8b"} 1.7583e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="qwen3-8b"} 15000.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="qwen3-8b"} 5870.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen3-8b",position="0"} 900.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen3-8b",position="1"} 820.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen3-8b"} 3.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="qwen3-8b"} 8.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="qwen3-8b"} 8.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="qwen3-8b"} 8.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="qwen3-8b"} 4.0
"""


def test_fixture_tau_from_zero():
    snap = prometheus.parse(FIXTURE)
    assert "vllm:spec_decode_num_drafts_created" not in snap["counters"]
    assert snap["gauges"]["vllm:num_requests_running"] == 3.0
    assert snap["counters"]["vllm:e2e_request_latency_seconds_sum"] == 4.0
    assert not any("_bucket" in k for k in snap["counters"])
    acc = prometheus.vllm_acceptance(prometheus.delta({}, snap))
    assert acc["acceptance_length"] == pytest.approx(6.87)
    assert acc["acceptance_rate"] == pytest.approx(5870 / 15000)
    assert acc["verify_width"] == pytest.approx(1 + 15000 / 1000)  # tokens verified per row and step
    assert acc["acceptance_per_position"] == pytest.approx([0.9, 0.82])


def test_delta_sums_label_sets_and_subtracts_before():
    two_engines = FIXTURE.replace('engine="0"', 'engine="1"').split("\n")
    # a data-parallel server: the same counters twice under engine="0" and engine="1"
    text = FIXTURE + "\n".join(line for line in two_engines if line and not line.startswith("#")) + "\n"
    before = prometheus.parse(FIXTURE)
    after = prometheus.parse(text.replace(" 5870.0", " 6870.0"))
    d = prometheus.delta(before, after)
    # after: both engines' accepted counters read 6870 (drafts 1000 each); before: engine 0 alone
    assert d["vllm:spec_decode_num_drafts_total"] == 1000.0
    assert d["vllm:spec_decode_num_accepted_tokens_total"] == 6870 + 6870 - 5870
    acc = prometheus.vllm_acceptance(d)
    assert acc["acceptance_length"] == pytest.approx(1 + (6870 + 6870 - 5870) / 1000)


def test_no_spec_counters_means_tau_absent():
    ar = "\n".join(l for l in FIXTURE.splitlines() if "spec_decode" not in l) + "\n"
    d = prometheus.delta(prometheus.parse(ar), prometheus.parse(ar))
    assert prometheus.vllm_acceptance(d) is None
    # counters present but no verify step in the window: still absent, not 1
    snap = prometheus.parse(FIXTURE)
    assert prometheus.vllm_acceptance(prometheus.delta(snap, snap)) is None
    assert cell_acceptance("vllm", d, []) == {}


def test_parse_rejects_non_prometheus_text():
    with pytest.raises(ValueError):
        prometheus.parse("<html><body>404 page not found {oops</body></html>\n")


def rec(**kw) -> RequestRecord:
    base = dict(request_id="r", prompt_id="p", t_send=0.0)
    base.update(kw)
    return RequestRecord(**base)


def test_a_nan_gauge_is_no_value_and_a_folder_written_with_it_reads_back():
    """SGLang exposes fwd_occupancy as NaN while idle; JSON writes NaN as null, which once made every cell's
    server_metrics.json fail its schema on `sweep --resume` (each complete cell measured again)."""
    from dflash_bench.store.cells import ServerMetrics

    text = "# TYPE sglang:fwd_occupancy gauge\nsglang:fwd_occupancy NaN\n# TYPE sglang:num_running_reqs gauge\n" \
           "sglang:num_running_reqs 3.0\n"
    snap = prometheus.parse(text)
    assert snap["gauges"] == {"sglang:num_running_reqs": 3.0}
    written = {"url": "http://x/metrics", "before": {"counters": {}, "gauges": {"sglang:fwd_occupancy": None,
                                                                               "sglang:num_running_reqs": 3.0}}}
    back = ServerMetrics.model_validate(written)
    assert back.before == {"counters": {}, "gauges": {"sglang:num_running_reqs": 3.0}}
    with pytest.raises(ValueError):
        ServerMetrics.model_validate({"url": "u", "before": {"gauges": {"x": "many"}}})


def test_summarize_definitions():
    # request A: sent 0, first token at 0.1 (1 token), then chunks at 0.13 (+3 tokens) and 0.14 (+1), end 0.14
    a = rec(t_send=0.0, t_first_token=0.1, t_end=0.14, chunk_times=[0.1, 0.13, 0.14], chunk_tokens=[1, 4, 5],
            output_tokens=5, prompt_tokens=10)
    # request B: sent 0.05, 2 tokens, end 0.35
    b = rec(t_send=0.05, t_first_token=0.25, t_end=0.35, chunk_times=[0.25, 0.35], chunk_tokens=[1, 2],
            output_tokens=2, prompt_tokens=7)
    warm = rec(t_send=-5.0, t_first_token=-4.0, t_end=-3.0, warmup=True, output_tokens=100)
    failed = rec(t_send=0.2, t_end=0.5, error="HTTP 500: boom", output_tokens=None)
    s = summarize([warm, a, b, failed])
    assert (s["num_requests"], s["num_ok"], s["num_failed"], s["num_warmup"]) == (3, 2, 1, 1)
    assert s["duration_s"] == pytest.approx(0.5)  # first measured dispatch 0.0 -> last end 0.5 (the failure)
    assert s["total_output_tokens"] == 7 and s["total_prompt_tokens"] == 17
    assert s["output_throughput"] == pytest.approx(7 / 0.5)
    assert s["ttft_ms"].mean == pytest.approx((100 + 200) / 2)
    assert s["tpot_ms"].mean == pytest.approx((40 / 4 + 100 / 1) / 2)
    # per-token latency: A's 30 ms gap over 3 tokens = 3 x 10 ms, A's 10 ms over 1, B's 100 ms over 1
    assert s["itl_ms"].n == 5
    assert s["itl_ms"].mean == pytest.approx((10 * 3 + 10 + 100) / 5)
    assert s["itl_ms"].p50 == pytest.approx(10)
    assert s["chunk_gap_ms"].n == 3 and s["chunk_gap_ms"].mean == pytest.approx((30 + 10 + 100) / 3)
    assert s["tokens_per_chunk"].mean == pytest.approx((3 + 1 + 1) / 3)
    assert s["tok_s_user"].mean == pytest.approx((1000 / 10 + 1000 / 100) / 2)


def test_later_turns_ttft_covers_only_the_second_and_later_turns_that_succeeded():
    """A two-turn conversation's second prompt holds the first: its first token is timed apart (what a prefix
    cache saves shows there), over the succeeded, measured second and later turns only."""
    first = [rec(t_send=0.0, t_first_token=0.05 * k, t_end=1.0, output_tokens=4) for k in (1, 2)]
    later = [rec(t_send=0.0, t_first_token=t, t_end=1.0, output_tokens=4, turn=turn)
             for t, turn in ((0.3, 1), (0.5, 1), (0.9, 2))]
    left_out = [rec(t_send=0.0, t_first_token=0.01, t_end=1.0, output_tokens=4, turn=1, warmup=True),
                rec(t_send=0.0, t_end=1.0, turn=1, error="HTTP 500: boom", output_tokens=None)]
    s = summarize([*first, *later, *left_out])
    assert s["ttft_ms"].n == 5 and s["ttft_ms_later_turns"].n == 3
    assert s["ttft_ms_later_turns"].p50 == pytest.approx(500) and s["ttft_ms_later_turns"].min == pytest.approx(300)
    assert summarize(first)["ttft_ms_later_turns"] is None


def test_one_token_outputs_have_no_tpot():
    s = summarize([rec(t_first_token=0.1, t_end=0.1, chunk_times=[0.1], chunk_tokens=[1], output_tokens=1)])
    assert s["tpot_ms"] is None and s["tok_s_user"] is None and s["ttft_ms"].n == 1


def test_sglang_tau_is_tokens_over_verify_steps():
    rs = [rec(output_tokens=100, spec_verify_ct=20), rec(output_tokens=30, spec_verify_ct=10),
          rec(output_tokens=50, spec_verify_ct=5, warmup=True), rec(output_tokens=9, spec_verify_ct=1, error="x")]
    out = cell_acceptance("sglang", None, rs)
    assert out["acceptance_source"] == "sglang-meta"
    assert out["acceptance_length"] == pytest.approx(130 / 30)  # token-weighted (pooled)
    assert out["acceptance_length_req_weighted"] == pytest.approx((5 + 3) / 2)


def test_vllm_per_request_tau_and_counters_preferred():
    rs = [rec(output_tokens=100, spec_verify_ct=20, spec_accepted_tokens=60),
          rec(output_tokens=30, spec_verify_ct=10, spec_accepted_tokens=10)]
    pr = per_request(rs, sglang=False)
    assert pr["token_weighted"] == pytest.approx(1 + 70 / 30)
    assert pr["request_weighted"] == pytest.approx((1 + 3 + 1 + 1) / 2)
    only_req = cell_acceptance("vllm", None, rs)
    assert only_req["acceptance_source"] == "vllm-per-request"
    both = cell_acceptance("builtin", prometheus.delta({}, prometheus.parse(FIXTURE)), rs)
    assert both["acceptance_source"] == "builtin-metrics"
    assert both["acceptance_length"] == pytest.approx(6.87)
    assert both["acceptance_length_req_weighted"] == pytest.approx(3.0)


def test_percentiles_match_numpy_and_weighting():
    import numpy as np

    vals = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    srt = sorted(vals)
    for q in (0, 10, 50, 90, 99, 100):
        assert percentile(srt, q) == pytest.approx(float(np.percentile(vals, q)))
    st = describe(vals)
    assert st.n == 8 and st.mean == pytest.approx(np.mean(vals)) and st.min == 1.0 and st.max == 9.0
    assert describe([]) is None
    w = describe_weighted([(10.0, 3), (100.0, 1)])
    assert w.n == 4 and w.mean == pytest.approx(32.5) and w.p50 == 10.0 and w.p90 == 100.0


def test_ttft_starts_at_the_write_and_connect_time_is_its_own_figure():
    from dflash_bench.metrics.definitions import ttft_ms

    r = RequestRecord(request_id="r1", prompt_id="p", t_send=0.0, t_write=0.05, connect_ms=50.0, t_first_token=0.15,
                      t_end=0.35, output_tokens=3, chunk_times=[0.15, 0.25, 0.35], chunk_tokens=[1, 2, 3])
    reused = RequestRecord(request_id="r2", prompt_id="q", t_send=0.0, t_first_token=0.1, t_end=0.3, output_tokens=3,
                           chunk_times=[0.1, 0.2, 0.3], chunk_tokens=[1, 2, 3])  # no t_write: older records
    assert ttft_ms(r) == pytest.approx(100.0) and ttft_ms(reused) == pytest.approx(100.0)
    s = summarize([r, reused])
    assert s["connect_ms"].n == 1 and s["connect_ms"].mean == 50.0
    assert s["e2e_ms"].mean == pytest.approx(325.0)  # E2E still counts from dispatch: the user waited for it


def test_not_measured_says_why_chunk_figures_are_missing_or_derived():
    from dflash_bench.metrics.definitions import not_measured

    def rec(i: int, times: list[float], tokens: list[int], source=None) -> RequestRecord:
        return RequestRecord(request_id=f"r{i}", prompt_id="p", t_send=0.0, t_first_token=times[0], t_end=times[-1],
                             output_tokens=tokens[-1] if tokens else 4, chunk_times=times, chunk_tokens=tokens,
                             chunk_tokens_from=source, connect_ms=0.2)  # a timed handshake: no connect_ms reason

    one_chunk = [rec(1, [0.1], [4], "usage")]
    assert "one content chunk" in not_measured(one_chunk)["itl_ms"]
    assert set(not_measured(one_chunk)) == {"itl_ms", "chunk_gap_ms", "tokens_per_chunk"}
    no_counts = [rec(2, [0.1, 0.2], [])]
    assert "no token counts per chunk" in not_measured(no_counts)["chunk_gap_ms"]
    derived = [rec(3, [0.1, 0.2], [1, 2], "text"), rec(4, [0.1, 0.2], [1, 2], "usage")]
    assert not_measured(derived)["itl_ms"].startswith("derived for 1 of 2 requests")
    assert not_measured([rec(5, [0.1, 0.2], [1, 2], "usage")]) == {}


def test_server_phases_read_vllms_request_histograms_over_the_window():
    """vLLM exports each request's queue, prefill and decode time as histograms (one per engine with data
    parallelism): the cell reads the mean ms per request finished in its window, from the sums and counts, buckets
    ignored; a server without them says nothing."""
    from dflash_bench.metrics.phases import server_phases

    def exposition(n: int, queue: float, prefill: float, decode: float) -> str:
        lines = []
        for engine in ("0", "1"):
            for phase, total in (("queue", queue), ("prefill", prefill), ("decode", decode)):
                name = f"vllm:request_{phase}_time_seconds"
                lines += [f"# HELP {name} x", f"# TYPE {name} histogram"] if engine == "0" else []
                lines += [f'{name}_bucket{{engine="{engine}",le="0.3"}} {n}', f'{name}_bucket{{engine="{engine}",le="+Inf"}} {n}',
                          f'{name}_count{{engine="{engine}"}} {n}', f'{name}_sum{{engine="{engine}"}} {total}']
        return "\n".join(lines) + "\n"

    before = prometheus.parse(exposition(10, 1.0, 2.0, 30.0))
    after = prometheus.parse(exposition(42, 1.64, 8.4, 94.0))  # 32 more a engine: 64 requests in the window
    got = server_phases(prometheus.delta(before, after))
    assert got == pytest.approx({"server_queue_ms": 20.0, "server_prefill_ms": 200.0, "server_decode_ms": 2000.0})
    assert server_phases(prometheus.delta(before, before)) == dict.fromkeys(got, None)
    assert server_phases(None) == dict.fromkeys(got, None)
