"""Run a sweep, top-down: plan (or reload) it, then for each group of launches bring the servers up, measure
each cell and write it, and close the folder; resumable at any point.

Each phase is a module of its own and none calls back here: plan.py + folder.py + prompts.py (what to run,
the folder, the prompts), launch.py (servers up and down), measure.py (one cell), write.py (into the folder).
A Slurm job runs `measure_group` over its own launches (slurm_job.py).
"""

from __future__ import annotations

import sys
from itertools import groupby
from pathlib import Path

from dflash_bench.errors import UserError
from dflash_bench.store import SweepSettings
from dflash_bench.store.provenance import redact
from dflash_bench.sweep import launch, measure, write
from dflash_bench.sweep.context import SweepContext, SweepResult, stops_recorded
from dflash_bench.sweep.folder import close_sweep, open_sweep, stop_leftovers
from dflash_bench.sweep.plan import Launch, launches
from dflash_bench.sweep.progress import SweepProgress
from dflash_bench.sweep.prompts import prompt_loader
from dflash_bench.sweep.telemetry import start_telemetry

__all__ = ["SweepResult", "measure_group", "run_sweep"]


def run_sweep(settings: SweepSettings, *, out: Path, resume: Path | None = None, data_dir: Path | None = None,
              argv: list[str] | None = None, quiet: bool = False, image: str | None = None) -> SweepResult:
    """Plan (or reload) the sweep, run every cell not yet complete, and return where it landed."""
    from dflash_bench import models

    if redact(settings.engine_args) != settings.engine_args:  # it would land in the manifest
        raise UserError("an --engine-arg carries a secret (a token, key or password); pass it through the "
                        "environment instead (HF_TOKEN, VLLM_API_KEY, ...) so it is never written to the sweep folder")
    pair = models.resolve(settings.model, drafter=settings.engine_options.get("drafter"))
    early = prompt_loader(settings, data_dir) if resume is None else None  # a missing dataset: before any folder
    # a mismatched resume is refused before any dataset is touched; the folder's lock, taken here, is
    # held until everything is written
    sweep, manifest, lock = open_sweep(settings, out, resume, pair, argv or sys.argv)
    try:
        if resume is not None:
            stop_leftovers(manifest.sweep_id)  # only now: the lock says no other run of this sweep is alive
        prompts = early or prompt_loader(settings, data_dir)
        progress = SweepProgress(manifest, quiet=quiet)
        ctx = SweepContext(settings, pair, sweep, manifest, prompts, SweepResult(sweep.path), progress,
                           telemetry=start_telemetry(manifest, progress, settings, pair), image=image or settings.image)
        try:
            with stops_recorded(ctx.result), progress:
                for group in server_groups(launches(manifest.plan, paired=settings.paired), settings.paired):
                    measure_group(ctx, group)
        finally:
            close_sweep(sweep, manifest, ctx.result)
        if not quiet:
            progress.print_table(sweep)
            if ctx.result.interrupted:
                progress.print_resume(sweep)
        write.annotate_quality(sweep, settings)
    finally:
        lock.release()
    return ctx.result


def measure_group(ctx: SweepContext, group: list[Launch]) -> None:
    """One group's servers up; each cell measured on its server and written, in plan order; the servers down."""
    with launch.servers_up(ctx, group) as servers:
        for cell, server in servers.alive():
            measured = measure.measure_cell(ctx, cell, server)
            if measured is not None:
                write.write_measured(ctx, cell, measured)


def server_groups(ls: list[Launch], paired: bool) -> list[list[Launch]]:
    """The launches whose servers run together: each alone, or paired an engine's two."""
    return [list(g) for _, g in groupby(ls, key=lambda launch: launch.engine)] if paired else [[launch] for launch in ls]
