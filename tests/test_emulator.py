"""The emulator speaks vLLM's and SGLang's protocols, read here with a plain httpx client (not ours)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from dflash_bench.client import measure_cell
from dflash_bench.emulator import EmulatorModel, EmulatorConfig, EmulatorProcess
from dflash_bench.metrics import prometheus
from benchmarks.fixtures.emulator_truth import prompts


def sse(client: httpx.Client, path: str, body: dict) -> list:
    events = []
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
    return events


CHAT = {"model": "emulator", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 500, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


def test_ar_chat_stream_is_vllm_shaped():
    with EmulatorProcess(mode="ar", ttft_ms=1, itl_ms=1, output_len=10) as em, httpx.Client(base_url=em.url) as c:
        assert c.get("/health").status_code == 200
        assert c.get("/v1/models").json()["data"][0]["id"] == "emulator"
        ev = sse(c, "/v1/chat/completions", CHAT)
        assert ev[-1] == "[DONE]"
        role, *content, usage, _ = ev
        assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert role["usage"]["completion_tokens"] == 0
        counts = [e["usage"]["completion_tokens"] for e in content]
        assert counts == list(range(1, len(content) + 1))  # AR: one token per chunk, cumulative usage
        assert content[-1]["choices"][0]["finish_reason"] == "stop"
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(content)
        text = "".join(e["choices"][0]["delta"]["content"] for e in content)
        full = c.post("/v1/chat/completions", json={**CHAT, "stream": False}).json()
        assert full["choices"][0]["message"]["content"] == text  # deterministic per prompt
        assert c.post("/v1/nothing", json={}).status_code == 404
        assert c.post("/v1/chat/completions", content=b"{nope").status_code == 400
        # no speculative counters on an AR server
        snap = prometheus.parse(c.get("/metrics").text)
        assert snap["counters"]["vllm:generation_tokens_total"] == 2 * len(content)
        assert not any("spec_decode" in k for k in snap["counters"])


def test_max_tokens_cuts_with_finish_reason_length():
    with EmulatorProcess(mode="dflash", ttft_ms=1, itl_ms=1, output_len=100) as em, httpx.Client(base_url=em.url) as c:
        ev = sse(c, "/v1/chat/completions", {**CHAT, "max_tokens": 7})
        assert ev[-2]["usage"]["completion_tokens"] == 7
        assert ev[-3]["choices"][0]["finish_reason"] == "length"


def test_dflash_counters_and_generate_meta_info_agree():
    with EmulatorProcess(mode="dflash", ttft_ms=1, itl_ms=1, output_len=60, block_size=8, acceptance_length=3.0) as em, \
            httpx.Client(base_url=em.url) as c:
        ev = sse(c, "/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 200}, "stream": True})
        snap = prometheus.parse(c.get("/metrics").text)["counters"]
    final = ev[-2]
    meta = final["meta_info"]
    n, steps = meta["completion_tokens"], meta["spec_verify_ct"]
    assert final["output_ids"] and len(final["output_ids"]) == n  # cumulative ids
    assert meta["spec_accept_length"] == pytest.approx(n / steps)
    assert snap["vllm:spec_decode_num_drafts_total"] == steps
    assert snap["vllm:spec_decode_num_draft_tokens_total"] == steps * 7
    pos = [snap[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}'] for i in range(7)]
    assert sum(pos) == snap["vllm:spec_decode_num_accepted_tokens_total"]
    assert pos == sorted(pos, reverse=True)  # a prefix is accepted: later positions never more often
    tokens_per_event = [e["meta_info"]["completion_tokens"] for e in ev[:-1]]
    gains = [b - a for a, b in zip(tokens_per_event, tokens_per_event[1:])]
    assert max(gains) <= 8 and max(gains) > 1


def test_ar_and_dflash_emit_the_same_tokens():
    a = EmulatorModel(EmulatorConfig(mode="ar", seed=5)).plan("same prompt", 300)
    d = EmulatorModel(EmulatorConfig(mode="dflash", seed=5)).plan("same prompt", 300)
    other = EmulatorModel(EmulatorConfig(mode="ar", seed=6)).plan("same prompt", 300)
    assert a.ids == d.ids and a.finish == d.finish and a.ids != other.ids
    assert sum(d.steps) >= len(d.ids) - 1 and len(d.steps) < len(a.steps)


def test_acceptance_draws_have_the_configured_mean():
    em = EmulatorModel(EmulatorConfig(mode="dflash", acceptance_length=6.5, block_size=16, output_len=400))
    ks = [k for i in range(60) for k in em.plan(f"p{i}", 2000).steps]
    assert 1 <= min(ks) and max(ks) <= 16
    assert sum(ks) / len(ks) == pytest.approx(6.5, abs=0.2)


@pytest.mark.fidelity
def test_step_time_grows_with_batch(tmp_path: Path):
    """Wall-clock: run alone (`pytest -m fidelity`), not on a busy machine; CI leaves it out."""
    with EmulatorProcess(mode="ar", ttft_ms=2, itl_ms=4, batch_slope_ms=1.0, output_len=40) as em:
        s1 = measure_cell(em.url, prompts(2), concurrency=1, cell_dir=tmp_path / "s" / "cells" / "c1", warmup=False)
        s8 = measure_cell(em.url, prompts(8), concurrency=8, cell_dir=tmp_path / "s" / "cells" / "c8", warmup=False)
    assert s1.chunk_gap_ms.mean == pytest.approx(4.0, rel=0.2)
    assert s8.chunk_gap_ms.p50 == pytest.approx(4.0 + 7 * 1.0, rel=0.2)


def test_a_batch_gets_the_planned_tokens_and_steps(tmp_path: Path):
    """What concurrency must not change, whatever the machine's load: each request's tokens and steps."""
    cfg = EmulatorConfig(mode="dflash", ttft_ms=1, itl_ms=1, batch_slope_ms=1.0, output_len=40, seed=4)
    ps = prompts(8)
    with EmulatorProcess(mode="dflash", ttft_ms=1, itl_ms=1, batch_slope_ms=1.0, output_len=40, seed=4) as em:
        s = measure_cell(em.url, ps, concurrency=8, cell_dir=tmp_path / "s" / "cells" / "c8", warmup=False)
        log = httpx.get(em.url + "/emulator/requests").json()
    plans = {p.turns[0]: EmulatorModel(cfg).plan(p.turns[0], 2048) for p in ps}
    assert s.num_ok == 8 and s.total_output_tokens == sum(len(pl.ids) for pl in plans.values())
    assert sorted((e["prompt"], e["tokens"], e["steps"]) for e in log) == \
        sorted((t, len(pl.ids), len(pl.steps)) for t, pl in plans.items())


def test_crash_after_requests_exits_3():
    em = EmulatorProcess(mode="ar", ttft_ms=1, itl_ms=1, output_len=4, crash_after_requests=2)
    try:
        with httpx.Client(base_url=em.url) as c:
            assert c.post("/v1/completions", json={"prompt": "a", "max_tokens": 4}).status_code == 200
            with pytest.raises(httpx.HTTPError):
                c.post("/v1/completions", json={"prompt": "b", "max_tokens": 4})
        em.proc.wait(5)
    finally:
        assert em.close() == 3


def test_bad_options_are_one_sentence():
    res = subprocess.run([sys.executable, "-m", "dflash_bench", "emulate", "--mode", "turbo", "--port", "0"],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and res.stderr.startswith("error: mode must be") and "Traceback" not in res.stderr
    res = subprocess.run([sys.executable, "-m", "dflash_bench", "emulate", "--mode", "dflash", "--acceptance-length",
                          "20", "--port", "0"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "acceptance_length" in res.stderr
