"""Inside one Slurm job: the local sweep's own launch loop over this job's cells, on this node.

Many jobs write into one sweep folder at once, so a job never writes the shared manifest.json or
results.csv: its cells go to cells/<cell-id>/ (its own, by construction of the plan's split), and its
manifest (statuses, placement, servers) to slurm/<key>.manifest.json. The submitting process merges
those into manifest.json; summaries on disk stay the truth, as they are for a local resume.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from dflash_bench.errors import UserError
from dflash_bench.store import Manifest, SweepDir, atomic_write_json
from dflash_bench.sweep import slurm
from dflash_bench.sweep.plan import launches, resolve_pair


class JobSweepDir(SweepDir):
    """The shared sweep folder as one job sees it: cells shared, manifest and server logs its own."""

    def __init__(self, path: Path, key: str):
        super().__init__(path)
        self.key = key

    def write_manifest(self, manifest: Manifest) -> None:
        from dflash_bench.store import now_iso

        manifest.updated_at = now_iso()
        atomic_write_json(slurm.job_manifest_file(self.path, self.key), manifest)

    def log_path(self, engine: str, mode: str) -> Path:  # two jobs may run the same (engine, mode)
        return self.path / "logs" / f"{engine}-{mode}-{self.key}.log"

    def write_results_csv(self) -> Path:  # rebuilt by the submitting process from every job's summaries
        return self.path / "results.csv"


def run_job(folder: Path, key: str) -> int:
    """Measure this job's cells not yet complete; the local sweep's exit code (0, 1 some failed, 130 stopped)."""
    from dflash_bench.launch import sigterm_unwinds
    from dflash_bench.sweep import folder as sweep_folder
    from dflash_bench.sweep import run
    from dflash_bench.sweep.context import SweepContext, SweepResult, stops_recorded
    from dflash_bench.sweep.progress import SweepProgress
    from dflash_bench.sweep.prompts import prompt_loader
    from dflash_bench.sweep.telemetry import start_telemetry

    folder = Path(folder).resolve()
    job = slurm.read_job(folder, key)
    shared = SweepDir.open(folder)
    # jobs that share a node must not share a port, even one --port gave: each server takes a free one at launch
    # (sweep/launch.py; port is a resume-free setting)
    if job.settings is None:
        raise UserError(f"{slurm.job_file(folder, key)} holds no sweep settings: it is a --dry-run's job, not one to run")
    settings = job.settings.model_copy(update={"port": None})
    manifest = shared.read_manifest()
    mine = set(job.cells)
    manifest.plan = [c for c in manifest.plan if c.cell_id in mine]
    manifest.servers, manifest.notes, manifest.status = {}, [], "running"
    for cell in manifest.plan:
        sweep_folder.status_from_disk(shared, cell)
    sweep = JobSweepDir(folder, key)
    pair = resolve_pair(settings)
    prompts = prompt_loader(settings, Path(job.data_dir) if job.data_dir else None)
    progress = SweepProgress(manifest, quiet=True)
    ctx = SweepContext(settings, pair, sweep, manifest, prompts, SweepResult(folder), progress,
                       telemetry=start_telemetry(manifest, progress, settings, pair))
    _place(manifest)
    sweep.write_manifest(manifest)
    try:
        # scancel and the time limit send SIGTERM: unwind, stop the server, record
        with stops_recorded(ctx.result), sigterm_unwinds():
            for launch in launches(manifest.plan):
                print(f"dflash-bench: {launch.engine} {launch.mode}: {len(launch.cells)} cells", flush=True)
                run.measure_group(ctx, [launch])
    finally:
        sweep_folder.close_sweep(sweep, manifest, ctx.result)
    for cell in manifest.plan:
        print(f"dflash-bench: {cell.cell_id}: {cell.status}{' (' + cell.reason + ')' if cell.reason else ''}", flush=True)
    return ctx.result.exit_code


def _place(manifest: Manifest) -> None:
    """Record where each cell runs: node, job id, the job's GPUs and their type."""
    gpus = slurm_gpus()
    names = sorted({g.name for g in manifest.hardware.gpus if g.name})
    for cell in manifest.plan:
        cell.node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        cell.job_id = os.environ.get("SLURM_JOB_ID")
        cell.gpus = gpus
        cell.gpu_type = ", ".join(names) or os.environ.get("DFLASH_BENCH_GPU_TYPE") or None


def slurm_gpus() -> list[str] | None:
    from dflash_bench.telemetry import scheduler_gpus

    value = scheduler_gpus() or os.environ.get("CUDA_VISIBLE_DEVICES")
    return [g.strip() for g in value.split(",") if g.strip()] if value else None
