"""The write phase: a measured cell, or a failed one, lands in the sweep folder and the manifest says so."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dflash_bench.client.cell import Measurement
from dflash_bench.client.summary import summarize_records, write_cell
from dflash_bench.store import CellPlan, CellSummary, Manifest, SweepDir, SweepSettings
from dflash_bench.sweep.context import SweepContext, SweepResult


class Ledger(Protocol):
    """What a failed cell is recorded in: the folder, its manifest, the run's result (a SweepContext, or the
    Slurm submitter settling an earlier run's jobs before it has one)."""

    sweep: SweepDir
    manifest: Manifest
    result: SweepResult


@dataclass
class Measured:
    """A cell's measurement and its summary (failed when the server died under it), not yet written."""

    summary: CellSummary
    measurement: Measurement


def write_measured(ctx: SweepContext, cell: CellPlan, measured: Measured) -> None:
    """What was measured is kept and counted, failed or not; summary.json last, then the manifest and results.csv."""
    summary = measured.summary
    record_synthetic(summary, cell)
    write_cell(ctx.sweep, summary, measured.measurement)
    cell.status, cell.reason = summary.status, summary.failure_reason
    if summary.status == "failed":
        ctx.result.failed.append(cell.cell_id)
    ctx.sweep.write_manifest(ctx.manifest)
    ctx.sweep.write_results_csv()
    ctx.progress.end_cell(cell, summary)


def fail_cell(ctx: Ledger, cell: CellPlan, reason: str) -> None:
    """Record a failed cell (with its reason) as a summary, so it is done and visible everywhere; whatever
    requests.jsonl the attempt left is counted in it."""
    sweep, manifest = ctx.sweep, ctx.manifest
    summary = summarize_records(sweep.read_requests(cell.cell_id), cell_id=cell.cell_id, engine=cell.engine,
                                mode=cell.mode, suite=cell.suite, concurrency=cell.concurrency, repeat=cell.repeat,
                                failure=reason, input_len=cell.input_len, thinking_asked=cell.thinking_asked)
    record_synthetic(summary, cell)
    cell.status, cell.reason = "failed", summary.failure_reason
    sweep.write_summary(summary)
    sweep.write_manifest(manifest)
    sweep.write_results_csv()
    ctx.result.failed.append(cell.cell_id)


def record_synthetic(summary: CellSummary, cell: CellPlan) -> None:
    """The acceptance profile the cell's server was given to draw (--synthetic-acceptance), whatever its engine:
    its tau, rates and source on the cell, beside what the server reported."""
    drawn = cell.synthetic
    if drawn is not None:
        summary.synthetic_acceptance = drawn.tau
        summary.synthetic_rates, summary.synthetic_source = list(drawn.rates), drawn.source


def annotate_quality(sweep: SweepDir, settings: SweepSettings) -> None:
    """The token-level lossless check, where token ids were saved."""
    if not settings.save_token_ids:
        return
    from dflash_bench.quality.lossless import annotate_sweep

    annotate_sweep(sweep.path)
