"""Run-to-run noise: how much the same code's throughput, TPOT and speedup move from one run to the next on the
same machine, as one run's repeats measured it: the baseline's, or the gated sweep's own (never from other runs
being gated).

The bootstrap over repeats (compare.bootstrap_change) sees how well each side's repeats pin its mean; it does not
see that a whole run can sit at another speed: on a shared machine the load of everything else changes over
minutes, and a run measured later reads slower or faster throughout. Three figures measure how far that goes, per
metric, as a relative standard deviation cv:

- its own repeats (every baseline with 2 or more): a sweep's repeats are whole passes over its plan, minutes
  apart, so the spread of a cell's throughput, TPOT or speedup over them is the machine's load moving over a run
  (`repeat_noise`);
- for throughput and TPOT (MACHINE_PACED), the gated sweep's own repeats, the same way: a run measured while the
  machine's load swung (everything else starting and stopping) is as uncertain as its passes disagree, which a
  baseline measured on a quieter stretch cannot know (the demo on the 2-core box: a run at load 6-7 read AR
  throughput a quarter of a run at load 1-2.5, the spread of its passes 38%, the quieter run's 15-22%). Not for
  the speedup: that would let the run being judged widen the band on the check that catches a slower DFlash;
- its own runs, where it was exported with `gate --export-baseline SWEEP -o FILE --noise-from RUN ...` (other runs of
  the same plan by the same code): the spread of the runs' means, pooled over the cells of each server and
  concurrency, carried in the file (CellValues.noise).

The largest is the cell's noise figure. Gating, a run-to-run shift of that size is drawn into every
bootstrap resample (log-normal, standard deviation sqrt(2) x cv: the change between two runs has twice one run's
variance), so the interval covers a rerun's move; without repeats the plain threshold widens by z x sqrt(2) x cv.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np

from dflash_bench.errors import UserError
from dflash_bench.gate.baseline import Baseline, CellValues, collect, exportable
from dflash_bench.store import atomic_write_json

# the metrics that move with the machine's load (tau does not: at one fixed verify width it is the same run to run)
NOISY = ("output_throughput", "tpot_ms_p50", "speedup")
# paced by the machine's speed as it was while the run ran: the gated sweep's own repeats widen these too
MACHINE_PACED = ("output_throughput", "tpot_ms_p50")
MIN_RUNS = 2  # the exported run and at least one more


@dataclass(frozen=True)
class Noise:
    """One cell's run-to-run noise figure for one metric, and where it was measured."""

    cv: float
    source: str  # "repeats" (the baseline's own), "sweep" (the gated sweep's own repeats) or "runs" (--noise-from)
    samples: int  # the repeats or runs it was measured over (per cell)

    def words(self) -> str:
        where = {"repeats": "the baseline's repeats", "sweep": "the sweep's own repeats"}.get(
            self.source, f"the baseline's {self.samples} runs")
        return f"run-to-run noise cv {100 * self.cv:.1f}% ({where})"


def group(cell: CellValues) -> tuple[str, str, int]:
    """The cells whose noise is measured together: one server at one concurrency (the suites pooled)."""
    return cell.engine, cell.mode, cell.concurrency


def pooled_cv(sets: list[list[float]]) -> float | None:
    """The relative standard deviation of several sets of values of one quantity (each set around its own mean),
    pooled: sqrt(sum of squared relative deviations / sum of the sets' degrees of freedom); None without any set
    of 2."""
    ss, df = 0.0, 0
    for xs in sets:
        m = float(np.mean(xs)) if xs else 0.0
        if len(xs) < 2 or m <= 0:
            continue
        ss += float(np.sum((np.asarray(xs, dtype=float) / m - 1) ** 2))
        df += len(xs) - 1
    return math.sqrt(ss / df) if df else None


def repeat_noise(base: Baseline, source: str = "repeats") -> dict[tuple[tuple[str, str, int], str], Noise]:
    """Per (engine, mode, concurrency) and metric, how far the machine moved a run's values over it (the baseline's,
    or with source "sweep" the gated sweep's own).

    A sweep's repeats are whole passes over its plan, minutes apart. Throughput and TPOT follow the machine's speed
    within a pass as much as between passes (the cells of a pass against each other too), so a later run can sit
    anywhere in the whole spread of a cell's repeats: the figure is that spread, pooled over the group's cells
    (`pooled_cv`). So does a speedup, though it divides two cells measured together: on a loaded CPU the load moves
    it cell by cell, not every cell of a pass alike (the demo at concurrency 8 on a 2-core box: mbpp's speedup read
    1.0-1.3 over one run's passes and 1.5-1.7 over the next run's, while what moved every cell of a pass alike
    was 0-4%), and a run
    at another load sits elsewhere in that spread; at concurrency 1, where the speedup holds still, the figure stays
    small, so a DFlash server 30% slower still fails there."""
    sets: dict[tuple[tuple[str, str, int], str], list[list[float]]] = {}
    for cell in base.cells:
        for metric in NOISY:
            values = cell.metrics.get(metric) or []
            if len(values) >= 2 and min(values) > 0:
                sets.setdefault((group(cell), metric), []).append(values)
    out = {}
    for key, rows in sets.items():
        cv = pooled_cv(rows)
        if cv is not None:
            out[key] = Noise(cv, source, max(len(r) for r in rows))
    return out


def noise_of(cell: CellValues, metric: str, repeats: dict[tuple[tuple[str, str, int], str], Noise],
             own: dict[tuple[tuple[str, str, int], str], Noise] | None = None) -> Noise | None:
    """The cell's noise figure for the metric: the largest of its baseline's repeats', its baseline's runs' and the
    gated sweep's own repeats' (None: none measured)."""
    mine = repeats.get((group(cell), metric))
    theirs = (own or {}).get((group(cell), metric))
    carried = cell.noise.get(metric)
    runs = Noise(carried, "runs", cell.noise_runs) if carried else None
    return widest(mine, theirs, runs)


def widest(*figures: Noise | None) -> Noise | None:
    """The largest of these noise figures (None: none measured)."""
    found = [n for n in figures if n is not None]
    return max(found, key=lambda n: n.cv) if found else None


def export_with_noise(sweep_dir: Path, output: Path, noise_from: list[Path]) -> Baseline:
    """`gate --export-baseline --noise-from`: the sweep's baseline carrying the noise measured over it and the runs."""
    baseline = measure_noise(exportable(sweep_dir), [collect(p, quiet=True) for p in noise_from])
    atomic_write_json(Path(output), baseline)
    return baseline


def measure_noise(base: Baseline, others: list[Baseline]) -> Baseline:
    """`base` with each cell's noise figure measured over it and `others` (runs of the same plan): per metric, the
    spread of the runs' means, pooled over the cells of its group."""
    if len(others) + 1 < MIN_RUNS:
        raise UserError("--noise-from needs another run of the same plan")
    twins = {cell.key: [c for o in others for c in o.cells if c.key == cell.key and c.repeats] for cell in base.cells}
    runs = {key: len(t) + 1 for key, t in twins.items()}
    measured = False
    for metric in NOISY:
        sets: dict[tuple[str, str, int], list[list[float]]] = {}
        for cell in base.cells:
            means = [float(np.mean(c.metrics[metric])) for c in [cell, *twins[cell.key]] if c.metrics.get(metric)]
            if len(means) >= MIN_RUNS:
                sets.setdefault(group(cell), []).append(means)
        for cell in base.cells:
            cv = pooled_cv(sets.get(group(cell), []))
            if cv is not None and runs[cell.key] >= MIN_RUNS:
                cell.noise[metric] = cv
                cell.noise_runs = runs[cell.key]
                measured = True
    if not measured:
        raise UserError("--noise-from: no cell of the exported sweep was measured in the other runs too; give runs "
                        "of the same plan")
    return base


def z_value(confidence: float) -> float:
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def allowance(noise: float | None, confidence: float) -> float:
    """How far past its threshold a noisy metric may move in a rerun, given its noise figure (the plain threshold's
    widening, where there are no repeats to bootstrap)."""
    if not noise:
        return 0.0
    return z_value(confidence) * math.sqrt(2) * noise
