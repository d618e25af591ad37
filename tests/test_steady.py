"""The steady-stream mode (--steady-requests): constant concurrency, each finished request replaced at once, the
measured window between the ramp-up and the tail (metrics/definitions.py), against real servers: the emulator
(known truth: its AR steps carry one token each) and the builtin engine serving the embedded pair."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_bench.client import measure_cell
from dflash_bench.emulator import EmulatorProcess
from dflash_bench.metrics.definitions import steady_window, tokens_between
from dflash_bench.store import RequestRecord, SteadyPlan, SweepDir
from test_run import prompts


def records(tmp_path: Path, name: str = "c") -> list[RequestRecord]:
    return [r for r in SweepDir(tmp_path / "sw").read_requests(name) if not r.warmup]


def test_a_request_straddling_an_edge_counts_only_its_tokens_inside_the_window():
    r = RequestRecord(request_id="r1", prompt_id="p", t_send=0.5, t_first_token=1.0, t_end=3.5,
                      chunk_times=[1.0, 2.0, 3.0], chunk_tokens=[1, 3, 4], output_tokens=5)
    assert tokens_between(r, 0.0, 10.0) == 5  # the usage total, its last token at the stream's end
    assert tokens_between(r, 1.5, 3.0) == 3  # the chunks at 2.0 (2 tokens) and 3.0 (1 token)
    assert tokens_between(r, 1.0, 2.0) == 2  # (a, b]: the chunk at the opening edge is before the window
    assert tokens_between(r, 3.0, 4.0) == 1  # the token only the final usage counted
    bare = RequestRecord(request_id="r2", prompt_id="p", t_send=0.0, t_end=2.0, output_tokens=7)
    assert (tokens_between(bare, 0.0, 2.0), tokens_between(bare, 2.0, 9.0)) == (7, 0)  # no chunk counts: at its end


@pytest.mark.parametrize("ramp", [None, 0, 5])
def test_steady_stream_keeps_the_concurrency_and_measures_only_its_window(tmp_path: Path, ramp: int | None):
    c, n = 3, 10
    with EmulatorProcess(mode="ar", ttft_ms=3, itl_ms=2, output_len=24, seed=2) as em:
        s = measure_cell(em.url, prompts(4), concurrency=c, cell_dir=tmp_path / "sw" / "cells" / "c", max_tokens=64,
                         steady_requests=n, steady_ramp=ramp)
    want_ramp = c if ramp is None else ramp
    recs = records(tmp_path)
    # the prompts are cycled under new ids; the window's last completion stops the stream, whose c - 1 requests
    # still in flight finish and are recorded (the tail)
    assert len(recs) == want_ramp + n + c - 1
    assert len({r.prompt_id for r in recs}) == len(recs) and any(r.prompt_id.endswith("~2") for r in recs)
    assert s.settings.steady == SteadyPlan(ramp=want_ramp, requests=n)
    w = s.steady
    assert w is not None and (w.ramp, w.requests) == (want_ramp, n)
    ends = sorted(r.t_end for r in recs)
    assert w.t_close == ends[want_ramp + n - 1]
    assert w.t_open == (ends[want_ramp - 1] if want_ramp else min(r.t_send for r in recs))
    assert (w.t_open, w.t_close) == steady_window(recs, want_ramp, n)
    inside = [r for r in recs if w.t_open < r.t_end <= w.t_close]
    assert len(inside) + w.ramp_requests + w.cooldown_requests == len(recs)
    assert s.num_requests == len(inside) and s.num_ok == len(inside)
    assert w.cooldown_requests == c - 1 and all(r.t_send <= w.t_close for r in recs)  # nothing sent after it closed
    # constant concurrency: every request after the first c was sent once an earlier one had ended
    sends = sorted(r.t_send for r in recs)
    for k, t in enumerate(sends[c:], start=1):
        assert sum(e <= t for e in ends) >= k
    # known truth: the AR emulator's chunks carry one token each, so the window's tokens are its chunks' count
    assert all(r.chunk_tokens == list(range(1, r.output_tokens + 1)) for r in recs)
    streamed = sum(w.t_open < t <= w.t_close for r in recs for t in r.chunk_times)
    assert s.total_output_tokens == streamed
    assert s.duration_s == pytest.approx(w.t_close - w.t_open)
    assert s.output_throughput == pytest.approx(streamed / (w.t_close - w.t_open))
    assert s.request_throughput == pytest.approx(len(inside) / (w.t_close - w.t_open))
    assert w.stream_output_tokens == sum(r.output_tokens for r in recs) > streamed
    # latencies are the window's requests' alone: the ramp-up and the tail are in no statistic
    assert s.e2e_ms.n == s.ttft_ms.n == len(inside)
    assert s.e2e_ms.max == pytest.approx(max((r.t_end - r.t_send) * 1000 for r in inside), abs=1e-3)
    assert w.straddling_open == sum(r.t_send < w.t_open < r.t_end <= w.t_close for r in recs)
    assert w.straddling_close == c - 1  # the tail was in flight when the window closed


def test_a_closed_batch_is_unchanged_without_the_option(tmp_path: Path):
    with EmulatorProcess(mode="ar", ttft_ms=2, itl_ms=1, output_len=12) as em:
        s = measure_cell(em.url, prompts(5), concurrency=2, cell_dir=tmp_path / "sw" / "cells" / "c")
    recs = records(tmp_path)
    assert s.steady is None and s.settings.steady is None and len(recs) == 5
    assert s.total_output_tokens == sum(r.output_tokens for r in recs)
    assert s.duration_s == pytest.approx(max(r.t_end for r in recs) - min(r.t_send for r in recs))


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dflash_bench", "run", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("extra,words", [
    (["--steady-ramp", "2"], "--steady-ramp needs --steady-requests"),
    (["--steady-requests", "4", "--request-rate", "5"], "cannot be combined with --request-rate"),
    (["--steady-requests", "3", "--concurrency", "4"], "--steady-requests 3 is smaller than the concurrency 4"),
])
def test_bad_steady_options_are_one_sentence(tmp_path: Path, data_dir: Path, extra: list[str], words: str):
    out = run_cli("--url", "http://127.0.0.1:9", "--suite", "gsm8k", "--out", str(tmp_path), "--data-dir",
                  str(data_dir), *extra)
    assert out.returncode != 0 and words in out.stderr and "Traceback" not in out.stderr


def test_sweep_refuses_a_steady_ramp_alone_before_any_server(tmp_path: Path):
    out = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", "tiny", "--engine", "emulator",
                          "--steady-ramp", "1", "--out", str(tmp_path), "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "--steady-ramp needs --steady-requests" in out.stderr


def test_sweep_refuses_a_window_shorter_than_its_largest_concurrency_before_any_folder(tmp_path: Path):
    out = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", "tiny", "--engine", "emulator",
                          "--concurrency", "2,8", "--steady-requests", "5", "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "--steady-requests 5 is smaller than the concurrency 8" in out.stderr
    assert not (tmp_path / "r").exists()  # refused before any folder (or server)


@pytest.mark.engine
def test_builtin_engine_serves_a_steady_stream_measured_over_its_window(tmp_path: Path, data_dir: Path):
    pytest.importorskip("transformers")
    from dflash_bench.testing.tiny import PREDICTED_TOKEN, make_tiny_pair
    from test_engine_server import B, cli_server

    target, drafter = make_tiny_pair(tmp_path / "pair", predictable=True, block_size=B)
    with cli_server("--model", str(target), "--draft", str(drafter), "--served-model-name", "tiny") as url:
        out = run_cli("--url", url, "--suite", "gsm8k", "--concurrency", "2", "--num-prompts", "3", "--max-tokens",
                      "12", "--engine", "builtin", "--label", "dflash", "--save-token-ids", "--out", str(tmp_path),
                      "--name", "s", "--data-dir", str(data_dir), "--steady-requests", "5", "--steady-ramp", "2")
    assert out.returncode == 0, out.stderr
    cell = tmp_path / "s" / "cells" / "builtin-dflash-gsm8k-c2"
    summary = json.loads((cell / "summary.json").read_text())
    rows = [RequestRecord(**json.loads(line)) for line in (cell / "requests.jsonl").read_text().splitlines()]
    recs = [r for r in rows if not r.warmup]
    assert len(recs) == 2 + 5 + 1  # ramp, window, and the one request in flight when the window closed
    assert all(r.token_ids == [PREDICTED_TOKEN] * 12 for r in recs)  # every request of the stream decoded right
    steady = summary["steady"]
    assert summary["settings"]["steady"] == {"ramp": 2, "requests": 5}
    t_open, t_close = steady["t_open"], steady["t_close"]
    assert (t_open, t_close) == steady_window(recs, 2, 5)
    assert summary["total_output_tokens"] == sum(tokens_between(r, t_open, t_close) for r in recs)
    assert summary["output_throughput"] == pytest.approx(summary["total_output_tokens"] / (t_close - t_open))
    assert steady["stream_output_tokens"] == 12 * len(recs)
    assert summary["num_requests"] == sum(t_open < r.t_end <= t_close for r in recs)
    # the server's counters cover the whole stream: every request is the same, so tau is a single request's
    assert summary["acceptance_length"] == pytest.approx(11 / -(-11 // B))


def test_sweep_measures_every_cell_as_a_steady_stream(tmp_path: Path, data_dir: Path):
    from dflash_bench.launch import free_port

    out = tmp_path / "reports"
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", "org/emulated", "--drafter",
                           "org/emulated-dflash", "--engine", "emulator", "--suites", "gsm8k", "--concurrency", "2",
                           "-n", "3", "--max-tokens", "24", "--port", str(free_port()), "--out", str(out),
                           "--engine-arg=--ttft-ms=3", "--engine-arg=--itl-ms=1", "--steady-requests", "6",
                           "--data-dir", str(data_dir)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (folder,) = [p for p in out.iterdir() if (p / "manifest.json").exists()]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["settings"]["steady_requests"] == 6 and manifest["settings"]["steady_ramp"] is None
    sweep = SweepDir.open(folder)
    for cid in ("emulator-ar-gsm8k-c2", "emulator-dflash-gsm8k-c2"):
        s = sweep.read_summary(cid)
        recs = [r for r in sweep.read_requests(cid) if not r.warmup]
        assert s.settings.steady == SteadyPlan(ramp=2, requests=6)  # the ramp: the concurrency
        assert len(recs) == 2 + 6 + 1 and s.steady is not None
        assert s.total_output_tokens == sum(tokens_between(r, s.steady.t_open, s.steady.t_close) for r in recs)
