"""Run-to-run noise: how much the same code's figures move from one run to the next on the same machine.

Repeats inside one run (the bootstrap over them, compare.bootstrap_change) miss what moves between runs: on a
shared machine the load of everything else changes over minutes, and a run measured later reads uniformly
slower or faster. `gate --export-baseline SWEEP -o FILE --noise-from RUN --noise-from RUN ...` measures it: per cell and
metric, the mean of each run (SWEEP and every RUN, the same plan measured by the same code), and the noise
figure is their relative standard deviation, cv = std(means, ddof 1) / mean(means). The baseline carries it
(CellValues.noise); gating a sweep against it, a noisy metric's threshold widens by

    z x sqrt(2) x cv

(z: the normal quantile of the gate's bootstrap confidence, 1.96 at 95%; sqrt(2): the change between two runs has
twice one run's variance), so a rerun of the same code passes while a change past the noise still fails.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from pathlib import Path

import numpy as np

from dflash_bench.errors import UserError
from dflash_bench.gate.baseline import Baseline, collect, exportable
from dflash_bench.store import atomic_write_json

# the metrics that move with the machine's load (tau too under --verify-width auto: the widths follow the load)
NOISY = ("output_throughput", "tpot_ms_p50", "speedup", "acceptance_length")
MIN_RUNS = 3  # the exported run and at least two more: one difference is no spread


def export_with_noise(sweep_dir: Path, output: Path, noise_from: list[Path]) -> Baseline:
    """`gate --export-baseline --noise-from`: the sweep's baseline carrying the noise measured over it and the runs."""
    baseline = measure_noise(exportable(sweep_dir), [collect(p, quiet=True) for p in noise_from])
    atomic_write_json(Path(output), baseline)
    return baseline


def measure_noise(base: Baseline, others: list[Baseline]) -> Baseline:
    """`base` with each cell's noise figure measured over it and `others` (runs of the same plan)."""
    if len(others) + 1 < MIN_RUNS:
        raise UserError(f"--noise-from needs at least {MIN_RUNS - 1} other runs of the same plan (one difference "
                        "between two runs is no measure of their spread)")
    for cell in base.cells:
        twins = [c for o in others for c in o.cells if c.key == cell.key and c.repeats]
        runs = len(twins) + 1
        if runs < MIN_RUNS:
            continue
        for metric in NOISY:
            means = [float(np.mean(c.metrics[metric])) for c in [cell, *twins] if c.metrics.get(metric)]
            if len(means) >= MIN_RUNS and np.mean(means) > 0:
                cell.noise[metric] = float(np.std(means, ddof=1) / np.mean(means))
        cell.noise_runs = runs
    if not any(c.noise for c in base.cells):
        raise UserError("--noise-from: no cell of the exported sweep was measured in the other runs too; give runs "
                        "of the same plan")
    return base


def allowance(noise: float | None, confidence: float) -> float:
    """How far past its threshold a noisy metric may move in a rerun, given its noise figure."""
    if not noise:
        return 0.0
    return NormalDist().inv_cdf(0.5 + confidence / 2) * math.sqrt(2) * noise
