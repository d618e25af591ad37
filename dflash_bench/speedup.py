"""A cell's speedup, defined once: per repeat, the DFlash cell's output throughput over its AR partner's (same
engine, suite, concurrency, repeat), then the median of these ratios over the cell's repeats.

One pair's two cells ran close together, so their ratio sees one state of the machine; the median keeps one
disturbed repeat from moving it. It is the one speedup of a cell wherever one is shown: the report (headline, the
card's table, the engines side by side), the sweep's console, the gate's tables and the docs' generated tables;
with several repeats it is not the ratio of the averaged tok/s shown beside it. Nothing here imports anything of
the package, so every layer can use it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

SPEEDUP_DEFINITION = ("each repeat's DFlash output tok/s over its AR partner's, then the median of these ratios over "
                      "the cell's repeats (one repeat: its ratio)")


def speedup_of(ratios: Iterable[float | None]) -> float | None:
    """A cell's one speedup from its repeats' DFlash / AR ratios: their median (None when no repeat has one)."""
    values = sorted(float(r) for r in ratios if r is not None and math.isfinite(r))
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
