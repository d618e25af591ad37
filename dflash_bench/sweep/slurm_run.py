"""`sweep --executor slurm`: split the plan into jobs, submit them, watch them, merge what they wrote.

One job per server group (the local sweep's launches(): consecutive cells of one engine and mode; the GPU
type is the jobs' gres request). Each job runs the local launch loop on its node (sweep/slurm_job.py) and
writes only its own cells and its own slurm/<key>.manifest.json, so jobs never contend for a file; this
process is the only writer of manifest.json and results.csv, merged from the cells on disk. A job the
scheduler ends early (scancel, time limit, node failure) leaves its unfinished cells failed with the
scheduler's state and the tail of its log; --resume submits the cells not complete, and waits again on
jobs of an earlier run that are still queued or running instead of submitting their cells twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from dflash_bench.console import new_console
from dflash_bench.errors import UserError
from dflash_bench.settings import SlurmOptions, gpu_types
from dflash_bench.store import CellPlan, Manifest, StoreError, SweepDir, now_iso, read_json_model
from dflash_bench.store.lock import WriterLock
from dflash_bench.sweep import slurm
from dflash_bench.sweep.context import SweepContext, SweepResult
from dflash_bench.sweep.plan import SweepSettings, launches, resolve_pair
from dflash_bench.sweep.prompts import prompt_loader
from dflash_bench.sweep.slurm import SlurmJob
from dflash_bench.sweep.write import Ledger, annotate_quality, fail_cell

if TYPE_CHECKING:
    from dflash_bench.models import ModelPair

CANCEL_WAIT_S = 180.0  # after Ctrl-C: how long to wait for cancelled jobs to end before giving up on them


def slurm_command(settings: SweepSettings, opts: SlurmOptions, *, preset_given: bool, out: Path,
                  resume: Path | None, dry_run: bool, data_dir: Path | None, argv: list[str]) -> int:
    """`sweep --executor slurm`: one sweep folder, or with `--gpu-type h100,h200` one per GPU type under
    --out/<type>/ (the cell ids name no GPU), submitted and waited on together; the worst exit code."""
    from dflash_bench.sweep.dry_run import print_plan

    types = gpu_types(opts.gpu_type)
    if len(types) > 1:
        plans = [(_for_type(settings, t, preset_given), opts.model_copy(update={"gpu_type": t}), Path(out) / t)
                 for t in types]
    else:
        plans = [(settings, opts, out)]
    if dry_run:
        for s, o, _ in plans:
            print_plan(s)
            print_jobs(s, o)
        return 0
    results = run_slurm_sweeps(plans, resume=resume, data_dir=data_dir, argv=argv)
    return max(r.exit_code for r in results)  # 130 (stopped) over 1 (a cell failed) over 0


def _for_type(settings: SweepSettings, gpu_type: str, preset_given: bool) -> SweepSettings:
    """The engine flag preset follows the GPU type (h200 -> h100's kernels) unless --gpu names one."""
    from dflash_bench.profiles.base import check_preset

    if preset_given:
        return settings
    try:
        check_preset(gpu_type)
    except UserError:
        return settings  # a site-specific gres name (a100-80g, ...): the generic flags
    return settings.model_copy(update={"gpu": gpu_type})


@dataclass
class _Run:
    """One sweep folder under way: its context, what Slurm is asked for, its jobs."""

    ctx: SweepContext
    opts: SlurmOptions
    lock: WriterLock  # the folder's writer lock: the submitter is its one writer of manifest.json
    data_dir: Path | None
    jobs: list[SlurmJob] = field(default_factory=list)
    todo: list[CellPlan] = field(default_factory=list)


@dataclass
class _Earlier:
    """An earlier run's folder while its jobs settle, before this run's context exists (a write.Ledger)."""

    sweep: SweepDir
    manifest: Manifest
    result: SweepResult


def run_slurm_sweeps(plans: list[tuple[SweepSettings, SlurmOptions, Path]], *, resume: Path | None,
                     data_dir: Path | None, argv: list[str]) -> list[SweepResult]:
    """Each (settings, Slurm options, out) is one sweep folder (one per GPU type): submit every cell not
    complete as jobs, wait for all of them together, and return each folder's merged SweepResult."""
    from dflash_bench.launch import Terminated, sigterm_unwinds
    from dflash_bench.sweep import folder as sweep_folder

    slurm.require_slurm()
    console = new_console(stderr=True)
    runs = [_prepare(settings, opts, out, resume, data_dir, argv, console) for settings, opts, out in plans]
    try:
        with sigterm_unwinds():  # from the first sbatch on, whatever stops this command cancels its jobs
            for r in runs:
                _submit_all(r, r.todo, console)
            while any(j.active for r in runs for j in r.jobs):
                time.sleep(min(r.opts.poll_s for r in runs))
                for r in runs:
                    _poll(r.ctx, r.jobs, console)
                    _merge(r.ctx.sweep, r.ctx.manifest, r.jobs)
                    r.ctx.sweep.write_manifest(r.ctx.manifest)
    except (KeyboardInterrupt, Terminated):  # Ctrl-C or SIGTERM: no job of ours is left queued or running
        for r in runs:
            r.ctx.result.interrupted = True
        _cancel_and_wait(runs, console)
    finally:
        for r in runs:
            _merge(r.ctx.sweep, r.ctx.manifest, r.jobs)
            sweep_folder.close_sweep(r.ctx.sweep, r.ctx.manifest, r.ctx.result)
    for r in runs:
        annotate_quality(r.ctx.sweep, r.ctx.settings)
        r.lock.release()
        r.ctx.progress.print_table(r.ctx.sweep)
    return [r.ctx.result for r in runs]


def _prepare(settings: SweepSettings, opts: SlurmOptions, out: Path, resume: Path | None, data_dir: Path | None,
             argv: list[str], console: Console) -> _Run:
    """Check the settings, open (or create) the folder, settle an earlier run's jobs; the cells to submit."""
    from dflash_bench.sweep import folder as sweep_folder
    from dflash_bench.sweep.progress import SweepProgress

    pair = resolve_pair(settings)
    watched: list[SlurmJob] = []
    if resume is not None:  # jobs of an earlier run settle first, so that the plan's statuses read the truth
        watched = _earlier_jobs(Path(resume), console)
        sweep, manifest, lock = sweep_folder.open_sweep(settings, out, resume, pair, argv)
        prompts = prompt_loader(settings, data_dir)
    else:
        prompts = prompt_loader(settings, data_dir)  # a missing dataset fails here, before a folder or a job exists
        sweep, manifest, lock = sweep_folder.open_sweep(settings, out, None, pair, argv)
    busy = {cid for job in watched for cid in job.cells}
    ctx = SweepContext(settings, pair, sweep, manifest, prompts, SweepResult(sweep.path), SweepProgress(manifest))
    return _Run(ctx, opts, lock, data_dir, jobs=list(watched), todo=[c for c in manifest.plan if c.cell_id not in busy])


# ---------------------------------------------------------------- submitting


def print_jobs(settings: SweepSettings, opts: SlurmOptions) -> None:
    """--dry-run: the job script each server group would be submitted as (for a sweep started now)."""
    import typer

    from dflash_bench.sweep.plan import plan_cells

    pair = resolve_pair(settings)
    for i, launch in enumerate(launches(plan_cells(settings))):
        job = SlurmJob(key=f"r0-{i:02d}-{launch.engine}-{launch.mode}", engine=launch.engine, mode=launch.mode,
                       cells=[c.cell_id for c in launch.cells], gpus=_gpus(settings, opts, pair, launch.engine))
        typer.echo(f"\nslurm job {job.key} ({len(job.cells)} cells):")
        typer.echo(slurm.job_script(Path("SWEEP_DIR"), job, opts, "SWEEP_ID").rstrip())


def _submit_all(r: _Run, cells: list[CellPlan], console: Console) -> None:
    """Submit one job per server group of `cells`, appending each to `r.jobs` as soon as it is queued."""
    sweep, manifest, settings, opts, jobs = r.ctx.sweep, r.ctx.manifest, r.ctx.settings, r.opts, r.jobs
    data_dir, image = r.data_dir, r.ctx.settings.image
    round_ = len({job.key.split("-")[0] for job in slurm.read_jobs(sweep.path)})
    earlier = len(jobs)
    for i, launch in enumerate(launches(cells)):
        job = SlurmJob(key=f"r{round_}-{i:02d}-{launch.engine}-{launch.mode}", engine=launch.engine, mode=launch.mode,
                       cells=[c.cell_id for c in launch.cells], settings=settings,
                       data_dir=str(Path(data_dir).resolve()) if data_dir else None, image=image,
                       gpus=_gpus(settings, opts, r.ctx.pair, launch.engine))
        slurm.write_job(sweep.path, job)
        try:
            job.job_id = slurm.submit(sweep.path, job, opts, manifest.sweep_id)
            jobs.append(job)  # at once: a signal from here on cancels it too
        except UserError as err:  # nothing runs half-submitted: stop what went in, keep the folder resumable
            mine = jobs[earlier:]
            slurm.cancel([j.job_id for j in mine if j.job_id])
            del jobs[earlier:]
            for j in mine + [job]:
                j.state, j.reason = "NOT_RUN", f"withdrawn: {err}"
                slurm.write_job(sweep.path, j)
            manifest.status = "interrupted"
            sweep.write_manifest(manifest)
            raise UserError(f"{err}; the jobs this command had submitted were cancelled: fix the Slurm options and "
                            f"pass --resume {sweep.path}") from None
        job.state, job.submitted_at = "PENDING", now_iso()
        slurm.write_job(sweep.path, job)
        console.print(f"submitted slurm job {job.job_id}: {job.key} ({len(job.cells)} cells, {job.gpus} GPUs)")


def _gpus(settings: SweepSettings, opts: SlurmOptions, pair: ModelPair, engine: str) -> int:
    """GPUs of one job: --gpus-per-node, else the server's tensor-parallel size (the emulator needs none)."""
    if opts.gpus_per_node is not None:
        return opts.gpus_per_node
    from dflash_bench import profiles

    return profiles.server_gpus(engine, pair, settings)


def _earlier_jobs(folder: Path, console: Console) -> list[SlurmJob]:
    """Jobs of an earlier run of this sweep: settle those that ended; the ones still queued or running."""
    jobs = [j for j in slurm.read_jobs(folder) if j.active and j.job_id]
    if not jobs:
        return []
    sweep = SweepDir.open(folder)
    manifest = sweep.read_manifest()
    _poll(_Earlier(sweep, manifest, SweepResult(sweep.path)), jobs, console)
    sweep.write_manifest(manifest)
    alive = [j for j in jobs if j.active]
    if alive:
        console.print(f"still queued or running from before: {', '.join(f'{j.job_id} ({j.key})' for j in alive)}; waiting on them")
    return alive


def refuse_local_resume(folder: Path) -> None:
    """A local --resume must not measure cells that Slurm jobs of this sweep are still measuring."""
    recorded = [j for j in slurm.read_jobs(folder) if j.active and j.job_id] if slurm.slurm_dir(folder).is_dir() else []
    if not recorded:
        return
    try:
        found = slurm.states(slurm.job_ids(recorded))
    except UserError:
        return  # no Slurm here: the jobs cannot be running where this machine could see them
    alive = [j for j in slurm.job_ids(recorded) if j in found and found[j].state in slurm.ACTIVE]
    if alive:
        raise UserError(f"Slurm jobs {', '.join(alive)} of this sweep are still queued or running; resume with "
                        "--executor slurm to wait on them, or scancel them first")


# ---------------------------------------------------------------- watching


def _poll(ctx: Ledger, jobs: list[SlurmJob], console: Console) -> None:
    sweep = ctx.sweep
    active = [j for j in jobs if j.active]
    found = slurm.states(slurm.job_ids(active))
    for job in active:
        st = found.get(job.job_id) if job.job_id else None
        if st is None:
            continue
        job.node = st.node or job.node
        if st.state in slurm.ACTIVE:
            if st.state != job.state:
                job.state = st.state
                slurm.write_job(sweep.path, job)
                console.print(f"slurm job {job.job_id} {job.key}: {st.state}{' on ' + st.node if st.node else ''}")
            continue
        _finish(ctx, job, st, console)


def _finish(ctx: Ledger, job: SlurmJob, st: slurm.JobState, console: Console) -> None:
    """An ended job: its cells without a summary fail with the scheduler's state and the log's tail."""
    sweep, manifest, result = ctx.sweep, ctx.manifest, ctx.result
    _merge(sweep, manifest, [job])
    job.state, job.ended_at = st.state, now_iso()
    job.reason = None if st.state == "COMPLETED" else slurm.describe(job, st)
    slurm.write_job(sweep.path, job)
    why = job.reason or slurm.describe(job, st)
    unfinished = [cid for cid in job.cells if sweep.read_summary(cid) is None]
    for cid in unfinished:
        fail_cell(ctx, manifest.cell(cid),
                  f"{why}: the job ended before this cell finished; log tail: {slurm.log_tail(sweep.path, job.key)}")
    for cid in job.cells:
        summary = sweep.read_summary(cid)
        if summary is not None and summary.status == "failed" and cid not in result.failed:
            result.failed.append(cid)
    done = sum(1 for cid in job.cells if manifest.cell(cid).status in ("complete", "partial"))
    console.print(f"{job.key}: {escape(why)}: {done}/{len(job.cells)} cells complete")


def _cancel_and_wait(runs: list[_Run], console: Console) -> None:
    """Ctrl-C: cancel every job these sweeps have queued or running (none is left behind), then record them."""
    active = [j for r in runs for j in r.jobs if j.active]
    console.print(f"interrupted: cancelling slurm jobs {', '.join(slurm.job_ids(active))}")
    slurm.cancel(slurm.job_ids(active))
    deadline = time.monotonic() + CANCEL_WAIT_S
    while any(j.active for r in runs for j in r.jobs) and time.monotonic() < deadline:
        time.sleep(1.0)
        for r in runs:
            _poll(r.ctx, r.jobs, console)


# ---------------------------------------------------------------- merging


def _merge(sweep: SweepDir, manifest: Manifest, jobs: list[SlurmJob]) -> None:
    """Fold each job's own manifest into the sweep's: statuses, placement, servers, GPUs, notes."""
    for job in jobs:
        file = slurm.job_manifest_file(sweep.path, job.key)
        if not file.exists():
            continue
        try:
            mine = read_json_model(Manifest, file)
        except StoreError:
            continue  # being replaced right now: next poll
        # an ended job's statuses are settled from its cells on disk (_finish); its manifest may be older
        fields = ("status", "reason", "node", "job_id", "gpus", "gpu_type") if job.active else ("node", "job_id", "gpus", "gpu_type")
        for cell in mine.plan:
            main = manifest.cell(cell.cell_id)
            for name in fields:
                setattr(main, name, getattr(cell, name))
        manifest.servers.update({f"{k}@{job.key}": v for k, v in mine.servers.items()})
        manifest.notes += [n for n in mine.notes if n not in manifest.notes]
        if mine.hardware.gpus and not manifest.hardware.gpus:  # the report's GPU count and names read these
            manifest.hardware.gpus = mine.hardware.gpus
        node = next((c.node for c in mine.plan if c.node), None)
        if node:
            manifest.hardware.nodes[node] = mine.hardware.gpus
        manifest.telemetry = manifest.telemetry or mine.telemetry

