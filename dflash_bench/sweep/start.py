"""The first phase of a local sweep, over settings sweep/check.py has checked: the pair resolved, the prompts loaded,
the folder planned new (folder.open_sweep, plan.plan_cells) or reopened for a resume, the GPU telemetry started; what
comes out is the SweepContext every later phase takes, and the folder's writer lock."""

from __future__ import annotations

from pathlib import Path

from dflash_bench.store import CellPlan, SweepSettings
from dflash_bench.store.lock import WriterLock
from dflash_bench.sweep.context import SweepContext, SweepResult
from dflash_bench.sweep.folder import open_sweep, stop_leftovers
from dflash_bench.sweep.plan import launches, resolve_pair
from dflash_bench.sweep.progress import SweepProgress
from dflash_bench.sweep.prompts import prompt_loader
from dflash_bench.sweep.telemetry import start_telemetry


def start_sweep(settings: SweepSettings, *, out: Path, resume: Path | None, data_dir: Path | None, argv: list[str],
                quiet: bool) -> tuple[SweepContext, WriterLock]:
    """The sweep's context and its folder's lock (held by this process; the caller releases it)."""

    pair = resolve_pair(settings)
    early = prompt_loader(settings, data_dir) if resume is None else None  # a missing dataset: before any folder
    if resume is None:
        ports_free(settings, [])
    # a mismatched resume is refused before any dataset is touched; the folder's lock, taken here, is
    # held until everything is written
    sweep, manifest, lock = open_sweep(settings, out, resume, pair, argv)
    try:
        if resume is not None:
            stop_leftovers(manifest.sweep_id)  # only now: the lock says no other run of this sweep is alive
            ports_free(settings, manifest.plan)
        prompts = early or prompt_loader(settings, data_dir)
        progress = SweepProgress(manifest, quiet=quiet)
        telemetry = start_telemetry(manifest, progress, settings, pair)
    except BaseException:
        lock.release()
        raise
    return SweepContext(settings, pair, sweep, manifest, prompts, SweepResult(sweep.path), progress,
                        telemetry=telemetry), lock


def ports_free(settings: SweepSettings, plan: list[CellPlan]) -> None:
    """The --port given, when another process listens on it, is refused in one sentence before anything is measured
    (each launch checks again, and checks that the server answering is the one it started: launch/identity.py).
    Without --port each server takes a free port at launch (sweep/launch.py); a resume with nothing left to
    measure (`plan`: the resumed one; [] for a new sweep) launches nothing and needs no port."""
    if settings.url_ar or settings.port is None or (plan and not launches(plan)):
        return
    from dflash_bench.launch.identity import check_port_free

    check_port_free(settings.port)
