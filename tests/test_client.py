"""The load generator against a real emulator process (known truth): token ids, tau from SGLang /generate and
vLLM's per-request metrics, multi-turn, Poisson arrivals, every transport, timings (failures:
test_client_failures.py; the wire format alone: test_client_stream.py)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from dflash_bench.client import measure_cell
from dflash_bench.client.loadgen import arrival_offsets
from dflash_bench.emulator import EmulatorModel, EmulatorConfig, EmulatorProcess
from benchmarks.fixtures.emulator_truth import P, prompts
from client_helpers import cell, measured


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_token_ids_and_top2_logprobs_are_saved(tmp_path: Path, api: str):
    ps = prompts(4)
    with EmulatorProcess(mode="dflash", ttft_ms=2, itl_ms=1, output_len=20, seed=3) as em:
        measure_cell(em.url, ps, concurrency=2, cell_dir=cell(tmp_path), api=api, save_token_ids=True, max_tokens=64)
    plans = {p.id: EmulatorModel(EmulatorConfig(output_len=20, seed=3)).plan(p.turns[0], 64) for p in ps}
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
    plans = [EmulatorModel(cfg).plan(p.turns[0], 128) for p in ps]
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
    em_model = EmulatorModel(EmulatorConfig(output_len=12))
    by = {(r.prompt_id, r.turn): r for r in measured(tmp_path)}
    for p in conv:
        first = by[(p.id, 0)]
        assert first.output_text == "".join(f" w{t}" for t in em_model.plan(p.turns[0], 2048).ids)
        # the emulator sees the whole conversation: user turn, the model's reply, user turn
        second = em_model.plan("\n".join([p.turns[0], first.output_text, p.turns[1]]), 2048)
        assert by[(p.id, 1)].output_tokens == len(second.ids)
        assert by[(p.id, 1)].t_send >= first.t_end


def test_blank_history_sends_every_later_turn_the_same_whatever_the_server_answered(tmp_path: Path):
    """Random weights (`history="blank"`): a later turn carries the earlier answers as empty text, so two servers
    whose answers differ get the same later prompts; the cell records how its later turns were made."""
    conv = [P("mt/1", ["first turn", "second turn"])]
    em_model = EmulatorModel(EmulatorConfig(output_len=12))
    for n, history in enumerate(("answers", "blank")):
        with EmulatorProcess(mode="ar", ttft_ms=2, itl_ms=1, output_len=12) as em:
            s = measure_cell(em.url, conv, concurrency=1, cell_dir=cell(tmp_path, str(n)), warmup=False,
                             history=history)
        by = {r.turn: r for r in measured(tmp_path, str(n))}
        answer = by[0].output_text if history == "answers" else ""
        assert by[0].output_text  # the server did answer
        second = em_model.plan("\n".join(["first turn", answer, "second turn"]), 2048)
        assert by[1].output_tokens == len(second.ids) and s.settings.history == history


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


def test_usage_per_chunk_is_kept_as_reported(tmp_path: Path):
    with EmulatorProcess(mode="dflash", ttft_ms=1, itl_ms=1, output_len=24) as em:
        s = measure_cell(em.url, prompts(2), concurrency=1, cell_dir=cell(tmp_path), warmup=False)
    assert s.not_measured == {} and all(r.chunk_tokens_from == "usage" for r in measured(tmp_path))


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
