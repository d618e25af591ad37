"""Slurm through its own commands: sbatch to submit, squeue/sacct/scontrol to watch, scancel to stop.

Why the commands and not a library: they are Slurm's stable public interface on every version, so nothing
here is built against one cluster's headers (pyslurm must match the installed Slurm exactly); the job script
is a plain file in the sweep folder that a person can read and resubmit by hand; and the job runs our own
CLI, not a pickled Python function (submitit), so a job's log says exactly what ran.

The files a Slurm sweep adds to its folder, one set per job, each written by one process only:

    slurm/<key>.json            SlurmJob: written by the submitting process (cells, job id, final state)
    slurm/<key>.sbatch          the job script
    slurm/<key>.log             the job's stdout and stderr
    slurm/<key>.manifest.json   the job's own Manifest (its cells only), written by the job as it runs
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel

from dflash_bench.errors import UserError
from dflash_bench.settings import SlurmOptions, SweepSettings
from dflash_bench.store import atomic_write_json, atomic_write_text, read_json_model

SLURM_DIR = "slurm"
# a job in one of these states has not ended (COMPLETING: its processes are still being cleaned up)
ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                    "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "SUBMITTED"})


class SlurmJob(BaseModel):
    """One job: a server group's cells, what it runs with, and what the scheduler said about it."""

    key: str
    engine: str
    mode: str
    cells: list[str]
    settings: SweepSettings | None = None  # all of them (runner included), so the job needs no command line;
    # None only in --dry-run's scripts, which are shown, never run
    data_dir: str | None = None
    image: str | None = None
    gpus: int = 0
    job_id: str | None = None
    state: str = "SUBMITTED"
    reason: str | None = None
    node: str | None = None
    submitted_at: str | None = None
    ended_at: str | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


def job_ids(jobs: list[SlurmJob]) -> list[str]:
    """The scheduler's ids of the jobs submitted (a job not yet submitted has none)."""
    return [j.job_id for j in jobs if j.job_id]


class JobState(BaseModel):
    state: str
    node: str | None = None
    exit_code: str | None = None
    detail: str | None = None  # "CANCELLED by 0", a scheduler reason


# ---------------------------------------------------------------- files


def slurm_dir(folder: Path) -> Path:
    return Path(folder) / SLURM_DIR


def job_file(folder: Path, key: str) -> Path:
    return slurm_dir(folder) / f"{key}.json"


def log_file(folder: Path, key: str) -> Path:
    return slurm_dir(folder) / f"{key}.log"


def job_manifest_file(folder: Path, key: str) -> Path:
    return slurm_dir(folder) / f"{key}.manifest.json"


def write_job(folder: Path, job: SlurmJob) -> None:
    atomic_write_json(job_file(folder, job.key), job)


def read_job(folder: Path, key: str) -> SlurmJob:
    file = job_file(folder, key)
    if not file.exists():
        raise UserError(f"{folder} has no Slurm job {key!r} ({file} is missing)")
    return read_json_model(SlurmJob, file)


def read_jobs(folder: Path) -> list[SlurmJob]:
    files = sorted(p for p in slurm_dir(folder).glob("*.json") if not p.name.endswith(".manifest.json"))
    return [read_json_model(SlurmJob, f) for f in files]


def log_tail(folder: Path, key: str, chars: int = 800) -> str:
    try:
        text = log_file(folder, key).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return text[-chars:].strip() or "(empty log)"


# ---------------------------------------------------------------- the job script


def job_script(folder: Path, job: SlurmJob, opts: SlurmOptions, sweep_id: str) -> str:
    """The sbatch script of one job: resources as #SBATCH lines, then the hidden `sweep-job` command."""
    folder = Path(folder).resolve()
    lines = ["#!/bin/bash", f"#SBATCH --job-name=dflash-{job.key}", f"#SBATCH --output={log_file(folder, job.key)}",
             "#SBATCH --open-mode=append", "#SBATCH --nodes=1", "#SBATCH --ntasks=1"]
    for flag, value in (("partition", opts.partition), ("account", opts.account), ("time", opts.time)):
        if value is not None:
            lines.append(f"#SBATCH --{flag}={value}")
    if job.gpus:
        lines.append(f"#SBATCH --gres=gpu:{opts.gpu_type + ':' if opts.gpu_type else ''}{job.gpus}")
    lines += [f"#SBATCH {arg}" for arg in opts.sbatch_args]
    command = [sys.executable, "-m", "dflash_bench", "sweep-job", str(folder), job.key]
    if opts.gpu_type:  # the cells' GPU type where NVML cannot name it
        lines.append(f"export DFLASH_BENCH_GPU_TYPE={shlex.quote(opts.gpu_type)}")
    lines += [f"# sweep {sweep_id}: cells {', '.join(job.cells)}",
              'echo "dflash-bench: slurm job $SLURM_JOB_ID on $(hostname) gpus=${SLURM_JOB_GPUS:-none}"',
              f"exec {shlex.join(command)}", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- the scheduler's commands


def require_slurm() -> None:
    missing = [c for c in ("sbatch", "squeue", "scancel", "scontrol") if shutil.which(c) is None]
    if missing:
        raise UserError(f"--executor slurm needs Slurm's commands on PATH; not found: {', '.join(missing)}")


def submit(folder: Path, job: SlurmJob, opts: SlurmOptions, sweep_id: str) -> str:
    """Write the job's script and submit it; its job id. A refusal is a UserError with sbatch's words."""
    script = slurm_dir(folder) / f"{job.key}.sbatch"
    atomic_write_text(script, job_script(folder, job, opts, sweep_id))
    out = _run(["sbatch", "--parsable", str(script)])
    if out.returncode != 0:
        raise UserError(f"sbatch refused job {job.key}: {_words(out.stderr or out.stdout)}")
    return out.stdout.strip().split(";")[0]


def cancel(job_ids: list[str]) -> None:
    if job_ids:
        _run(["scancel", *job_ids])


def states(job_ids: list[str]) -> dict[str, JobState]:
    """Each job's state: squeue for jobs the controller holds, else sacct (accounting), else scontrol (the
    controller's memory of recently ended jobs). A job no source knows is UNKNOWN."""
    if not job_ids:
        return {}
    found = _squeue(job_ids)
    if found is None:  # the controller did not answer: conclude nothing this time (no job is failed for it)
        return {}
    ended = [j for j in job_ids if j not in found or found[j].state not in ACTIVE]
    if ended:
        found.update(_sacct(ended))
        for j in ended:
            if j not in found or found[j].state in ACTIVE:
                found[j] = _scontrol(j) or found.get(j) or JobState(state="UNKNOWN", detail="the scheduler no longer knows this job")
    return found


def _squeue(job_ids: list[str]) -> dict[str, JobState] | None:
    out = _run(["squeue", "-h", "--states=all", "-j", ",".join(job_ids), "-o", "%i|%T|%N|%r"])
    if out.returncode != 0:
        # every id already purged from the controller is an answer; anything else (no controller) is not
        return {} if "Invalid job id" in out.stderr else None
    found = {}
    for line in out.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4:
            found[parts[0]] = JobState(state=parts[1], node=parts[2] or None,
                                       detail=parts[3] if parts[3] not in ("", "None") else None)
    return found


def _sacct(job_ids: list[str]) -> dict[str, JobState]:
    out = _run(["sacct", "-n", "-P", "-X", "-j", ",".join(job_ids), "-o", "JobIDRaw,State,ExitCode,NodeList"])
    found = {}
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0] in job_ids:
            state = parts[1].split()[0] if parts[1] else "UNKNOWN"
            found[parts[0]] = JobState(state=state, node=parts[3] or None, exit_code=parts[2] or None, detail=parts[1])
    return found


def _scontrol(job_id: str) -> JobState | None:
    out = _run(["scontrol", "show", "job", "-o", job_id])
    if out.returncode != 0:
        return None
    fields = dict(f.split("=", 1) for f in out.stdout.split() if "=" in f)
    if "JobState" not in fields:
        return None
    return JobState(state=fields["JobState"], node=fields.get("NodeList") or None, exit_code=fields.get("ExitCode"),
                    detail=fields.get("Reason") if fields.get("Reason") not in (None, "None") else None)


def describe(job: SlurmJob, st: JobState) -> str:
    """`slurm job 12 CANCELLED by 0 on node1 (exit 0:15)`: the reason a killed job's cells carry."""
    what = st.detail if st.detail and st.detail.startswith(st.state) else st.state
    parts = [f"slurm job {job.job_id} {what}"]
    if st.node:
        parts.append(f"on {st.node}")
    if st.exit_code:
        parts.append(f"(exit {st.exit_code})")
    return " ".join(parts)


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise UserError(f"{argv[0]} is not installed: --executor slurm needs Slurm's commands on PATH") from None
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 1, "", f"{argv[0]} did not answer in 60 s")


def _words(text: str) -> str:
    return " ".join(text.split())[:500] or "(no message)"
