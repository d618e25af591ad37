"""`run` / measure_cell against the timing emulator: the harness must report the emulator's known truth.

What does not depend on the machine's load is asserted here: token counts equal to the emulator's own
log and plans, the client's stamps bracketing the server's (sent before it arrived, first token read after
it was written), tau exactly the realised tokens per verify step. How close the timings come (first-token
lag, TPOT, throughput, the measured window) depends on how busy the machine is: benchmarks/harness/fidelity.py
measures that, with the tolerances this file used to assert.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from benchmarks.fixtures.emulator_truth import prompts, truth
from dflash_bench.client import measure_cell
from dflash_bench.emulator import EmulatorModel, EmulatorConfig, EmulatorProcess
from dflash_bench.store import SweepDir



@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ar", "dflash"])
@pytest.mark.parametrize("concurrency", [1, 8, 32])
def test_run_matches_emulator_truth(tmp_path: Path, mode: str, concurrency: int):
    cfg = EmulatorConfig(mode=mode, ttft_ms=40, itl_ms=8, output_len=24 if mode == "ar" else 64,
                         acceptance_length=6.5, seed=7)
    n = {1: 6, 8: 24, 32: 64}[concurrency]
    ps = prompts(n)
    with EmulatorProcess(mode=mode, ttft_ms=cfg.ttft_ms, itl_ms=cfg.itl_ms, output_len=cfg.output_len,
                         acceptance_length=cfg.acceptance_length, seed=cfg.seed) as em:
        s = measure_cell(em.url, ps, concurrency=concurrency, cell_dir=tmp_path / "sw" / "cells" / "c",
                         engine="vllm", mode=mode, max_tokens=256)
        log = httpx.get(em.url + "/emulator/requests").json()
    assert s.status == "complete" and s.num_ok == n and s.num_failed == 0 and s.num_warmup == concurrency

    # 1. what the server really did
    by_text = {p.turns[0]: p.id for p in ps}
    server = {by_text[e["prompt"]]: e for e in log if e["prompt"] in by_text}
    recs = [r for r in SweepDir(tmp_path / "sw").read_requests("c") if not r.warmup]
    origin = s.clock_origin_monotonic_s
    for r in recs:
        e = server[r.prompt_id]
        assert r.output_tokens == e["tokens"]
        # the client's stamps bracket the server's: sent before it arrived, first token read after written
        assert origin + r.t_send <= e["t_arrival"] and origin + r.t_first_token >= e["t_first"]
        assert origin + r.t_end >= e["t_last"]
    span = max(e["t_last"] for e in server.values()) - min(e["t_arrival"] for e in server.values())
    assert s.duration_s >= span  # the measured window holds the server's busy span (by how much: benchmarks)

    # 2. the emulator's nominal model
    want = truth(cfg, ps, concurrency, 256)
    assert s.total_output_tokens == want["tokens"]
    assert s.ttft_ms.min >= cfg.ttft_ms  # the emulator sleeps that long before its first token
    if mode == "ar":
        assert s.acceptance_length is None and s.acceptance_source is None  # absent, not 1
        assert s.tokens_per_chunk.mean == 1.0
    else:
        assert s.acceptance_source == "vllm-metrics"
        assert s.acceptance_length == pytest.approx(want["tau"], abs=1e-9)
        assert abs(s.acceptance_length - cfg.acceptance_length) < 0.5
        assert len(s.acceptance_per_position) == cfg.block_size - 1
        # a chunk is one verify step: its tokens are the step's, as the emulator planned them
        steps = [k for p in ps for k in EmulatorModel(cfg).plan(p.turns[0], 256).steps]
        assert s.tokens_per_chunk.n == len(steps)  # one chunk per step, after each request's first token
        assert s.tokens_per_chunk.mean == pytest.approx((want["tokens"] - len(ps)) / len(steps))


def test_run_cli_writes_a_sweep_cell(tmp_path: Path, data_dir: Path):
    with EmulatorProcess(mode="dflash", ttft_ms=5, itl_ms=2, output_len=16) as em:
        cmd = [sys.executable, "-m", "dflash_bench", "run", "--url", em.url, "--suite", "gsm8k", "-c", "4", "-n", "8",
               "--label", "dflash", "--out", str(tmp_path), "--name", "s1", "--data-dir", str(data_dir)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    cell = tmp_path / "s1" / "cells" / "vllm-dflash-gsm8k-c4"
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["num_ok"] == 8 and summary["acceptance_length"] > 1
    lines = (cell / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 12  # 4 warm-up + 8 measured, all kept
    assert sum(json.loads(x).get("warmup", False) for x in lines) == 4
    assert "vllm:spec_decode_num_drafts_total" in json.loads((cell / "server_metrics.json").read_text())["delta"]
    manifest = json.loads((tmp_path / "s1" / "manifest.json").read_text())
    assert manifest["plan"][0]["status"] == "complete"
    assert (tmp_path / "s1" / "results.csv").read_text().count("\n") == 2
    assert "acceptance length tau" in res.stdout


def test_run_unreachable_server_is_one_sentence(tmp_path: Path, data_dir: Path):
    cmd = [sys.executable, "-m", "dflash_bench", "run", "--url", "http://127.0.0.1:9", "--suite", "gsm8k", "-n", "2",
           "--out", str(tmp_path), "--data-dir", str(data_dir)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.startswith("error: cannot reach the server at http://127.0.0.1:9")
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,says", [(["--label", "fast"], "--label must be"), (["--engine", "trt"], "--engine must be"),
                                       (["--transport", "curl"], "unknown transport"), (["--api", "grpc"], "unknown api")])
def test_run_refuses_bad_options_in_one_sentence(tmp_path: Path, data_dir: Path, args: list[str], says: str):
    cmd = [sys.executable, "-m", "dflash_bench", "run", "--url", "http://127.0.0.1:9", "--suite", "gsm8k", "-n", "1",
           "--out", str(tmp_path), "--data-dir", str(data_dir), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and says in res.stderr and "Traceback" not in res.stderr


def test_run_failures_are_escaped_and_nothing_written_for_a_dead_url(tmp_path: Path, data_dir: Path):
    cmd = [sys.executable, "-m", "dflash_bench", "run", "--url", "http://127.0.0.1:9", "--suite", "gsm8k", "-n", "1",
           "--out", str(tmp_path / "out"), "--data-dir", str(data_dir)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and not (tmp_path / "out").exists()
    with EmulatorProcess(mode="ar", ttft_ms=1, itl_ms=1, output_len=4, fail_every=2, fail_kind="error") as em:
        cmd = [sys.executable, "-m", "dflash_bench", "run", "--url", em.url, "--suite", "gsm8k", "-n", "4",
               "--no-warmup", "--out", str(tmp_path / "out"), "--data-dir", str(data_dir)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    # a partial cell: run says how many failed and why, and exits non-zero (a failed request is a failed run)
    assert res.returncode == 1 and "2 request(s) failed: HTTP 500 (2)" in res.stdout
    assert "cell partial: 2 of 4 measured requests failed: HTTP 500 (2); throughput and latencies cover the 2" in \
        " ".join(res.stdout.split())


def test_summary_shows_brackets_in_names_literally(tmp_path: Path, capsys):
    from dflash_bench.client.run_command import print_summary
    from dflash_bench.store import CellSummary

    s = CellSummary(cell_id="vllm-ar-[/x]-c1", engine="vllm", mode="ar", suite="[/x]", concurrency=1)
    print_summary(s, tmp_path / "runs[/oops]" / "cells" / s.cell_id)  # rich markup would raise or eat these
    out = capsys.readouterr().out
    assert "vllm-ar-[/x]-c1" in out and "runs[/oops]" in out


# ---------------------------------------------------------------- faults


def run_argv(url: str, out: Path, data_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "dflash_bench", "run", "--url", url, "--suite", "gsm8k", "-n", "4", "--out",
            str(out), "--data-dir", str(data_dir), *extra]


def test_run_exits_non_zero_when_every_request_failed(tmp_path: Path, data_dir: Path):
    with EmulatorProcess(mode="ar", ttft_ms=1, itl_ms=1, output_len=4, fail_every=1, fail_kind="error") as em:
        res = subprocess.run(run_argv(em.url, tmp_path, data_dir, "--no-warmup", "--name", "s"),
                             capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stderr  # as sweep does for a failed cell
    summary = json.loads((tmp_path / "s" / "cells" / "vllm-ar-gsm8k-c1" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["num_requests"] == 4 and summary["num_failed"] == 4
    assert "cell failed: every measured request failed: HTTP 500 (4)" in res.stdout


def test_run_against_a_server_that_never_answers_obeys_timeout_and_leaves_nothing(tmp_path: Path, data_dir: Path):
    from benchmarks.fixtures.bad_servers import BadServer

    with BadServer("hang") as srv:
        res = subprocess.run(run_argv(srv.url, tmp_path / "out", data_dir, "--timeout", "1"),
                             capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "did not answer GET /v1/models within 1 s (--timeout)" in res.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_run_labelled_dflash_without_speculation_says_so_loudly(tmp_path: Path, data_dir: Path):
    from benchmarks.fixtures.bad_servers import BadServer

    with BadServer("plain") as srv:
        res = subprocess.run(run_argv(srv.url, tmp_path, data_dir, "--label", "dflash", "--name", "s"),
                             capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "WARNING: DFlash not in effect: no acceptance source: /metrics answered HTTP 404" in " ".join(res.stdout.split())
    summary = json.loads((tmp_path / "s" / "cells" / "vllm-dflash-gsm8k-c1" / "summary.json").read_text())
    assert summary["dflash_warning"].startswith("no acceptance source")
    assert summary["itl_ms"] is not None and "no per-chunk usage" in summary["not_measured"]["itl_ms"]


def test_run_says_up_front_when_sglang_tau_cannot_be_read_through_chat(tmp_path: Path, data_dir: Path):
    """SGLang carries acceptance only in /generate's meta_info: a DFlash cell measured through chat gets no tau,
    and `run` says so before it measures (the cell is still measured); through /generate, or AR, no note."""
    with EmulatorProcess(mode="dflash", ttft_ms=1, itl_ms=1, output_len=4) as em:
        def run(*extra: str) -> subprocess.CompletedProcess:
            cmd = [sys.executable, "-m", "dflash_bench", "run", "--url", em.url, "--suite", "gsm8k", "-n", "2",
                   "--engine", "sglang", "--out", str(tmp_path), "--data-dir", str(data_dir), *extra]
            return subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        chat = run("--label", "dflash", "--name", "chat")
        ar = run("--label", "ar", "--name", "ar")
    assert chat.returncode == 0, chat.stderr
    assert "sglang reports acceptance only through its native API: with --api chat" in " ".join(chat.stderr.split())
    assert "--api generate --tokenizer MODEL" in " ".join(chat.stderr.split())
    assert ar.returncode == 0 and "native API" not in ar.stderr
    from dflash_bench.client.run_command import acceptance_note

    assert acceptance_note("sglang", "dflash", "generate") is None and acceptance_note("vllm", "dflash", "chat") is None
