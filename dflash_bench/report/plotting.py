"""What keeps a figure readable however many cells a sweep holds, whatever it draws: a grid of panels bounded in
size, legends folded past MAX_LEGEND entries, at most MAX_TICKS concurrencies named on an axis, point labels placed
where they overlap nothing, and the PNG at DPI. figures.py draws the report's figures with these.
"""

from __future__ import annotations

import io
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DPI = 100
# However many suites, concurrencies and engines a sweep holds, a figure stays readable: at most this many legend
# entries (the rest folded into one "... N more" entry), tick labels and point labels per axes, and at most this
# size (panels shrink past it, down to MIN_PANEL_IN).
MAX_LEGEND = 12
MAX_TICKS = 10
MAX_POINT_LABELS = 24
MAX_WIDTH_IN, MAX_HEIGHT_IN = 17.0, 24.0
MAX_COLS = 4
MIN_PANEL_IN = 1.2


def png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def panel_size(nrows: int, ncols: int, width: float, height: float) -> tuple[float, float]:
    """The size of one panel of a grid, shrunk so that the whole grid fits MAX_WIDTH_IN x MAX_HEIGHT_IN (never
    below MIN_PANEL_IN)."""
    w = min(width, max(MIN_PANEL_IN, MAX_WIDTH_IN / ncols))
    h = min(height, max(MIN_PANEL_IN, MAX_HEIGHT_IN / nrows))
    return w, h


def grid(n: int, width: float = 4.2, height: float = 3.3, ncols_max: int = 3) -> tuple[plt.Figure, list[Any]]:
    ncols = max(1, min(n, ncols_max if n <= 3 * ncols_max else MAX_COLS))
    nrows = math.ceil(n / ncols)
    w, h = panel_size(nrows, ncols, width, height)
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def legend(ax: Any, handles: list[Any] | None = None, labels: list[str] | None = None, keys: int = 0,
           **kw: Any) -> Any:
    """A legend of at most MAX_LEGEND entries: past that, evenly spaced series (the first and the last among them)
    and one "... N more" entry for the rest, whose lines keep their colours in the plot. The last `keys` entries
    (what markers mean) are always kept."""
    if handles is None or labels is None:
        handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    if len(handles) > MAX_LEGEND:
        tail_h, tail_l = handles[len(handles) - keys:], labels[len(labels) - keys:]
        handles, labels = handles[:len(handles) - keys], labels[:len(labels) - keys]
        keep = spread(len(handles), MAX_LEGEND - 1 - keys)
        more = len(handles) - len(keep)
        handles = [handles[i] for i in keep] + [plt.Line2D([], [], linestyle="")] + tail_h
        labels = [labels[i] for i in keep] + [f"… {more} more"] + tail_l
    if kw.get("loc", "best") == "best" and _points(ax) > BEST_LEGEND_POINTS:
        kw["loc"] = "upper right"  # "best" weighs every point against every place: slow past a few hundred
    return ax.legend(handles, labels, **kw)


BEST_LEGEND_POINTS = 400


def _points(ax: Any) -> int:
    """How many data points an axes draws (lines' vertices and scatter offsets)."""
    return sum(len(line.get_xdata()) for line in ax.get_lines()) + sum(len(c.get_offsets()) for c in ax.collections)


def spread(n: int, k: int) -> list[int]:
    """k indices of range(n) evenly spread, the first and the last included (all of them when n <= k)."""
    if n <= k:
        return list(range(n))
    if k <= 1:
        return [0]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def conc_axis(ax: Any, concs: list[int]) -> None:
    log = bool(concs) and max(concs) / max(min(concs), 1) >= 4
    if log:
        ax.set_xscale("log", base=2)
    ticks = ticks_of(concs, log)
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(c) for c in ticks])
    ax.minorticks_off()


def ticks_of(concs: list[int], log: bool) -> list[int]:
    """At most MAX_TICKS of the measured concurrencies to label the axis with, spread evenly on its scale, the
    lowest and the highest among them."""
    concs = sorted(set(concs))
    if len(concs) <= MAX_TICKS:
        return concs
    scale = [math.log2(c) if log and c > 0 else float(c) for c in concs]
    lo, hi = scale[0], scale[-1]
    picked = {concs[0], concs[-1]}
    for i in range(1, MAX_TICKS - 1):
        want = lo + (hi - lo) * i / (MAX_TICKS - 1)
        picked.add(concs[min(range(len(scale)), key=lambda j: abs(scale[j] - want))])
    return sorted(picked)


# offsets (points) tried in turn for a point's label: beside it, then above and below, then further out
_OFFSETS = [(4, 4, "left"), (4, -11, "left"), (-4, 4, "right"), (-4, -11, "right"), (4, 13, "left"),
            (4, -20, "left"), (-4, 13, "right"), (-4, -20, "right"), (4, 22, "left"), (4, -29, "left")]


def place_labels(fig: plt.Figure, labels: list[tuple[Any, float, float, str, str]]) -> list[Any]:
    """Label each point (axes, x, y, text, colour) where its text stays inside the axes and overlaps no label
    placed before it on the same axes (AR and DFlash points of one concurrency often sit close), trying the
    offsets in turn; the texts it drew. Call after the layout is final: it measures the texts as drawn."""
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # the Agg canvas the figures draw on has it
    placed: dict[int, list[Any]] = {}
    drawn = []
    for ax, px, py, text, color in labels:
        boxes = placed.setdefault(id(ax), [])
        frame = ax.get_window_extent(renderer)
        for dx, dy, ha in _OFFSETS:
            note = ax.annotate(text, (px, py), textcoords="offset points", xytext=(dx, dy), ha=ha, fontsize=8,
                               color=color)
            box = note.get_window_extent(renderer)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(box.overlaps(b) for b in boxes):
                break
            note.remove()
        else:  # crowded beyond every offset: the first place, over another label rather than no label
            dx, dy, ha = _OFFSETS[0]
            note = ax.annotate(text, (px, py), textcoords="offset points", xytext=(dx, dy), ha=ha, fontsize=8, color=color)
            box = note.get_window_extent(renderer)
        boxes.append(box)
        drawn.append(note)
    return drawn
