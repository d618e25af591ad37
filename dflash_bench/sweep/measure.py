"""The measure phase: one cell against its server (client.cell.measure), or with --interleave the two modes of a
concurrency-1 cell together (client/interleave.py), summarised, nothing written but the cell's status; a cell
that could not be measured at all fails with the reason."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from dflash_bench.client import interleave
from dflash_bench.client.cell import Measurement, measure
from dflash_bench.client.loadgen import LoadSettings
from dflash_bench.client.protocol import RequestSettings
from dflash_bench.client.server_cache import empty_prefix_cache
from dflash_bench.client.server_slots import check_slots
from dflash_bench.client.summary import summarize_cell
from dflash_bench.errors import UserError
from dflash_bench.report.card import weights_of
from dflash_bench.store import CellPlan, CellSummary, Manifest, StoreError, SweepDir
from dflash_bench.sweep.context import SweepContext, reason
from dflash_bench.sweep.launch import Server
from dflash_bench.sweep.write import Measured, fail_cell

if TYPE_CHECKING:
    from dflash_bench.suites import Prompt


def measure_cell(ctx: SweepContext, cell: CellPlan, server: Server) -> Measured | None:
    """The cell measured on `server` and summarised (failed if the server died under it), or None when it
    could not be measured at all (it is then recorded failed)."""
    prompts, max_tokens = begin(ctx, cell)
    ctx.progress.start_cell(cell, total=sum(len(p.turns) for p in prompts))
    request, load = request_and_load(ctx, cell, max_tokens)
    try:
        check_slots(server.url, cell.concurrency, load.timeout)  # a builtin server's pool (client/server_slots.py)
        emptied = empty_cache(cell, server, load.timeout)
        m = measure(server.url, prompts, request, load, ctx.telemetry, ctx.progress.on_request)
    except UserError as err:
        fail_cell(ctx, cell, reason(err))
        return None
    measured = summarise(ctx, cell, server, m, prompts, request.enable_thinking)
    measured.summary.prefix_cache_reset = emptied
    return measured


def empty_cache(cell: CellPlan, server: Server, timeout: float | None) -> str | None:
    """The prefix cache of a server the sweep launched emptied before the cell, where its engine keeps one
    (client/server_cache.py); what came of it, or None where nothing was to be done (a user's own server is left
    as it is)."""
    from dflash_bench import profiles

    profile = profiles.get(cell.engine)
    if profile.cache_reset is None or server.info.runner == "external":
        return None
    return empty_prefix_cache(server.url, profile.cache_reset, timeout, profile.cache_left(server.info.command))


def interleaves(ctx: SweepContext, a: CellPlan, b: CellPlan) -> bool:
    """Whether `a` and `b` are measured together (--interleave): the two modes of one concurrency-1 cell key."""
    same = (a.engine, a.suite, a.concurrency, a.repeat, a.input_len, a.thinking_asked) == \
        (b.engine, b.suite, b.concurrency, b.repeat, b.input_len, b.thinking_asked)
    return ctx.settings.interleave and same and a.mode != b.mode and a.concurrency == 1


def measure_pair(ctx: SweepContext, first: tuple[CellPlan, Server], second: tuple[CellPlan, Server]
                 ) -> list[tuple[CellPlan, Measured]]:
    """Two cells of one key measured together, request by request (client/interleave.py), each summarised;
    both fail with the reason when they could not be measured at all."""
    cells = (first[0], second[0])
    prompts, max_tokens = begin(ctx, cells[0])
    begin(ctx, cells[1])  # the same suite and concurrency: the same prompts
    ctx.progress.start_cell(cells[0], total=2 * sum(len(p.turns) for p in prompts))
    (req_a, load), (req_b, _) = (request_and_load(ctx, cell, max_tokens) for cell in cells)
    try:
        for _, server in (first, second):
            check_slots(server.url, 1, load.timeout)
        emptied = [empty_cache(cell, server, load.timeout) for cell, server in (first, second)]
        ms = interleave.measure_pair((first[1].url, second[1].url), prompts, (req_a, req_b), load,
                                     ctx.progress.on_request)
    except UserError as err:
        for cell in cells:
            fail_cell(ctx, cell, reason(err))
        return []
    out = []
    for (cell, server), m, done in zip((first, second), ms, emptied):
        measured = summarise(ctx, cell, server, m, prompts, req_a.enable_thinking)
        measured.summary.prefix_cache_reset = done
        out.append((cell, measured))
    return out


def begin(ctx: SweepContext, cell: CellPlan) -> tuple[list[Prompt], int]:
    """The cell marked running (anything of an earlier attempt cleared); its prompts and max_tokens."""
    clear_attempt(ctx.sweep, ctx.manifest, cell)
    cell.status, cell.reason = "running", None
    ctx.sweep.write_manifest(ctx.manifest)
    return ctx.prompts(cell.suite, cell.concurrency)


def request_and_load(ctx: SweepContext, cell: CellPlan, max_tokens: int) -> tuple[RequestSettings, LoadSettings]:
    """What each of the cell's requests asks and how they are sent."""
    from dflash_bench import profiles

    settings = ctx.settings
    thinking = settings.thinking if settings.thinking is not None else ctx.pair.thinking
    if cell.thinking_asked is not None:  # --thinking both: this cell's arm
        thinking = cell.thinking_asked
    api, tokenizer = profiles.get(cell.engine).request_api(ctx.pair, settings.api)
    request = RequestSettings(api=api, max_tokens=max_tokens, temperature=settings.temperature,
                              save_token_ids=settings.save_token_ids, enable_thinking=thinking, tokenizer=tokenizer)
    blank = weights_of(settings.engine_args, cell.engine) == "random"  # every engine's later turns alike
    load = LoadSettings(concurrency=cell.concurrency, seed=settings.seed, min_seconds=settings.min_cell_seconds,
                        steady_requests=settings.steady_requests, steady_ramp=settings.steady_ramp,
                        history="blank" if blank else "answers")
    return request, load


def summarise(ctx: SweepContext, cell: CellPlan, server: Server, m: Measurement, prompts: list[Prompt],
              thinking: bool | None) -> Measured:
    """The measured cell summarised: failed if its server died under it or another answers in its place."""
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
