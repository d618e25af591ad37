"""What a running sweep shows: cells done of total, the current cell's requests and live tok/s,
and at the end the model card's table for this hardware."""

from __future__ import annotations

import time

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from dflash_bench.store import CellPlan, CellSummary, Manifest, SweepDir


class SweepProgress:
    def __init__(self, manifest: Manifest, quiet: bool = False, console: Console | None = None):
        self.manifest = manifest
        self.quiet = quiet
        self.console = console or Console(stderr=True)
        self.cell: CellPlan | None = None
        self.done = self.total = self.tokens = 0
        self.elapsed = 0.0
        self._live: Live | None = None
        self._last = 0.0

    def __enter__(self) -> "SweepProgress":
        if not self.quiet:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def note(self, message: str) -> None:
        if not self.quiet:
            self.console.print(Text(message, style="yellow"))

    def start_cell(self, cell: CellPlan, total: int) -> None:
        self.cell, self.done, self.total, self.tokens, self.elapsed = cell, 0, total, 0, 0.0
        self._refresh(force=True)

    def on_request(self, done: int, total: int, tokens: int, elapsed: float) -> None:
        self.done, self.total, self.tokens, self.elapsed = done, total, tokens, elapsed
        self._refresh()

    def end_cell(self, cell: CellPlan, summary: CellSummary) -> None:
        if self.quiet:
            return
        tau = f"  τ {summary.acceptance_length:.2f}" if summary.acceptance_length else ""
        tput = f"{summary.output_throughput:,.1f} tok/s" if summary.output_throughput else "-"
        status = "[green]ok[/]" if summary.status == "complete" else f"[red]failed[/] {escape(summary.failure_reason or '')}"
        self.console.print(f"{escape(cell.cell_id)}: {tput}{tau}  {status}")
        self._refresh(force=True)

    def _refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._live is not None and (force or now - self._last > 0.25):
            self._last = now
            self._live.update(self._render())

    def _render(self) -> Text:
        plan = self.manifest.plan
        finished = sum(c.status in ("complete", "failed") for c in plan)
        line = Text(f"cells {finished}/{len(plan)}", style="bold")
        if self.cell is not None:
            rate = self.tokens / self.elapsed if self.elapsed > 0 else 0.0
            line.append(f"   {self.cell.cell_id}: requests {self.done}/{self.total}   {rate:,.0f} tok/s")
        return line

    def print_table(self, sweep: SweepDir) -> None:
        """The model card's table: suite x concurrency -> AR tok/s, DFlash tok/s, speedup, tau."""
        from dflash_bench import analysis

        frame = analysis.cells(sweep.path)
        table = headline_table(analysis.headline(frame))
        out = Console()
        out.print(table)
        failed = frame[frame["status"] == "failed"] if not frame.empty else frame
        for _, row in failed.iterrows():
            out.print(f"[red]failed[/] {escape(str(row['cell_id']))}: {escape(str(row.get('failure_reason') or ''))}")
        out.print(f"sweep folder: {escape(str(sweep.path))}")


def headline_table(head) -> Table:
    table = Table(title="AR vs DFlash (output tokens/s)")
    for col in ("engine", "suite", "concurrency", "AR tok/s", "DFlash tok/s", "speedup", "τ"):
        table.add_column(col, justify="right" if col not in ("engine", "suite") else "left")
    for _, r in head.iterrows():
        tau = "-" if r["tau"] != r["tau"] or r["tau"] is None else f"{r['tau']:.2f}"
        table.add_row(escape(str(r["engine"])), escape(str(r["suite"])), str(r["concurrency"]), f"{r['ar_tok_s']:,.1f}",
                      f"{r['dflash_tok_s']:,.1f}", f"{r['speedup']:.2f}x", tau)
    return table
