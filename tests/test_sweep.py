"""Whole sweeps through the process launcher against the emulator (known truth): run, crash, kill, resume."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflash_bench.launch import free_port
from launch_helpers import stop_harness
from services import sigint_delivered

EMU = ["--engine-arg=--ttft-ms=5", "--engine-arg=--itl-ms=2", "--engine-arg=--acceptance-length=5",
       "--engine-arg=--seed=1"]


def sweep_argv(out: Path, *extra: str, suites: str = "gsm8k,mt-bench", conc: str = "1,4") -> list[str]:
    return [sys.executable, "-m", "dflash_bench", "sweep", "--model", "org/emulated", "--drafter", "org/emulated-dflash",
            "--engine", "emulator", "--suites", suites, "--concurrency", conc, "-n", "6", "--max-tokens", "48",
            "--port", str(free_port()), "--out", str(out), *EMU, *extra]


def only_sweep(out: Path) -> Path:
    (folder,) = [p for p in out.iterdir() if (p / "manifest.json").exists()]
    return folder


def results(folder: Path) -> dict[str, dict]:
    with open(folder / "results.csv") as f:
        return {row["cell_id"]: row for row in csv.DictReader(f)}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]


def assert_servers_gone(folder: Path) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    for info in manifest["servers"].values():
        if info.get("pid"):
            deadline = time.time() + 5
            while pid_alive(info["pid"]) and time.time() < deadline:
                time.sleep(0.1)
            assert not pid_alive(info["pid"]), f"server {info['pid']} left running"


def test_whole_sweep_against_the_emulator(tmp_path, data_dir):
    out = tmp_path / "reports"
    proc = subprocess.run(sweep_argv(out, "--data-dir", str(data_dir)), capture_output=True, text=True, timeout=240)
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
    assert "AR vs DFlash" in proc.stdout and "gsm8k" in proc.stdout
    assert (folder / "logs" / "emulator-ar.log").exists()
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


def test_server_crashing_mid_cell_fails_cells_and_the_sweep_goes_on(tmp_path, data_dir):
    """The AR server exits after 10 requests: its cells fail with the reason, the DFlash cells still run."""
    out = tmp_path / "reports"
    argv = sweep_argv(out, "--data-dir", str(data_dir), "--engine-arg=--crash-after-requests=10", conc="1,2")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 1, proc.stderr[-3000:]  # something failed: the exit code says so
    folder = only_sweep(out)
    rows = results(folder)
    assert len(rows) == 8
    # every server crashes after 10 requests: 6 measured + warm-up per cell, so the 2nd cell of each launch fails
    assert rows["emulator-ar-gsm8k-c1"]["status"] == "complete"
    failed = [cid for cid, r in rows.items() if r["status"] == "failed"]
    assert failed and all(rows[c]["failure_reason"] for c in failed)
    for cid in failed:  # the summary counts what the failed cell measured before the server died
        lines = (folder / "cells" / cid / "requests.jsonl").read_text().splitlines() \
            if (folder / "cells" / cid / "requests.jsonl").exists() else []
        recs = [json.loads(x) for x in lines if not json.loads(x).get("warmup")]
        assert int(rows[cid]["num_requests"]) == len(recs)
        assert int(rows[cid]["num_ok"]) == sum("error" not in r for r in recs)
        assert "exited with code 3" in rows[cid]["failure_reason"]
    assert any("-dflash-" in c for c in rows if rows[c]["status"] == "complete")
    assert_servers_gone(folder)


@pytest.fixture
def no_server_outlives(tmp_path):
    """A test that fails half-way leaves no server of its sweeps running: each recorded in a manifest under
    tmp_path and still running that command is killed with its process group."""
    yield
    for manifest in tmp_path.rglob("manifest.json"):
        for info in json.loads(manifest.read_text()).get("servers", {}).values():
            pid = info.get("pid")
            try:
                if pid and pid_alive(pid) and b"dflash_bench" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.killpg(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass


def _wait_for_cells(out: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> Path:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else "sweep ended early"
        folders = [p for p in out.glob("*") if (p / "manifest.json").exists()] if out.exists() else []
        if folders and len(list(folders[0].glob("cells/*/summary.json"))) >= n:
            return folders[0]
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} cells finished in {timeout} s")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_killed_sweep_resumes_only_the_remaining_cells(tmp_path, data_dir, sig, no_server_outlives):
    out = tmp_path / "reports"
    argv = sweep_argv(out, "--data-dir", str(data_dir))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=sigint_delivered)
    try:
        folder = _wait_for_cells(out, 3, proc)
        proc.send_signal(sig)
        proc.wait(timeout=30)
    finally:
        stop_harness(proc)
    if sig == signal.SIGINT:
        assert proc.returncode == 130
        printed = proc.stdout.read()
        assert f"dflash-bench sweep --resume {folder}" in printed and "finished cells" in printed
        assert json.loads((folder / "manifest.json").read_text())["status"] == "interrupted"
        assert_servers_gone(folder)
    orphans = [i["pid"] for i in json.loads((folder / "manifest.json").read_text())["servers"].values() if i.get("pid")]
    (folder / "cells" / ".results.csv.abc123.tmp").write_text("half of a write a kill -9 cut short")
    before = {c.name: (c / "summary.json").read_bytes() for c in (folder / "cells").iterdir() if (c / "summary.json").exists()}
    rows_before = results(folder) if (folder / "results.csv").exists() else {}
    assert 3 <= len(before) < 8
    # the saved settings are reused: only where the data is and a free port are given again
    resume = [sys.executable, "-m", "dflash_bench", "sweep", "--resume", str(folder), "--data-dir", str(data_dir),
              "--port", str(free_port())]
    proc2 = subprocess.run(resume, capture_output=True, text=True, timeout=240)
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    rows = results(folder)
    assert len(rows) == 8 and all(r["status"] == "complete" for r in rows.values())
    for name, data in before.items():  # finished cells were not measured again
        assert (folder / "cells" / name / "summary.json").read_bytes() == data
        if name in rows_before:
            assert rows[name] == rows_before[name]
    assert json.loads((folder / "manifest.json").read_text())["status"] == "complete"
    assert not list(folder.rglob("*.tmp"))  # the resume removed what the killed writer left half-written
    for pid in orphans:  # after SIGKILL the harness could not tear down; the resume stopped what it left
        assert not pid_alive(pid), f"server {pid} of the killed run still running"
    assert_servers_gone(folder)


def test_resume_refuses_a_different_plan(tmp_path, data_dir):
    out = tmp_path / "reports"
    argv = sweep_argv(out, "--data-dir", str(data_dir), suites="gsm8k", conc="1")
    assert subprocess.run(argv, capture_output=True, timeout=120).returncode == 0
    folder = only_sweep(out)
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--resume", str(folder), "--max-tokens", "99"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "cannot resume" in proc.stderr and "max_tokens" in proc.stderr and "Traceback" not in proc.stderr


def test_resume_keeps_a_cell_whose_summary_was_written_before_the_kill(tmp_path, data_dir):
    """A kill between a cell's summary.json and the manifest update: the summary is the truth, not re-measured."""
    out = tmp_path / "reports"
    argv = sweep_argv(out, "--data-dir", str(data_dir), suites="gsm8k", conc="1")
    assert subprocess.run(argv, capture_output=True, timeout=120).returncode == 0
    folder = only_sweep(out)
    manifest = json.loads((folder / "manifest.json").read_text())
    first = manifest["plan"][0]["cell_id"]
    manifest["plan"][0]["status"], manifest["status"] = "running", "interrupted"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    before = (folder / "cells" / first / "summary.json").read_bytes()
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--resume", str(folder), "--data-dir",
                           str(data_dir), "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (folder / "cells" / first / "summary.json").read_bytes() == before
    after = json.loads((folder / "manifest.json").read_text())
    assert after["plan"][0]["status"] == "complete" and after["status"] == "complete"


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


# ---------------------------------------------------------------- one writer per folder (issue 22)


def _create_locked(path: str, barrier, results) -> None:
    from dflash_bench.store import Manifest, StoreError
    from dflash_bench.store.lock import create_locked

    barrier.wait()  # every process creates the same folder at the same moment
    try:
        create_locked(Path(path), Manifest(sweep_id="same-second"))
        results.put("created")
    except StoreError as err:
        results.put(str(err))
    barrier.wait()  # the winner holds its lock until every other process has tried


def test_of_sweeps_created_together_exactly_one_gets_the_folder(tmp_path):
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_create_locked, args=(str(tmp_path / "sw"), barrier, results)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    said = [results.get(timeout=5) for _ in procs]
    assert said.count("created") == 1
    assert all("being written by another dflash-bench" in x or "already holds a sweep" in x
               for x in said if x != "created")


def test_a_resume_is_refused_while_another_process_writes_the_folder(tmp_path, data_dir):
    from dflash_bench.store.lock import WriterLock

    out = tmp_path / "reports"
    assert subprocess.run(sweep_argv(out, "--data-dir", str(data_dir), suites="gsm8k", conc="1"),
                          capture_output=True, timeout=120).returncode == 0
    folder = only_sweep(out)
    shutil.rmtree(folder / "cells" / "emulator-dflash-gsm8k-c1")
    holder = WriterLock(folder).acquire()  # as a running sweep or resume of this folder holds it
    try:
        resume = [sys.executable, "-m", "dflash_bench", "sweep", "--resume", str(folder), "--data-dir", str(data_dir)]
        proc = subprocess.run(resume, capture_output=True, text=True, timeout=60)
    finally:
        holder.release()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"is being written by another dflash-bench (pid {os.getpid()})" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (folder / "cells" / "emulator-dflash-gsm8k-c1").exists()  # the refused resume measured nothing


def test_the_lock_dies_with_a_killed_process(tmp_path):
    from dflash_bench.store import Manifest, SweepDir
    from dflash_bench.store.lock import WriterLock

    SweepDir.create(tmp_path / "sw", Manifest(sweep_id="sw"))
    code = ("from dflash_bench.store.lock import WriterLock; "
            f"WriterLock({str(tmp_path / 'sw')!r}).acquire(); print('locked', flush=True); input()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(Exception, match="being written by another"):
            WriterLock(tmp_path / "sw").acquire()
        child.kill()  # SIGKILL: no clean-up runs
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    WriterLock(tmp_path / "sw").acquire().release()  # free again: the kernel dropped the dead process's lock


def test_port_and_image_are_saved_and_taken_back_on_resume(tmp_path, data_dir):
    out = tmp_path / "reports"
    argv = sweep_argv(out, "--data-dir", str(data_dir), suites="gsm8k", conc="1")
    port = int(argv[argv.index("--port") + 1])
    assert subprocess.run(argv, capture_output=True, timeout=120).returncode == 0
    folder = only_sweep(out)
    first = json.loads((folder / "manifest.json").read_text())
    assert first["settings"]["port"] == port and first["settings"]["runner"] == "process"
    shutil.rmtree(folder / "cells" / "emulator-dflash-gsm8k-c1")
    resume = [sys.executable, "-m", "dflash_bench", "sweep", "--resume", str(folder), "--data-dir", str(data_dir)]
    proc = subprocess.run(resume, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = json.loads((folder / "manifest.json").read_text())
    assert after["servers"]["emulator-dflash"] == first["servers"]["emulator-dflash"]  # the first record is kept
    assert after["servers"]["emulator-dflash #2"]["port"] == port  # the resume's server, on the saved port


@pytest.mark.parametrize("plan,says", [(False, "its manifest has no plan of cells"),
                                       (True, "it was written by `dflash-bench run`, not by a sweep")])
def test_resuming_a_folder_without_a_plan_says_what_is_wrong(tmp_path, plan, says):
    from dflash_bench.store import CellPlan, Manifest, SweepDir

    cells = [CellPlan(cell_id="vllm-ar-gsm8k-c1", engine="vllm", mode="ar", suite="gsm8k", concurrency=1)] if plan else []
    SweepDir.create(tmp_path / "run-1", Manifest(sweep_id="run-1", plan=cells))  # as `dflash-bench run` writes
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--resume", str(tmp_path / "run-1")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and says in proc.stderr
    assert "differs" not in proc.stderr and "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1


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


def test_saved_settings_keep_every_option_but_a_password_in_a_url():
    from dflash_bench.sweep.plan import SweepSettings
    from dflash_bench.sweep.folder import saved_settings

    s = SweepSettings(model="m", suites=["gsm8k"], port=18001, runner="process", image="img:1",
                      url_ar="http://u:hunter2@h:8000/v1", url_dflash="http://h:8001")
    saved = saved_settings(s)
    assert saved.port == 18001 and saved.runner == "process" and saved.image == "img:1"
    assert saved.url_ar == "http://u:***@h:8000/v1" and saved.url_dflash == "http://h:8001"
    assert "hunter2" not in saved.model_dump_json()


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
