"""`sweep --executor slurm` on a real Slurm (.ci/slurm.sh starts a one-node cluster): an emulator sweep of
several server groups as jobs, one cancelled mid-cell with scancel, recorded failed with its Slurm state,
then resumed to completion; report and gate read the merged folder.

Skipped when no Slurm controller answers, unless DFLASH_BENCH_REQUIRE_SLURM=1 (set by .ci/run), where a
missing Slurm fails the test instead of hiding it (tests/services.py).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from services import service_missing


EMU = ["--engine-arg=--ttft-ms=5", "--engine-arg=--itl-ms=25", "--engine-arg=--acceptance-length=5",
       "--engine-arg=--seed=1"]
DEADLINE_S = 300  # a guard against a hung cluster, not a measurement


def _slurm_answers() -> str | None:
    """None when a controller and a node answer; else why not."""
    if shutil.which("sbatch") is None or shutil.which("scontrol") is None:
        return "Slurm's commands are not installed (run .ci/slurm.sh as root)"
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    if "is UP" not in ping.stdout:
        return f"no Slurm controller answers: {ping.stdout.strip() or ping.stderr.strip()}"
    nodes = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=30).stdout.split()
    if not any(n.rstrip("*~#") in ("idle", "mix", "alloc") for n in nodes):
        return f"no Slurm node is up (sinfo: {' '.join(nodes) or 'nothing'})"
    return None


@pytest.fixture(scope="module")
def slurm_cluster():  # the tests that take it are marked `slurm` (conftest.py)
    why = _slurm_answers()
    if why is not None:
        service_missing("slurm", why)


def sweep_argv(out: Path, data_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "dflash_bench", "sweep", "--model", "org/emulated", "--drafter", "org/emulated-dflash",
            "--engine", "emulator", "--suites", "gsm8k", "--concurrency", "1,2", "--repeats", "2", "-n", "6",
            "--max-tokens", "48", "--out", str(out), "--data-dir", str(data_dir), *EMU,
            "--executor", "slurm", "--poll-s", "0.5", *extra]


def results(folder: Path) -> dict[str, dict]:
    with open(folder / "results.csv") as f:
        return {row["cell_id"]: row for row in csv.DictReader(f)}


def _jobs(folder: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (folder / "slurm").glob("*.json")
            if not p.name.endswith(".manifest.json")}


def _wait_for(what, proc: subprocess.Popen, why: str):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        if proc.poll() is not None:
            pytest.fail(f"the sweep ended before {why}: {proc.stderr.read()[-3000:]}")
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {why}")


def _running_second_cell(out: Path):
    """The first AR job once it measures its second cell: (folder, job record)."""
    folders = [p for p in out.iterdir() if (p / "manifest.json").exists()] if out.is_dir() else []
    if not folders:
        return None
    folder = folders[0]
    for key, job in _jobs(folder).items():
        file = folder / "slurm" / f"{key}.manifest.json"
        if key.startswith("r0-00-") and job.get("job_id") and file.exists():
            try:
                plan = json.loads(file.read_text())["plan"]
            except (ValueError, KeyError):
                return None
            if len(plan) > 1 and plan[0]["status"] == "complete" and plan[1]["status"] == "running":
                return folder, job
    return None


def _our_jobs_left(folder: Path) -> list[str]:
    ids = [j["job_id"] for j in _jobs(folder).values() if j.get("job_id")]
    if not ids:
        return []
    out = subprocess.run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i %T"], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if line.strip()]


def _assert_servers_gone(manifest: dict) -> None:
    pids = [info["pid"] for info in manifest["servers"].values() if info.get("pid")]
    assert len(pids) == 3  # one server per job
    for pid in pids:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            assert time.monotonic() < deadline, f"server {pid} left running"
            time.sleep(0.1)


def test_sweep_as_slurm_jobs_cancelled_then_resumed(slurm_cluster, tmp_path, data_dir):
    out = tmp_path / "reports"
    proc = subprocess.Popen(sweep_argv(out, data_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    folder = None
    try:
        folder, victim = _wait_for(lambda: _running_second_cell(out), proc, "the first job measured its second cell")
        subprocess.run(["scancel", victim["job_id"]], check=True, timeout=30)
        _, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        if folder is not None:
            ids = [j["job_id"] for j in _jobs(folder).values() if j.get("job_id")]
            subprocess.run(["scancel", *ids], capture_output=True)  # whatever the outcome: no job left behind
    assert proc.returncode == 1, err[-3000:]  # cells failed: the exit code says so

    # one job per server group: AR r0, DFlash r0+r1 (consecutive), AR r1
    jobs = _jobs(folder)
    assert sorted(jobs) == ["r0-00-emulator-ar", "r0-01-emulator-dflash", "r0-02-emulator-ar"]
    assert jobs["r0-00-emulator-ar"]["state"] == "CANCELLED"
    assert jobs["r0-01-emulator-dflash"]["state"] == "COMPLETED"

    manifest = json.loads((folder / "manifest.json").read_text())
    plan = {c["cell_id"]: c for c in manifest["plan"]}
    first, cut = victim["cells"]
    assert plan[first]["status"] == "complete"
    assert plan[cut]["status"] == "failed"
    assert f"slurm job {victim['job_id']} CANCELLED" in plan[cut]["reason"]
    assert "log tail:" in plan[cut]["reason"] and "dflash-bench: slurm job" in plan[cut]["reason"]
    assert results(folder)[cut]["status"] == "failed"
    # placement: every measured cell names its node and its job
    for cid, cell in plan.items():
        if cell["status"] == "complete":
            assert cell["node"] and cell["job_id"] == jobs[next(k for k, j in jobs.items() if cid in j["cells"])]["job_id"]
    assert set(manifest["hardware"]["nodes"]) == {plan[first]["node"]}
    assert manifest["status"] == "failed"
    assert _our_jobs_left(folder) == []
    _assert_servers_gone(manifest)  # the cancelled job's server went with it

    # resume: only the cell that did not complete is submitted again, as one new job
    again = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--resume", str(folder), "--data-dir",
                            str(data_dir), "--executor", "slurm", "--poll-s", "0.5"],
                           capture_output=True, text=True, timeout=DEADLINE_S)
    assert again.returncode == 0, again.stderr[-3000:]
    jobs = _jobs(folder)
    new = {k: j for k, j in jobs.items() if k.startswith("r1-")}
    assert list(new) == ["r1-00-emulator-ar"] and new["r1-00-emulator-ar"]["cells"] == [cut]
    assert new["r1-00-emulator-ar"]["state"] == "COMPLETED"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert {c["status"] for c in manifest["plan"]} == {"complete"}
    assert {c["cell_id"]: c["job_id"] for c in manifest["plan"]}[cut] == new["r1-00-emulator-ar"]["job_id"]
    rows = results(folder)
    assert len(rows) == 8 and {r["status"] for r in rows.values()} == {"complete"}
    assert _our_jobs_left(folder) == []

    # the merged folder reads like any other
    report = subprocess.run([sys.executable, "-m", "dflash_bench", "report", str(folder)], capture_output=True,
                            text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    gate = subprocess.run([sys.executable, "-m", "dflash_bench", "gate", str(folder), "--baseline", str(folder)],
                          capture_output=True, text=True, timeout=300)
    assert gate.returncode == 0, gate.stdout[-2000:] + gate.stderr[-2000:]


def test_slurm_options_need_the_slurm_executor(tmp_path, data_dir):
    argv = sweep_argv(tmp_path, data_dir)
    argv = argv[: argv.index("--executor")] + ["--partition", "gpu"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "need --executor slurm" in proc.stderr and "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------- without a cluster


def test_scheduler_gpus_reads_the_jobs_gpus_from_slurm():
    from dflash_bench.telemetry import scheduler_gpus

    assert scheduler_gpus({}) is None
    assert scheduler_gpus({"SLURM_JOB_GPUS": "2,3"}) == "2,3"
    assert scheduler_gpus({"SLURM_JOB_GPUS": "2,3", "SLURM_STEP_GPUS": "3"}) == "3"  # inside srun: the step's
    assert scheduler_gpus({"SLURM_JOB_GPUS": "N/A"}) is None


def test_job_script_asks_for_the_servers_gpus_and_runs_the_hidden_job_command(tmp_path):
    from dflash_bench.settings import SlurmOptions
    from dflash_bench.sweep.slurm import SlurmJob, job_script

    job = SlurmJob(key="r0-00-vllm-ar", engine="vllm", mode="ar", cells=["vllm-ar-gsm8k-c1"], gpus=2)
    opts = SlurmOptions(partition="gpu", time="04:00:00", gpu_type="h100", sbatch_args=["--qos=high"])
    script = job_script(tmp_path, job, opts, "sweep-1")
    lines = script.splitlines()
    assert "#SBATCH --gres=gpu:h100:2" in lines and "#SBATCH --partition=gpu" in lines
    assert "#SBATCH --time=04:00:00" in lines and "#SBATCH --qos=high" in lines
    assert f"#SBATCH --output={tmp_path.resolve()}/slurm/r0-00-vllm-ar.log" in lines
    assert lines[-1].endswith(f"-m dflash_bench sweep-job {tmp_path.resolve()} r0-00-vllm-ar")
    no_gpu = job_script(tmp_path, job.model_copy(update={"gpus": 0}), SlurmOptions(), "sweep-1")
    assert "--gres" not in no_gpu and "--partition" not in no_gpu


def test_report_sets_cells_of_each_gpu_type_side_by_side(tmp_path):
    from benchmarks.fixtures.report_sweeps import make_sweep

    from dflash_bench.report import views as report_views
    from dflash_bench.store import SweepDir

    folder = make_sweep(tmp_path / "mixed", suites=("gsm8k",), concurrency=(1, 8))
    sweep = SweepDir(folder)
    manifest = sweep.read_manifest()
    for cell in manifest.plan:
        cell.gpu_type, cell.node = ("NVIDIA H100 80GB HBM3", "n1") if cell.concurrency == 1 else ("NVIDIA H200", "n2")
    sweep.write_manifest(manifest)
    views = report_views.load([folder])
    assert [v.label.rsplit(" · ", 1)[1] for v in views] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert [sorted(v.frame["concurrency"].unique()) for v in views] == [[1], [8]]
    assert [sorted(v.headline["concurrency"].unique()) for v in views] == [[1], [8]]
    assert len({v.slug for v in views}) == 2
    from dflash_bench.report import build_report

    page = build_report([folder]).read_text()
    assert "NVIDIA H100 80GB HBM3" in page and "NVIDIA H200" in page
    one = make_sweep(tmp_path / "one", suites=("gsm8k",), concurrency=(1, 8))
    assert len(report_views.load([one])) == 1  # no placement recorded: one view, as before


def test_local_resume_is_refused_while_a_job_of_the_sweep_runs(slurm_cluster, tmp_path):
    """A plain --resume would measure the cells a queued or running job is measuring: one sentence instead."""
    from benchmarks.fixtures.report_sweeps import make_sweep

    from dflash_bench.sweep.slurm import SlurmJob, write_job

    folder = make_sweep(tmp_path / "sweep", suites=("gsm8k",), concurrency=(1,))
    sub = subprocess.run(["sbatch", "--parsable", "--job-name=dflash-test-hold", f"--output={tmp_path}/hold.log",
                          "--wrap", "sleep 300"], capture_output=True, text=True, timeout=30)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    try:
        write_job(folder, SlurmJob(key="r0-00-vllm-ar", engine="vllm", mode="ar", cells=["vllm-ar-gsm8k-c1"],
                                   job_id=job_id, state="RUNNING"))
        proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--resume", str(folder)],
                              capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert f"Slurm jobs {job_id} of this sweep are still queued or running" in proc.stderr


def test_a_controller_that_does_not_answer_fails_no_job(slurm_cluster, tmp_path, monkeypatch):
    """squeue failing (controller restarting, network) is no news: a job is never marked ended for it."""
    from dflash_bench.sweep import slurm

    conf = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")).read_text().splitlines()
    dead = [line for line in conf if not line.startswith(("SlurmctldPort", "MessageTimeout"))]
    (tmp_path / "slurm.conf").write_text("\n".join(dead + ["SlurmctldPort=9", "MessageTimeout=1", ""]))
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    assert slurm.states(["1", "2"]) == {}


def test_a_refused_submission_is_one_sentence_and_leaves_nothing_queued(slurm_cluster, tmp_path, data_dir):
    out = tmp_path / "reports"
    proc = subprocess.run(sweep_argv(out, data_dir, "--partition", "no-such-partition"), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "sbatch refused job r0-00-emulator-ar" in proc.stderr and "--resume" in proc.stderr
    (folder,) = [p for p in out.iterdir() if (p / "manifest.json").exists()]
    assert json.loads((folder / "manifest.json").read_text())["status"] == "interrupted"
    assert {j["state"] for j in _jobs(folder).values()} == {"NOT_RUN"}
    assert _our_jobs_left(folder) == []


def test_several_gpu_types_are_one_command_and_one_folder_each(slurm_cluster, tmp_path, data_dir):
    """`--gpu-type a,b`: every server group is submitted once per type, each type into its own sweep folder,
    and each cell records the type it ran on; one report sets the two side by side."""
    out = tmp_path / "reports"
    argv = sweep_argv(out, data_dir, "--gpu-type", "typea,typeb")
    argv[argv.index("--repeats") + 1] = "1"
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folders = {}
    for gpu in ("typea", "typeb"):
        (folder,) = [p for p in (out / gpu).iterdir() if (p / "manifest.json").exists()]
        folders[gpu] = folder
        manifest = json.loads((folder / "manifest.json").read_text())
        assert manifest["status"] == "complete"
        assert {c["gpu_type"] for c in manifest["plan"]} == {gpu}
        assert f"DFLASH_BENCH_GPU_TYPE={gpu}" in (folder / "slurm" / "r0-00-emulator-ar.sbatch").read_text()
        assert _our_jobs_left(folder) == []
    report = subprocess.run([sys.executable, "-m", "dflash_bench", "report", *map(str, folders.values()),
                             "--out", str(tmp_path / "report.html")], capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    page = (tmp_path / "report.html").read_text()
    assert "emulator · typea" in page and "emulator · typeb" in page  # each sweep's label names its GPU type
