"""Statistics helpers: percentiles (plain and weighted) and the Stat summary of a list of values."""

from __future__ import annotations

import math
from typing import Sequence

from dflash_bench.store import Stat


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on an already sorted sequence."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("percentile of no values")
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def describe(values: Sequence[float | None]) -> Stat | None:
    """mean, p50, p90, p99, min, max of `values` (None and NaN left out); None when there are none."""
    vals = sorted(v for v in values if v is not None and not math.isnan(v))
    if not vals:
        return None
    return Stat(n=len(vals), mean=sum(vals) / len(vals), p50=percentile(vals, 50), p90=percentile(vals, 90),
                p99=percentile(vals, 99), min=vals[0], max=vals[-1])


def weighted_quantile(pairs: list[tuple[float, int]], q: float) -> float:
    """Inverse CDF of a weighted sample: the smallest value whose cumulative weight reaches q% of the total.

    `pairs` is (value, weight) sorted by value. Used for per-token latency, where one chunk gap divided
    over k tokens is k equal samples: weighting avoids materialising them."""
    total = sum(w for _, w in pairs)
    target = total * q / 100.0
    acc = 0
    for v, w in pairs:
        acc += w
        if acc >= target:
            return v
    return pairs[-1][0]


def describe_weighted(pairs: list[tuple[float, int]]) -> Stat | None:
    """Stat of values that each stand for `weight` samples (e.g. per-token latency of a multi-token chunk)."""
    pairs = sorted(p for p in pairs if p[1] > 0)
    if not pairs:
        return None
    total = sum(w for _, w in pairs)
    mean = sum(v * w for v, w in pairs) / total
    return Stat(n=total, mean=mean, p50=weighted_quantile(pairs, 50), p90=weighted_quantile(pairs, 90),
                p99=weighted_quantile(pairs, 99), min=pairs[0][0], max=pairs[-1][0])
