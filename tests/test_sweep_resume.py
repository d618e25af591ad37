"""A sweep whose server crashes, a sweep killed (SIGINT, SIGKILL) and resumed, and one writer per folder: through
the process launcher against the emulator (known truth)."""

from __future__ import annotations

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
from launch_helpers import pid_alive, stop_harness
from services import sigint_delivered
from sweep_helpers import assert_servers_gone, only_sweep, results, sweep_argv


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


# ---------------------------------------------------------------- one writer per folder


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
    assert not (folder / ".lock").exists()  # a finished sweep released its lock: no file naming a dead pid
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


def test_a_released_lock_leaves_no_file_and_the_next_writers_still_exclude_each_other(tmp_path):
    from dflash_bench.store import StoreError
    from dflash_bench.store.lock import WriterLock

    (tmp_path / "sw").mkdir()
    with WriterLock(tmp_path / "sw"):
        assert (tmp_path / "sw" / ".lock").read_text() == str(os.getpid())
    assert list((tmp_path / "sw").iterdir()) == []
    first = WriterLock(tmp_path / "sw").acquire()
    try:
        with pytest.raises(StoreError, match="being written by another"):
            WriterLock(tmp_path / "sw").acquire()
    finally:
        first.release()
    assert list((tmp_path / "sw").iterdir()) == []


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


def test_saved_settings_keep_every_option_but_a_password_in_a_url():
    from dflash_bench.sweep.plan import SweepSettings
    from dflash_bench.sweep.folder import saved_settings

    s = SweepSettings(model="m", suites=["gsm8k"], port=18001, runner="process", image="img:1",
                      url_ar="http://u:hunter2@h:8000/v1", url_dflash="http://h:8001")
    saved = saved_settings(s)
    assert saved.port == 18001 and saved.runner == "process" and saved.image == "img:1"
    assert saved.url_ar == "http://u:***@h:8000/v1" and saved.url_dflash == "http://h:8001"
    assert "hunter2" not in saved.model_dump_json()
