"""What a running sweep shows: cells done of total, the current cell's requests and live tok/s,
and at the end the model card's table for this hardware."""

from __future__ import annotations

import shlex
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from dflash_bench.console import new_console
from dflash_bench.store import CellPlan, CellSummary, Manifest, SweepDir, mode_name

if TYPE_CHECKING:
    import pandas as pd


class SweepProgress:
    def __init__(self, manifest: Manifest, quiet: bool = False, console: Console | None = None):
        self.manifest = manifest
        self.quiet = quiet
        self.console = console or new_console(stderr=True)
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

    def __exit__(self, *exc: Any) -> None:
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
        status = ("[green]ok[/]" if summary.status == "complete" else
                  f"[{'yellow' if summary.status == 'partial' else 'red'}]{summary.status}[/] "
                  f"{escape(summary.failure_reason or '')}")
        self.console.print(f"{escape(cell.cell_id)}: {tput}{tau}  {status}")
        if summary.dflash_warning:
            self.console.print(f"[bold red]  DFlash not in effect:[/] {escape(summary.dflash_warning)}")
        self._refresh(force=True)

    def _refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._live is not None and (force or now - self._last > 0.25):
            self._last = now
            self._live.update(self._render())

    def _render(self) -> Text:
        plan = self.manifest.plan
        finished = sum(c.status in ("complete", "partial", "failed") for c in plan)
        line = Text(f"cells {finished}/{len(plan)}", style="bold")
        if self.cell is not None:
            rate = self.tokens / self.elapsed if self.elapsed > 0 else 0.0
            line.append(f"   {self.cell.cell_id}: requests {self.done}/{self.total}   {rate:,.0f} tok/s")
        return line

    def print_table(self, sweep: SweepDir) -> None:
        """The model card's table (suite x concurrency -> AR tok/s, DFlash tok/s, speedup, tau) when AR and
        DFlash pairs are done, every finished cell otherwise (an interrupted sweep), then what failed or
        did not speculate."""
        from dflash_bench import analysis

        out = new_console()
        frame = analysis.cells(sweep.path)
        head = analysis.headline(frame) if not frame.empty else frame
        gpus = gpus_per_server(self.manifest)
        if not head.empty:
            out.print(headline_table(head, gpus))
        summaries = sweep.summaries()
        if head.empty and summaries:
            out.print(cells_table(summaries, gpus))
        if not frame.empty and (versus := versus_table(analysis.versus(frame))):
            out.print(versus)
        settings = self.manifest.settings
        if settings is not None and settings.slo:
            print_slo(out, summaries, settings.slo, gpus)
        for s in summaries:
            if s.status in ("failed", "partial"):
                colour = "red" if s.status == "failed" else "yellow"
                out.print(f"[{colour}]{s.status}[/] {escape(s.cell_id)}: {escape(s.failure_reason or '')}", highlight=False)
            if s.dflash_warning:
                out.print(f"[bold red]DFlash not in effect[/] {escape(s.cell_id)}: {escape(s.dflash_warning)}",
                          highlight=False)
        out.print(f"sweep folder: {escape(str(sweep.path))}", highlight=False)

    def print_resume(self, sweep: SweepDir) -> None:
        plan = self.manifest.plan
        done = sum(c.status in ("complete", "partial", "failed") for c in plan)
        # plain print, never wrapped: the command must survive a copy and paste
        print(f"interrupted with {done} of {len(plan)} cells finished; finish the rest with:\n"
              f"  dflash-bench sweep --resume {shlex.quote(str(sweep.path))}", flush=True)


def per_gpu(tok_s: float | None, gpus: int | None) -> str:
    return "-" if tok_s is None or tok_s != tok_s or not gpus else f"{tok_s / gpus:,.1f}"


def cells_table(summaries: list[CellSummary], gpus: int | None = None) -> Table:
    """Every finished cell on its own: what an interrupted sweep has so far (tok/s per GPU too, for servers of
    several GPUs)."""
    shard = gpus is not None and gpus > 1
    table = Table(title="finished cells (output tokens/s" + (f"; {gpus} GPUs per server)" if shard else ")"))
    for col in ("cell", "status", "tok/s") + (("tok/s per GPU",) if shard else ()) + ("τ",):
        table.add_column(col, justify="left" if col in ("cell", "status") else "right")
    for s in summaries:
        tput = "-" if s.output_throughput is None else f"{s.output_throughput:,.1f}"
        tau = "-" if s.acceptance_length is None else f"{s.acceptance_length:.2f}"
        status = s.status if not s.dflash_warning else f"{s.status}, NO SPECULATION"
        table.add_row(escape(s.cell_id), escape(status), tput, *([per_gpu(s.output_throughput, gpus)] if shard else []), tau)
    return table


def speedup_text(row: pd.Series) -> str:
    """'2.41x', and with repeats their median and lowest-highest: '2.41x (2.30-2.55)'."""
    text = f"{row['speedup']:.2f}x"
    if int(row.get("repeats", 1) or 1) > 1 and row.get("speedup_min") == row.get("speedup_min"):
        text += f" ({row['speedup_min']:.2f}-{row['speedup_max']:.2f})"
    return text


def headline_table(head: pd.DataFrame, gpus: int | None = None) -> Table:
    """analysis.headline's rows: AR against each speculative mode (a `mode` column where a mode other than DFlash ran)."""
    most = int(head["repeats"].max()) if "repeats" in head.columns and not head.empty else 1
    shard = gpus is not None and gpus > 1
    modes = list(head["mode"]) if "mode" in head.columns else ["dflash"] * len(head)
    many = set(modes) != {"dflash"}
    spec = "speculative" if many else mode_name("dflash")
    title = f"AR vs {spec} (output tokens/s" + (f"; {gpus} GPUs per server" if shard else "") + (
        f"; speedup over {most} repeats: median (lowest-highest))" if most > 1 else ")")
    table = Table(title=title)
    extra = ("AR tok/s per GPU", f"{spec} tok/s per GPU") if shard else ()
    for col in ("engine", *(("mode",) if many else ()), "suite", "concurrency", "AR tok/s", f"{spec} tok/s", *extra,
                "speedup", "τ"):
        table.add_column(col, justify="right" if col not in ("engine", "mode", "suite") else "left")
    for mode, (_, r) in zip(modes, head.iterrows()):
        tau = "-" if r["tau"] != r["tau"] or r["tau"] is None else f"{r['tau']:.2f}"
        if tau == "-" or r["tau"] < 1.05:  # the speculative server showed no sign of speculating
            tau = f"[bold red]{tau} (no speculation)[/]"
        shares = [per_gpu(r["ar_tok_s"], gpus), per_gpu(r["spec_tok_s"], gpus)] if shard else []
        table.add_row(escape(str(r["engine"])), *((mode_name(mode),) if many else ()), escape(str(r["suite"])),
                      str(r["concurrency"]), f"{r['ar_tok_s']:,.1f}", f"{r['spec_tok_s']:,.1f}", *shares,
                      speedup_text(r), tau)
    return table


def versus_table(versus: pd.DataFrame) -> Table | None:
    """DFlash against each other speculative mode (analysis.versus) where a sweep ran both (--modes ...,dflash,eagle3):
    their tok/s (repeats averaged), the ratio (the median of the repeats' ratios) and each one's tau; None where it
    ran none."""
    if versus.empty:
        return None
    most = int(versus["repeats"].max())
    others = list(dict.fromkeys(versus["mode"]))
    name = mode_name(others[0]) if len(others) == 1 else "the other"
    table = Table(title=f"DFlash vs {' / '.join(mode_name(m) for m in others)} (output tokens/s; ratio: DFlash / "
                  f"{name}" + (f", over {most} repeats: median (lowest-highest))" if most > 1 else ")"))
    cols = ("engine", "suite", "concurrency", "DFlash tok/s", *(("mode",) if len(others) > 1 else ()), f"{name} tok/s",
            "ratio", "τ DFlash", f"τ {name}")
    for col in cols:
        table.add_column(col, justify="right" if col not in ("engine", "suite", "mode") else "left")
    for r in versus.to_dict("records"):
        ratio = f"{r['ratio']:.2f}x" + (f" ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})" if r["repeats"] > 1 else "")
        table.add_row(escape(str(r["engine"])), escape(str(r["suite"])), str(r["concurrency"]), f"{r['dflash_tok_s']:,.1f}",
                      *((mode_name(r["mode"]),) if len(others) > 1 else ()), f"{r['other_tok_s']:,.1f}",
                      ratio, _tau(r["dflash_tau"]), _tau(r["other_tau"]))
    return table


def _tau(v: float | None) -> str:
    return "-" if v is None or v != v else f"{v:.2f}"


def gpus_per_server(manifest: Manifest) -> int | None:
    """GPUs one server used (the report's reading of the manifest), None when nothing says."""
    from dflash_bench.report.views import gpu_count

    return gpu_count(manifest.hardware, manifest.settings, manifest.servers)


def print_slo(out: Console, summaries: list[CellSummary], slo_text: str, gpus: int | None) -> None:
    """The serving team's answer per engine and suite: throughput per GPU at the --slo target, both sides."""
    from dflash_bench.slo import parse_slo, read_sweep

    groups = read_sweep(summaries, parse_slo(slo_text), gpus)
    if not groups:
        out.print("--slo: no engine and suite has both AR and DFlash cells complete to read off", highlight=False)
    for g in groups:  # one line each, never wrapped: it is the answer people copy
        out.print(f"[bold]{escape(g.label)}[/]: {escape(g.result.headline)}", highlight=False, soft_wrap=True)
