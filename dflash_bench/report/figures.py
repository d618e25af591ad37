"""The report's figures (matplotlib, Agg backend), one function per figure; each returns a figure or None when the
sweep has nothing to draw for it, and render_all the PNGs. What keeps them readable however many cells (bounded
grids, folded legends, spread ticks, placed point labels) lives in plotting.py.

Colours: AR blue, DFlash orange, EAGLE-3 green, everywhere. Engines of one sweep differ by marker and line style.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import matplotlib.pyplot as plt
import pandas as pd

from dflash_bench import analysis
from dflash_bench.report.plotting import (MAX_LEGEND, MAX_POINT_LABELS, conc_axis, grid, legend, panel_size,
                                          place_labels, png, spread)
from dflash_bench.report.views import SweepView
from dflash_bench.store import SPECULATIVE, mode_name

COLORS = {"ar": "#1f77b4", "dflash": "#ff7f0e", "eagle3": "#2ca02c"}
MARKERS = ["o", "s", "^", "D", "v"]
STYLES = ["-", "--", ":", "-."]


def render_all(view: SweepView) -> dict[str, bytes]:
    """Every figure the sweep has data for, by name (the PNG's stem), in page order."""
    out: dict[str, bytes] = {}
    for name, fn in FIGURES.items():
        fig = fn(view)
        if fig is not None:
            out[name] = png(fig)
    return out


def _engines(view: SweepView) -> list[str]:
    return sorted(set(view.done["engine"])) if not view.done.empty else []


def _style(view: SweepView, engine: str, mode: str) -> dict[str, Any]:
    i = _engines(view).index(engine)
    return {"color": COLORS.get(mode, "grey"), "marker": MARKERS[i % len(MARKERS)], "linestyle": STYLES[i % len(STYLES)]}


def _series_label(view: SweepView, engine: str, mode: str) -> str:
    name = mode_name(mode)
    return f"{engine} {name}" if len(_engines(view)) > 1 else name


def _speculative(view: SweepView) -> pd.DataFrame:
    """The sweep's cells of the speculative modes (SPECULATIVE: DFlash, EAGLE-3), repeats averaged."""
    return view.done[view.done["mode"].isin(SPECULATIVE)] if not view.done.empty else view.done


def _spec_style(view: SweepView, data: pd.DataFrame, engine: str, mode: str) -> dict[str, Any]:
    """A speculative series where colour means the suite: the engine's marker; each mode past the first its own
    line style, so DFlash's line and EAGLE-3's never read as one."""
    st = _style(view, engine, mode)
    modes = [m for m in SPECULATIVE if m in set(data["mode"])]
    if len(modes) > 1:
        st["linestyle"] = STYLES[modes.index(mode) % len(STYLES)] if mode in modes else ":"
    return st


def _spec_label(view: SweepView, data: pd.DataFrame, suite: str, engine: str, mode: str) -> str:
    """`suite`, with the engine where the sweep ran several and the mode where it ran several speculative ones."""
    extra = [engine] if len(_engines(view)) > 1 else []
    extra += [mode_name(mode)] if data["mode"].nunique() > 1 else []
    return f"{suite} ({', '.join(extra)})" if extra else suite


def _valid(frame: pd.DataFrame, *cols: str) -> pd.DataFrame:
    if frame.empty or any(c not in frame.columns for c in cols):
        return frame.iloc[0:0]
    return frame.dropna(subset=list(cols))


# ------------------------------------------------------------------ Pareto


def frontier(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points no other point beats on both axes (more is better on both), sorted by x."""
    best: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if not best or y > best[-1][1]:
            best.append((x, y))
    return sorted(best)


def pareto(view: SweepView, x: str = "tok_s_user_p50", xlabel: str = "interactivity, tok/s/user (p50)") -> plt.Figure | None:
    data = _valid(view.done, "output_throughput", x)
    if data.empty:
        return None
    per = view.gpus or 1
    suites = view.ordered(data["suite"])
    fig, axes = grid(len(suites))
    labels: list[tuple[Any, float, float, str, str]] = []
    for ax, suite in zip(axes, suites):
        series = max(1, data[data["suite"] == suite].groupby(["engine", "mode"]).ngroups)
        for (engine, mode), g in data[data["suite"] == suite].groupby(["engine", "mode"]):
            st = _style(view, engine, mode)
            xs, ys = g[x].to_numpy(float), g["output_throughput"].to_numpy(float) / per
            ax.scatter(xs, ys, color=st["color"], marker=st["marker"], zorder=3, label=_series_label(view, engine, mode))
            concs = sorted({int(c) for c in g["concurrency"]})
            named = {concs[i] for i in spread(len(concs), max(2, MAX_POINT_LABELS // series))}
            labels += [(ax, px, py, f"c{int(c)}", st["color"]) for px, py, c in zip(xs, ys, g["concurrency"])
                       if int(c) in named]  # a crowded panel names a spread of its points, not every one
            front = frontier(list(zip(xs, ys)))
            ax.plot([p[0] for p in front], [p[1] for p in front], color=st["color"], linestyle=st["linestyle"], alpha=0.8)
        ax.set_title(suite)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"output throughput, {view.throughput_unit}")
        ax.grid(alpha=0.3)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
    legend(axes[0], fontsize=8)
    fig.tight_layout()
    place_labels(fig, labels)
    return fig


def pareto_p90(view: SweepView) -> plt.Figure | None:
    """The same at the tail: 1000 / TPOT p90, the interactivity that 90% of requests get or beat."""
    return pareto(view, "tok_s_user_at_tpot_p90", "interactivity at p90 TPOT, tok/s/user (1000 / TPOT p90)")


# ------------------------------------------------------------------ acceptance


def acceptance(view: SweepView) -> plt.Figure | None:
    data = _valid(_speculative(view), "acceptance_length")
    if data.empty:
        return None
    suites = view.ordered(data["suite"])
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    cmap = plt.get_cmap("Dark2")  # not blue/orange/green: those mean AR/DFlash/EAGLE-3 everywhere else
    for i, suite in enumerate(suites):
        for (engine, mode), g in data[data["suite"] == suite].groupby(["engine", "mode"]):
            g = g.sort_values("concurrency")
            st = _spec_style(view, data, engine, mode)
            label = _spec_label(view, data, suite, engine, mode)
            ax.plot(g["concurrency"], g["acceptance_length"], color=cmap(i % 8), marker=st["marker"], linestyle=st["linestyle"], label=label)
            for col, mk in (("acceptance_length_req_weighted", "x"), ("acceptance_length_token_weighted", "+")):
                if col in g.columns and g[col].notna().any():
                    ax.scatter(g["concurrency"], g[col], color=cmap(i % 8), marker=mk, s=40, zorder=3)
    conc_axis(ax, sorted(int(c) for c in set(data["concurrency"])))
    ax.set_xlabel("concurrency")
    ax.set_ylabel("acceptance length τ (tokens per verify step)")
    ax.set_ylim(bottom=1)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    handles += [plt.Line2D([], [], color="grey", marker="x", linestyle=""), plt.Line2D([], [], color="grey", marker="+", linestyle="")]
    labels += ["request-weighted", "token-weighted"]
    legend(ax, handles, labels, keys=2, fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def positions(view: SweepView) -> plt.Figure | None:
    data = _speculative(view)
    if data.empty or "positions" not in data.columns:
        return None
    data = data[data["positions"].apply(lambda v: isinstance(v, list) and len(v) > 0)]
    if data.empty:
        return None
    suites = view.ordered(data["suite"])
    fig, axes = grid(len(suites), height=3.0)
    cmap = plt.get_cmap("viridis")
    concs = sorted(int(c) for c in set(data["concurrency"]))
    for ax, suite in zip(axes, suites):
        mine = data[data["suite"] == suite]
        measured = sorted({int(c) for c in mine["concurrency"]})  # a line per concurrency: at most MAX_LEGEND a panel
        series = max(len(mine.groupby(["engine", "mode"])), 1)
        keep = {measured[i] for i in spread(len(measured), max(1, MAX_LEGEND // series))}
        for _, row in mine[mine["concurrency"].isin(keep)].sort_values("concurrency").iterrows():
            pos = row["positions"]
            reach = row.get("verified_positions")
            if reach is not None and reach == reach:  # positions no draft verified (a narrower verify) are not drawn
                pos = pos[:int(reach)]
            if not pos:
                continue
            shade = cmap(concs.index(int(row["concurrency"])) / max(len(concs) - 1, 1) * 0.85)
            st = _spec_style(view, data, row["engine"], row["mode"])
            label = f"c{int(row['concurrency'])}" + (f" {row['engine']}" if len(_engines(view)) > 1 else "") + (
                f" {mode_name(row['mode'])}" if data["mode"].nunique() > 1 else "")
            ax.plot(range(1, len(pos) + 1), pos, color=shade, marker=".", linestyle=st["linestyle"], label=label)
        ax.set_title(suite)
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance rate")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        legend(ax, fontsize=7)
    fig.tight_layout()
    return fig


def verify_width(view: SweepView) -> plt.Figure | None:
    """Tokens verified per row and step against concurrency: the block size for an engine that always checks
    the whole block (vLLM), less where the engine narrows the verify under load (the builtin fast path)."""
    data = _speculative(view)
    data = _valid(data, "verify_width") if "verify_width" in data.columns else data.iloc[0:0]
    if data.empty:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    cmap = plt.get_cmap("Dark2")
    for i, suite in enumerate(view.ordered(data["suite"])):
        for (engine, mode), g in data[data["suite"] == suite].groupby(["engine", "mode"]):
            g = g.sort_values("concurrency")
            st = _spec_style(view, data, engine, mode)
            label = _spec_label(view, data, suite, engine, mode)
            ax.plot(g["concurrency"], g["verify_width"], color=cmap(i % 8), marker=st["marker"],
                    linestyle=st["linestyle"], label=label)
    conc_axis(ax, sorted(int(c) for c in set(data["concurrency"])))
    ax.set_xlabel("concurrency")
    ax.set_ylabel("tokens verified per row and step")
    ax.set_ylim(bottom=1)
    ax.grid(alpha=0.3)
    legend(ax, fontsize=8, loc="best")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ latency and energy


def _modes_vs_concurrency(view: SweepView, rows: list[tuple[str, str]], ylabel: Callable[[str], str]) -> plt.Figure | None:
    """Per metric prefix a block of subplots, one per suite (at most 4 a row): p50 line, p50..p90 band, p99 dotted."""
    rows = [(m, title) for m, title in rows if not _valid(view.done, f"{m}_p50").empty]
    if not rows:
        return None
    suites = view.ordered(view.done["suite"])
    ncols = min(len(suites), 4)
    per_block = math.ceil(len(suites) / ncols)
    w, h = panel_size(per_block * len(rows), ncols, 3.8, 3.0)
    fig, panels = plt.subplots(per_block * len(rows), ncols, figsize=(w * ncols, h * per_block * len(rows)), squeeze=False)
    flat = list(panels.flat)
    for ax in flat:
        ax.set_visible(False)
    for r, (metric, title) in enumerate(rows):
        for i, suite in enumerate(suites):
            ax = flat[r * per_block * ncols + i]
            ax.set_visible(True)
            sub = _valid(view.done[view.done["suite"] == suite], f"{metric}_p50")
            for (engine, mode), g in sub.groupby(["engine", "mode"]):
                g = g.sort_values("concurrency")
                st = _style(view, engine, mode)
                x = g["concurrency"].to_numpy(float)
                ax.plot(x, g[f"{metric}_p50"], color=st["color"], marker=st["marker"], linestyle=st["linestyle"],
                        label=f"{_series_label(view, engine, mode)} p50")
                if f"{metric}_p90" in g.columns and g[f"{metric}_p90"].notna().all():
                    ax.fill_between(x, g[f"{metric}_p50"], g[f"{metric}_p90"], color=st["color"], alpha=0.15)
                if f"{metric}_p99" in g.columns and g[f"{metric}_p99"].notna().all():
                    ax.plot(x, g[f"{metric}_p99"], color=st["color"], linestyle=":", linewidth=1)
            conc_axis(ax, sorted(int(v) for v in set(view.done["concurrency"])))
            ax.set_title(f"{suite}: {title}", fontsize=10)
            ax.set_xlabel("concurrency")
            ax.set_ylabel(ylabel(metric))
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
    handles, labels = flat[0].get_legend_handles_labels()
    handles += [plt.Rectangle((0, 0), 1, 1, color="grey", alpha=0.2), plt.Line2D([], [], color="grey", linestyle=":")]
    labels += ["p50–p90", "p99"]
    legend(flat[0], handles, labels, keys=2, fontsize=7)
    fig.tight_layout()
    return fig


def latency(view: SweepView) -> plt.Figure | None:
    return _modes_vs_concurrency(view, [("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")], lambda m: "ms")


def energy(view: SweepView) -> plt.Figure | None:
    data = _valid(view.done, "j_per_token")
    if "energy_valid" in data.columns:  # a window too short for its source has no energy per token
        data = data[data["energy_valid"].map(lambda v: v is not False and v not in ("False", "false"))]
    if data.empty:
        return None
    suites = view.ordered(data["suite"])
    fig, axes = grid(len(suites), height=3.0)
    for ax, suite in zip(axes, suites):
        for (engine, mode), g in data[data["suite"] == suite].groupby(["engine", "mode"]):
            g = g.sort_values("concurrency")
            st = _style(view, engine, mode)
            ax.plot(g["concurrency"], g["j_per_token"], color=st["color"], marker=st["marker"], linestyle=st["linestyle"],
                    label=_series_label(view, engine, mode))
        conc_axis(ax, sorted(int(c) for c in set(data["concurrency"])))
        ax.set_title(suite)
        ax.set_xlabel("concurrency")
        ax.set_ylabel("energy, J per output token")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    legend(axes[0], fontsize=8)
    fig.tight_layout()
    return fig


def power(view: SweepView) -> plt.Figure | None:
    """Each cell's GPU power over its measured window (the first repeat), per suite: at most MAX_LEGEND lines a
    panel, the concurrencies spread evenly over those measured."""
    done = analysis.complete(view.frame) if not view.frame.empty else view.frame
    if done.empty:
        return None
    done = done[done["repeat"] == done["repeat"].min()]
    picked = []
    for _, g in done.groupby("suite", sort=False):
        series = g.groupby(["engine", "mode"]).ngroups
        concs = sorted({int(c) for c in g["concurrency"]})
        keep = {concs[i] for i in spread(len(concs), max(1, MAX_LEGEND // max(series, 1)))}
        picked += [r for r in g.to_dict("records") if int(r["concurrency"]) in keep]
    timelines = view.power([r["cell_id"] for r in picked])
    picked = [r for r in picked if r["cell_id"] in timelines]
    if not picked:
        return None
    suites = view.ordered(r["suite"] for r in picked)
    fig, axes = grid(len(suites), height=3.0)
    for ax, suite in zip(axes, suites):
        mine = sorted((r for r in picked if r["suite"] == suite), key=lambda r: (r["mode"], r["engine"], r["concurrency"]))
        concs = sorted({int(r["concurrency"]) for r in mine})
        for row in mine:
            tl = timelines[row["cell_id"]]
            alpha = 0.35 + 0.65 * (concs.index(int(row["concurrency"])) + 1) / len(concs)
            st = _style(view, row["engine"], row["mode"])
            ax.plot(tl["t_s"], tl["power_w"], color=st["color"], linestyle=st["linestyle"], alpha=alpha, linewidth=1.2,
                    label=f"{_series_label(view, row['engine'], row['mode'])} c{int(row['concurrency'])}")
        ax.set_title(suite)
        ax.set_xlabel("time in measured window, s")
        ax.set_ylabel("GPU power, W (sum over GPUs)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        legend(ax, fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def input_length(view: SweepView) -> plt.Figure | None:
    """Speedup and τ against the prompt's length, one line per engine and concurrency: only when the sweep
    has the --input-len axis (its long-<N> suites)."""
    head = view.headline
    if head.empty or "input_len" not in head.columns:
        return None
    data = head[head["input_len"] > 0]
    if data.empty:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.0))
    cmap = plt.get_cmap("Dark2")
    modes = data["mode"].nunique() > 1
    for i, ((engine, mode, conc), g) in enumerate(data.groupby(["engine", "mode", "concurrency"])):
        g = g.sort_values("input_len")
        label = (f"c={conc}" if len(_engines(view)) == 1 else f"{engine} c={conc}") + (f" {mode_name(mode)}" if modes else "")
        style = STYLES[SPECULATIVE.index(mode) % len(STYLES)] if modes and mode in SPECULATIVE else "-"
        left.plot(g["input_len"], g["speedup"], marker="o", color=cmap(i % 8), linestyle=style, label=label)
        right.plot(g["input_len"], g["tau"], marker="o", color=cmap(i % 8), linestyle=style, label=label)
    name = "DFlash" if not modes else "speculative"
    for ax, ylabel in ((left, f"speedup ({name} / AR tok/s)"), (right, "acceptance length τ")):
        ax.set_xscale("log", base=2)
        ticks = sorted(int(n) for n in set(data["input_len"]))
        ax.set_xticks(ticks, [f"{n // 1024}k" if n % 1024 == 0 else str(n) for n in ticks])
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    left.axhline(1.0, color="grey", linewidth=0.8)
    legend(left, fontsize=8, loc="best")
    fig.tight_layout()
    return fig


FIGURES: dict[str, Callable[[SweepView], plt.Figure | None]] = {
    "input_length": input_length,
    "pareto": pareto,
    "pareto_p90": pareto_p90,
    "acceptance": acceptance,
    "acceptance_positions": positions,
    "verify_width": verify_width,
    "latency": latency,
    "energy": energy,
    "power": power,
}
