"""Confidence intervals for accuracies: Wilson for one proportion, Newcombe for a paired difference."""

from __future__ import annotations

import math
from statistics import NormalDist


def z_of(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2)


def wilson(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of successes / n; (0, 1) when n is 0."""
    if n == 0:
        return 0.0, 1.0
    z, p = z_of(level), successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_difference(both: int, only_first: int, only_second: int, neither: int,
                      level: float = 0.95) -> tuple[float, float, float]:
    """(p1 - p2, lower, upper) for paired binary outcomes: Newcombe's square-and-add interval (1998,
    method 10) built from the two Wilson intervals and the continuity-corrected phi correlation."""
    n = both + only_first + only_second + neither
    if n == 0:
        return 0.0, -1.0, 1.0
    x1, x2 = both + only_first, both + only_second
    p1, p2 = x1 / n, x2 / n
    (l1, u1), (l2, u2) = wilson(x1, n, level), wilson(x2, n, level)
    phi = _phi(both, only_first, only_second, neither)
    d = p1 - p2
    lower = d - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    upper = d + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return d, max(-1.0, lower), min(1.0, upper)


def _phi(a: int, b: int, c: int, d: int) -> float:
    n = a + b + c + d
    denom = (a + b) * (c + d) * (a + c) * (b + d)
    if denom == 0:
        return 0.0
    cross = a * d - b * c
    corrected = cross - n / 2 if cross > n / 2 else (cross if cross < 0 else 0.0)
    return corrected / math.sqrt(denom)
