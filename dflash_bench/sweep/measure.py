"""The measure phase: one cell against its server (client.cell.measure), summarised, nothing written but
the cell's status; a cell that could not be measured at all fails with the reason."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from dflash_bench.client.cell import measure
from dflash_bench.client.loadgen import LoadSettings
from dflash_bench.client.protocol import RequestSettings
from dflash_bench.client.slots import check_slots
from dflash_bench.client.summary import summarize_cell
from dflash_bench.errors import UserError
from dflash_bench.store import CellPlan, CellSummary, Manifest, StoreError, SweepDir
from dflash_bench.sweep.context import SweepContext, reason
from dflash_bench.sweep.launch import Server
from dflash_bench.sweep.write import Measured, fail_cell

if TYPE_CHECKING:
    from dflash_bench.suites import Prompt


def measure_cell(ctx: SweepContext, cell: CellPlan, server: Server) -> Measured | None:
    """The cell measured on `server` and summarised (failed if the server died under it), or None when it
    could not be measured at all (it is then recorded failed)."""
    from dflash_bench import profiles

    clear_attempt(ctx.sweep, ctx.manifest, cell)
    cell.status, cell.reason = "running", None
    ctx.sweep.write_manifest(ctx.manifest)
    prompts, max_tokens = ctx.prompts(cell.suite, cell.concurrency)
    ctx.progress.start_cell(cell, total=sum(len(p.turns) for p in prompts))
    settings = ctx.settings
    thinking = settings.thinking if settings.thinking is not None else ctx.pair.thinking
    if cell.thinking_asked is not None:  # --thinking both: this cell's arm
        thinking = cell.thinking_asked
    profile = profiles.get(cell.engine)
    request = RequestSettings(api=profile.api, max_tokens=max_tokens, temperature=settings.temperature,
                              save_token_ids=settings.save_token_ids, enable_thinking=thinking,
                              tokenizer=profile.tokenizer(ctx.pair))
    load = LoadSettings(concurrency=cell.concurrency, seed=settings.seed, min_seconds=settings.min_cell_seconds,
                        steady_requests=settings.steady_requests, steady_ramp=settings.steady_ramp)
    try:
        check_slots(server.url, cell.concurrency, load.timeout)  # a builtin server's pool (client/slots.py)
        m = measure(server.url, prompts, request, load, ctx.telemetry, ctx.progress.on_request)
    except UserError as err:
        fail_cell(ctx, cell, reason(err))
        return None
    failure = None
    try:
        server.check()  # a server that died mid-cell fails the cell even if some requests got through
    except UserError as err:  # died, or another server answers now (launch/identity.py's IdentityChanged)
        failure = getattr(err, "failure", None) or f"server died: {reason(err)}"
    summary = summarize_cell(m, cell_id=cell.cell_id, engine=cell.engine, mode=cell.mode, suite=cell.suite,
                             concurrency=cell.concurrency, repeat=cell.repeat, failure=failure,
                             input_len=cell.input_len, thinking_asked=cell.thinking_asked)
    record_thinking(summary, ctx.pair.target, prompts, thinking)
    summary.server_identity = server.identity
    return Measured(summary, m)


def record_thinking(summary: CellSummary, target: str, prompts: list[Prompt], enable_thinking: bool | None) -> None:
    """Thinking as the cell's first prompt renders with the target's own template (thinking.record)."""
    from dflash_bench.thinking import record

    if not prompts:
        return
    rec = record(target, [{"role": "user", "content": prompts[0].turns[0]}], enable_thinking)
    summary.thinking, summary.thinking_evidence, summary.template_hash = rec.mode, rec.evidence, rec.template_hash


def clear_attempt(sweep: SweepDir, manifest: Manifest, cell: CellPlan) -> None:
    """A cell measured again (it failed, or a kill cut it short) starts from an empty folder, so no file of
    the earlier attempt (a failed summary, its telemetry) can mix with the new one; the manifest keeps why."""
    folder = sweep.cell_dir(cell.cell_id)
    if not folder.is_dir():
        return
    try:
        old = sweep.read_summary(cell.cell_id)
    except StoreError:  # half-written by the kill: nothing to keep
        old = None
    if old is not None and old.status == "failed":
        manifest.notes.append(f"{cell.cell_id}: measured again after a failed attempt ({old.failure_reason})")
    shutil.rmtree(folder)
