"""Whole sweeps through the process launcher against the emulator (known truth): what a sweep measures, prints
and refuses (crash, kill and resume: test_sweep_resume.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from dflash_bench.report import build_report
from sweep_helpers import assert_servers_gone, only_sweep, results, sweep_argv


def test_whole_sweep_against_the_emulator(tmp_path, data_dir):
    out = tmp_path / "reports"
    began = time.monotonic()
    proc = subprocess.run(sweep_argv(out, "--data-dir", str(data_dir)), capture_output=True, text=True, timeout=240)
    took = time.monotonic() - began
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = only_sweep(out)
    rows = results(folder)
    assert len(rows) == 8 and all(r["status"] == "complete" for r in rows.values())
    for cid, row in rows.items():
        if "-dflash-" in cid:
            assert float(row["acceptance_length"]) == pytest.approx(5.0, rel=0.15)
        else:
            assert row["acceptance_length"] == ""  # AR has no speculative counters: absent, not 1
    # DFlash emits ~tau tokens per step of the same length: output throughput is several times AR's
    speedup = float(rows["emulator-dflash-gsm8k-c1"]["output_throughput"]) / float(rows["emulator-ar-gsm8k-c1"]["output_throughput"])
    assert 2.0 < speedup < 6.0
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert {c["status"] for c in manifest["plan"]} == {"complete"}
    assert manifest["versions"]["dflash_bench"] and manifest["models"]["block_size"] == 16
    assert set(manifest["servers"]) == {"emulator-ar", "emulator-dflash"}
    for name, server in manifest["servers"].items():  # what each start cost, within the sweep's own time
        assert 0 < server["ready_s"] < took and f"{name} server ready after {server['ready_s']:.0f} s" in proc.stdout
    assert "AR vs DFlash" in proc.stdout and "gsm8k" in proc.stdout
    assert (folder / "logs" / "emulator-ar.log").exists()
    assert_servers_gone(folder)
    # MT-Bench's second turns are timed apart, in results.csv and in the report's latency section; GSM8K has none
    assert all(float(r["ttft_ms_later_turns_p50"]) > 0 for c, r in rows.items() if "mt-bench" in c)
    assert all(r["ttft_ms_later_turns_p50"] == "" for c, r in rows.items() if "gsm8k" in c)
    html = build_report([folder]).read_text()
    block = html.split("first tokens of multi-turn conversations", 1)[1].split("</details>", 1)[0]
    assert block.count("<td>mt-bench</td>") == 2 and "gsm8k" not in block  # c = 1 and 4, AR and DFlash side by side


def test_an_eagle3_server_runs_beside_dflash_and_the_end_sets_them_side_by_side(tmp_path, data_dir):
    """--modes ar,dflash,eagle3 on the emulator (its EAGLE-3 stand-in: a speculative server of the head's length):
    three servers, each mode's cells, and the table of DFlash against EAGLE-3 at the end."""
    out = tmp_path / "reports"
    proc = subprocess.run(sweep_argv(out, "--data-dir", str(data_dir), "--modes", "ar,dflash,eagle3", "--eagle3",
                                     "org/emulated-eagle3", suites="gsm8k", conc="1"),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = only_sweep(out)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [c["cell_id"] for c in manifest["plan"]] == [
        "emulator-ar-gsm8k-c1", "emulator-dflash-gsm8k-c1", "emulator-eagle3-gsm8k-c1"]
    assert set(manifest["servers"]) == {"emulator-ar", "emulator-dflash", "emulator-eagle3"}
    assert manifest["settings"]["modes"] == ["ar", "dflash", "eagle3"]
    rows = results(folder)
    assert all(r["status"] == "complete" for r in rows.values()) and rows["emulator-eagle3-gsm8k-c1"]["mode"] == "eagle3"
    assert float(rows["emulator-eagle3-gsm8k-c1"]["acceptance_length"]) > 1.5  # it speculated
    table = proc.stdout.split("DFlash vs EAGLE-3")[1]
    row = next(line for line in table.splitlines() if "gsm8k" in line).split("│")
    ratio = float(row[6].strip().rstrip("x"))
    dflash, eagle3 = (float(row[i].strip().replace(",", "")) for i in (4, 5))
    assert ratio == pytest.approx(dflash / eagle3, abs=0.006)
    assert_servers_gone(folder)


def test_a_paired_sweep_runs_both_servers_once_and_alternates_the_cells(tmp_path, data_dir):
    """--paired: the AR and DFlash servers are each launched once and up together (cells alternate AR, DFlash per
    suite and concurrency, each on its own server), every cell completes, and both servers are gone at the end."""
    out = tmp_path / "reports"
    proc = subprocess.run(sweep_argv(out, "--data-dir", str(data_dir), "--paired", suites="gsm8k"), capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = only_sweep(out)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [c["cell_id"] for c in manifest["plan"]] == ["emulator-ar-gsm8k-c1", "emulator-dflash-gsm8k-c1",
                                                        "emulator-ar-gsm8k-c4", "emulator-dflash-gsm8k-c4"]
    assert {c["status"] for c in manifest["plan"]} == {"complete"} and manifest["settings"]["paired"] is True
    servers = manifest["servers"]
    assert set(servers) == {"emulator-ar", "emulator-dflash"}  # one launch each: no "#2" for a relaunch
    assert servers["emulator-ar"]["url"] != servers["emulator-dflash"]["url"]
    # the machine's speed, probed at the start and after the one group of servers (what the gate compares runs by)
    probes = manifest["machine_speed"]["probes"]
    assert [p["at"] for p in probes] == ["start", "after group 1 of 1"]
    assert all(len(p["seconds"]) == 5 and min(p["seconds"]) > 0 for p in probes)
    rows = results(folder)
    assert float(rows["emulator-dflash-gsm8k-c1"]["acceptance_length"]) == pytest.approx(5.0, rel=0.15)
    assert rows["emulator-ar-gsm8k-c4"]["acceptance_length"] == ""  # each cell measured its own mode's server
    assert_servers_gone(folder)


def test_paired_with_slurm_is_one_sentence_and_writes_nothing(tmp_path):
    out = tmp_path / "reports"
    proc = subprocess.run(sweep_argv(out, "--paired", "--executor", "slurm"), capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--executor slurm runs one job per server: drop --paired" in " ".join(proc.stderr.split())
    assert not out.exists() or not any(out.iterdir())


def test_dry_run_prints_plan_and_commands(tmp_path):
    proc = subprocess.run(sweep_argv(tmp_path, "--dry-run", suites="gsm8k", conc="1"), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "emulator-ar-gsm8k-c1" in proc.stdout and "emulator-dflash-gsm8k-c1" in proc.stdout
    assert "dflash-bench emulate --model emulated --mode dflash --block-size 16" in proc.stdout
    assert not any(tmp_path.iterdir())  # nothing was written


def test_sweep_measures_servers_the_user_runs(tmp_path, data_dir):
    """--url-ar/--url-dflash: nothing is launched; the cells are measured against the given servers."""
    from dflash_bench.emulator import EmulatorProcess

    with EmulatorProcess(mode="ar", ttft_ms=5, itl_ms=2) as ar, \
            EmulatorProcess(mode="dflash", ttft_ms=5, itl_ms=2, acceptance_length=4, seed=3) as df:
        out = tmp_path / "reports"
        proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", "Qwen3-8B", "--engine", "vllm",
                               "--url-ar", ar.url, "--url-dflash", df.url, "--suites", "gsm8k", "-c", "2", "-n", "4",
                               "--max-tokens", "32", "--data-dir", str(data_dir), "--out", str(out)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
    folder = only_sweep(out)
    rows = results(folder)
    assert set(rows) == {"vllm-ar-gsm8k-c2", "vllm-dflash-gsm8k-c2"}
    assert float(rows["vllm-dflash-gsm8k-c2"]["acceptance_length"]) == pytest.approx(4.0, rel=0.2)
    manifest = json.loads((folder / "manifest.json").read_text())
    record = manifest["servers"]["vllm-dflash"]
    assert set(record) == {"runner", "url", "identity"} and (record["runner"], record["url"]) == ("external", df.url)
    assert record["identity"]["model"] == "emulator"  # what answered there, checked at every cell


def test_secret_engine_args_are_refused_before_anything_is_written(tmp_path, data_dir):
    out = tmp_path / "reports"
    proc = subprocess.run(sweep_argv(out, "--data-dir", str(data_dir), "--engine-arg=--api-key=sk-12345", suites="gsm8k",
                                     conc="1"), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "environment" in proc.stderr and "Traceback" not in proc.stderr
    assert "sk-12345" not in proc.stderr and not out.exists()


def test_a_dead_servers_reason_is_the_lines_that_explain_it():
    from dflash_bench.launch.common import ServerDied, explain

    log = "\n".join(["INFO starting", "Traceback (most recent call last):", '  File "srv.py", line 9, in load',
                     "    weights = torch.load(p)", "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB",
                     "INFO shutting down", "INFO bye"])
    assert explain(log) == 'File "srv.py", line 9, in load | RuntimeError: CUDA out of memory. Tried to allocate 2 GiB'
    assert explain("INFO a\nERROR port 8000 in use\nINFO bye") == "ERROR port 8000 in use"
    assert explain("emulator (ar) listening on http://127.0.0.1:1") == ""  # no cause: the exit code speaks
    err = ServerDied("the vllm server exited with code 1", log)
    assert err.reason.startswith("the vllm server exited with code 1: File") and "INFO bye" not in err.reason


def test_a_dead_servers_reason_names_the_cause_far_above_its_logs_tail(tmp_path):
    """A server whose engine ran out of memory can print a traceback for every request in flight after it (vLLM's
    EngineDeadError), burying the cause far above the tail: the reason names the first such line after the server
    was ready, before the tail's own lines; one from before it was ready (start-up) is not this death's."""
    from dflash_bench.launch.common import ServerDied, explain, first_cause

    log = tmp_path / "server.log"
    start_up = "WARNING out of memory while probing a cudagraph size: retrying smaller\nINFO ready\n"
    cause = "ERROR [core.py:1332] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.48 GiB."
    echoes = ["ERROR Traceback (most recent call last):", '  File "core_client.py", line 1061, in get_output_async',
              "ERROR vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace "
              "(above) for the root cause."] * 200
    log.write_text(start_up + "\n".join(["INFO serving", cause, "ERROR a second OutOfMemoryError, a consequence",
                                          *echoes]) + "\n")
    ready = len(start_up.encode())
    assert first_cause(log, ready) == cause
    assert first_cause(log, 0).startswith("WARNING out of memory while probing")  # the start-up line, had it died then
    assert first_cause(log, log.stat().st_size) == "" and first_cause(tmp_path / "none.log") == ""
    tail = "\n".join(log.read_text().splitlines()[-40:])
    assert "OutOfMemoryError" not in explain(tail)  # the tail alone names only the echo
    err = ServerDied("the vllm server exited with code 0", tail, first_cause(log, ready))
    assert err.reason.startswith(f"the vllm server exited with code 0: {cause} | ")
    assert "EngineDeadError" in err.reason
    assert ServerDied("x", "INFO a\nERROR port in use", "").reason == "x: ERROR port in use"  # no cause: as before


def test_a_dflash_server_that_never_accepts_is_flagged_in_the_table_and_summary(tmp_path, data_dir):
    """tau 1: the silent fallback to AR that users report is shown loudly, not as a quiet 1.00."""
    out = tmp_path / "reports"
    argv = sweep_argv(out, "--data-dir", str(data_dir), "--engine-arg=--acceptance-length=1", suites="gsm8k", conc="1")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = " ".join(proc.stdout.split())
    assert "DFlash not in effect emulator-dflash-gsm8k-c1: tau 1.00" in printed and "(no" in printed
    summary = json.loads((only_sweep(out) / "cells" / "emulator-dflash-gsm8k-c1" / "summary.json").read_text())
    assert summary["dflash_warning"].startswith("tau 1.00: the drafter's tokens were (almost) never accepted")
    ar = json.loads((only_sweep(out) / "cells" / "emulator-ar-gsm8k-c1" / "summary.json").read_text())
    assert ar["dflash_warning"] is None


def test_a_cell_that_cannot_be_written_stops_the_sweep_with_its_sentence_not_as_a_server_that_did_not_start(
        tmp_path, data_dir, monkeypatch):
    """An error of the caller's own (here the store refusing a cell's files) must reach the user as itself: the
    servers' context once swallowed it and failed the group's other cells as 'server did not start'."""
    from typer.testing import CliRunner

    from dflash_bench.cli import app
    from dflash_bench.store import StoreError
    from dflash_bench.sweep import write

    def refuse(ctx, cell, measured):
        raise StoreError(f"cannot write {ctx.sweep.path}: the disk holding it is full")

    monkeypatch.setattr(write, "write_measured", refuse)
    argv = sweep_argv(tmp_path, "--data-dir", str(data_dir), suites="gsm8k", conc="1,4")[3:]
    res = CliRunner().invoke(app, argv)
    assert isinstance(res.exception, StoreError), (res.exception, res.output)  # main() makes it one sentence, exit 2
    assert "the disk holding it is full" in str(res.exception)
    folder = only_sweep(tmp_path)
    summaries = [json.loads(p.read_text()) for p in (folder / "cells").glob("*/summary.json")]
    assert not any("did not start" in (s.get("error") or "") for s in summaries), summaries


def test_api_completions_sends_the_targets_chat_template_rendered_by_the_client(tmp_path, data_dir):
    """--api completions (gpt-oss through vLLM, whose own chat rendering is Harmony's): each request is the target's
    chat template rendered here and sent to /v1/completions; the emulator counts a prompt's tokens from the text it
    gets (a token per 4 bytes), so the rendered turns, markers and all, make every cell's prompts longer than the
    chat API's contents; unrendered (the last user turn alone), MT-Bench's second turns would be shorter."""
    from benchmarks.fixtures.shape_folders import write_shape

    shape = write_shape("gpt-oss-120b", tmp_path / "shape")
    tokens = {}
    for api in ("chat", "completions"):
        argv = sweep_argv(tmp_path / api, "--data-dir", str(data_dir), "--modes", "ar", "--api", api, conc="1")
        argv[argv.index("org/emulated")], argv[argv.index("org/emulated-dflash")] = shape["target"], shape["drafter"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows = results(only_sweep(tmp_path / api))
        tokens[api] = {cid.split("-", 2)[2]: int(r["total_prompt_tokens"]) for cid, r in rows.items()}
        assert {r["settings_api"] for r in rows.values()} == {api}
        assert {r["settings_prompt_rendering"] for r in rows.values()} == (
            {f"chat template of {shape['target']}"} if api == "completions" else {""})
    assert set(tokens["chat"]) == {"gsm8k-c1", "mt-bench-c1"}
    assert all(tokens["completions"][c] > tokens["chat"][c] for c in tokens["chat"]), tokens


def test_api_completions_is_refused_for_an_engine_with_an_api_of_its_own(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", "Qwen3-8B", "--engine", "sglang",
                           "--api", "completions", "--dry-run", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--api completions: the sglang engine's requests use its own generate API" in proc.stderr + proc.stdout
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", "Qwen3-8B", "--engine", "vllm",
                           "--api", "responses", "--dry-run", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "--api takes chat or completions, not 'responses'" in proc.stderr + proc.stdout
    assert not (tmp_path / "o").exists()
