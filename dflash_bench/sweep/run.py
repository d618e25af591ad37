"""Run a sweep, top-down: plan (or reload) it, then for each group of launches bring the servers up, measure
each cell and write it, and close the folder; resumable at any point.

Each phase is a module of its own and none calls back here (tests/test_imports.py): start.py (settings, pair,
prompts, the folder planned by plan.py and folder.py), launch.py (servers up and down), measure.py (one cell),
write.py (into the folder). A Slurm job runs `measure_group` over its own launches (slurm_job.py).
"""

from __future__ import annotations

import sys
from itertools import groupby
from pathlib import Path

from dflash_bench.store import CellPlan, SweepSettings
from dflash_bench.sweep import launch, measure, write
from dflash_bench.sweep.context import SweepContext, SweepResult, stops_recorded
from dflash_bench.sweep.folder import close_sweep
from dflash_bench.sweep.plan import Launch, launches
from dflash_bench.sweep.start import start_sweep
from dflash_bench.telemetry import speed_probe

__all__ = ["SweepResult", "measure_group", "run_sweep"]


def run_sweep(settings: SweepSettings, *, out: Path, resume: Path | None = None, data_dir: Path | None = None,
              argv: list[str] | None = None, quiet: bool = False) -> SweepResult:
    """Plan (or reload) the sweep, run every cell not yet complete, and return where it landed."""
    ctx, lock = start_sweep(settings, out=out, resume=resume, data_dir=data_dir, argv=argv or sys.argv, quiet=quiet)
    try:
        try:
            with stops_recorded(ctx.result), ctx.progress:
                groups = server_groups(launches(ctx.manifest.plan, paired=settings.paired), settings.paired)
                speed_probe.record(ctx.manifest, "start")  # the machine's speed, for the gate (gate/machine.py)
                for i, group in enumerate(groups, 1):
                    measure_group(ctx, group)
                    speed_probe.record(ctx.manifest, f"after group {i} of {len(groups)}")
        finally:
            close_sweep(ctx.sweep, ctx.manifest, ctx.result)
        if not quiet:
            ctx.progress.print_table(ctx.sweep)
            if ctx.result.interrupted:
                ctx.progress.print_resume(ctx.sweep)
        write.annotate_quality(ctx.sweep, settings)
    finally:
        lock.release()
    return ctx.result


def measure_group(ctx: SweepContext, group: list[Launch]) -> None:
    """One group's servers up; each cell measured on its server and written, in plan order (--interleave: the
    two modes of a concurrency-1 cell together, measure.measure_pair); the servers down."""
    with launch.servers_up(ctx, group) as servers:
        held: tuple[CellPlan, launch.Server] | None = None  # a cell waiting for its other mode (--interleave)
        for cell, server in servers.alive():
            if held is not None:
                first, held = held, None
                if measure.interleaves(ctx, first[0], cell):
                    for done, measured in measure.measure_pair(ctx, first, (cell, server)):
                        write.write_measured(ctx, done, measured)
                    continue
                _measure_one(ctx, *first)  # its other mode did not start, or is complete already (a resume)
            if ctx.settings.interleave and cell.concurrency == 1:
                held = (cell, server)
                continue
            _measure_one(ctx, cell, server)
        if held is not None:
            _measure_one(ctx, *held)


def _measure_one(ctx: SweepContext, cell: CellPlan, server: launch.Server) -> None:
    measured = measure.measure_cell(ctx, cell, server)
    if measured is not None:
        write.write_measured(ctx, cell, measured)


def server_groups(ls: list[Launch], paired: bool) -> list[list[Launch]]:
    """The launches whose servers run together: each alone, or paired an engine's two."""
    return [list(g) for _, g in groupby(ls, key=lambda launch: (launch.engine, launch.slots, launch.synthetic))] if paired \
        else [[launch] for launch in ls]
