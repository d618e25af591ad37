"""A sweep's folder: made new (its manifest, the plan, provenance) or opened to resume, and closed at the end.

The writer's lock is taken before anything is written (`store.lock`); the cells' status is read back from disk,
where summary.json is the truth. `run.py` owns the order of work between opening and closing.
"""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from dflash_bench.errors import UserError
from dflash_bench.store import CellPlan, Hardware, Manifest, Models, SweepDir, now_iso
from dflash_bench.store.lock import WriterLock, create_locked, open_locked
from dflash_bench.store import provenance
from dflash_bench.sweep.plan import SweepSettings, check_resume, plan_cells

if TYPE_CHECKING:
    from dflash_bench.models import ModelPair


class Outcome(Protocol):
    """What `close_sweep` reads of a run's result (`context.SweepResult`)."""

    interrupted: bool
    failed: list[str]


def open_sweep(settings: SweepSettings, out: Path, resume: Path | None, pair: ModelPair,
               argv: list[str]) -> tuple[SweepDir, Manifest, WriterLock]:
    """The sweep folder (new, or the one to resume) and its writer's lock, held by this process."""
    if resume is not None:
        sweep, lock = open_locked(resume)  # before anything is read for writing: a second resume is refused here
        try:
            manifest = _resumable(sweep, settings, resume)
        except BaseException:
            lock.release()
            raise
        planned = {c.cell_id for c in manifest.plan}
        for stray, why in sweep.strays(planned):  # a link, a copy: not a cell of this folder; every reader refuses it
            note(manifest, f"{stray}: set aside ({why}; its files are kept in {sweep.set_aside(stray)})")
        for stray in sorted(set(sweep.cell_names()) - planned):
            damaged = sweep.damage(stray)  # a cell of no plan that every reader trips on: set aside, not measured
            if damaged:
                note(manifest, f"{stray}: set aside (not in the plan): {damaged} (its files are kept in "
                               f"{sweep.set_aside(stray)})")
        for cell in manifest.plan:  # whatever was running when it stopped is redone; failed cells get a new try
            damaged = sweep.damage(cell.cell_id)
            if damaged:  # a cell whose files do not read back whole is measured again, and the resume says so
                kept = sweep.set_aside(cell.cell_id)
                note(manifest, f"{cell.cell_id}: measured again: {damaged} (its files are kept in {kept})")
                cell.status, cell.reason = "pending", None
                continue
            status_from_disk(sweep, cell)
        manifest.status = "running"
        manifest.notes.append(f"resumed {now_iso()} by: {' '.join(provenance.redact(argv))}")
        sweep.write_manifest(manifest)
        return sweep, manifest, lock
    sweep_id = sweep_id_of(pair.name, settings.engines)
    manifest = Manifest(  # every setting is saved, the resume-free ones too: a resume takes them back
        sweep_id=sweep_id, command_line=provenance.redact(argv), settings=saved_settings(settings),
        plan=plan_cells(settings), versions=provenance.versions(), hardware=Hardware(host=provenance.host()),
        models=Models(target=provenance.model_revision(pair.target),
                      drafter=provenance.model_revision(pair.drafter) if pair.drafter else None,
                      block_size=pair.block_size,
                      thinking=settings.thinking if settings.thinking is not None else pair.thinking),
    )
    # locked before the manifest is written: of two sweeps started in the same second, one gets the folder
    sweep, lock = create_locked(Path(out) / sweep_id, manifest)
    return sweep, manifest, lock


def saved_settings(settings: SweepSettings) -> SweepSettings:
    """What the manifest keeps of the settings: all of them, but a password in a --url-* is never written
    (a resume then needs that --url-* given again)."""
    from urllib.parse import urlsplit, urlunsplit

    masked = {}
    for key in ("url_ar", "url_dflash"):
        u = urlsplit(getattr(settings, key) or "")
        if u.password:
            masked[key] = urlunsplit(u._replace(netloc=f"{u.username}:***@{u.hostname}" + (f":{u.port}" if u.port else "")))
    return settings.model_copy(update=masked)


def _resumable(sweep: SweepDir, settings: SweepSettings, resume: Path) -> Manifest:
    """The manifest of a sweep this command may finish; a UserError that says what is wrong otherwise."""
    manifest = sweep.read_manifest()
    check_has_plan(manifest, resume)
    check_resume(manifest.settings, settings)
    planned = [c.cell_id for c in plan_cells(settings)]
    if planned != [c.cell_id for c in manifest.plan]:
        missing = sorted(set(planned) ^ {c.cell_id for c in manifest.plan})
        raise UserError(f"cannot resume {resume}: its plan differs from this command's (cells in one but not the "
                        f"other: {', '.join(missing[:3]) or 'the same cells in another order'})")
    manifest.settings = saved_settings(settings)  # what may change on resume (runner, port, URLs, --slo) does
    return manifest


def check_has_plan(manifest: Manifest, folder: Path) -> SweepSettings:
    """A folder `sweep --resume` can finish: a plan of cells and the settings that made it (returned)."""
    if not manifest.plan:
        raise UserError(f"cannot resume {folder}: its manifest has no plan of cells (a sweep stopped before it "
                        "planned, or an edited manifest); start a new sweep instead")
    if manifest.settings is None:
        raise UserError(f"cannot resume {folder}: it was written by `dflash-bench run`, not by a sweep (its manifest "
                        "has no sweep settings); add cells to it with `dflash-bench run --name`, or start a new sweep")
    return manifest.settings


def note(manifest: Manifest, text: str) -> None:
    """What a resume did to the folder, kept in the manifest and said on stderr."""
    manifest.notes.append(text)
    print(f"note: {text}", file=sys.stderr, flush=True)


def status_from_disk(sweep: SweepDir, cell: CellPlan) -> None:
    """summary.json is the truth: a kill can land after a cell wrote it and before the manifest said so.

    A cell with a summary keeps its status (complete, or failed and tried again); one without is pending."""
    summary = sweep.read_summary(cell.cell_id)
    cell.status, cell.reason = (summary.status, summary.failure_reason) if summary else ("pending", None)


def close_sweep(sweep: SweepDir, manifest: Manifest, result: Outcome) -> None:
    for cell in manifest.plan:
        if cell.status == "running":
            status_from_disk(sweep, cell)
    pending = [c for c in manifest.plan if c.status == "pending"]
    manifest.status = ("interrupted" if result.interrupted or pending else "failed" if result.failed
                       else "partial" if any(c.status == "partial" for c in manifest.plan) else "complete")
    sweep.write_manifest(manifest)
    sweep.write_results_csv()


def stop_leftovers(sweep_id: str) -> None:
    """Servers a killed run of this sweep left behind still hold ports and GPU memory: stop them first."""
    from dflash_bench.launch import docker, local_process as process

    process.stop_leftovers()  # process servers whose harness is gone
    try:
        docker.stop_leftovers(False, sweep_id)
    except UserError:
        pass  # no docker daemon: no containers to stop


def sweep_id_of(model: str, engines: list[str]) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    safe = "".join(ch if ch.isalnum() or ch in "-._" else "_" for ch in model)
    return f"{stamp}-{safe}-{'+'.join(engines)}"
