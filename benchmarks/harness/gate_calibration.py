"""How often the gate's noise-aware check fails: false alarms without a change, detection of a real drop,
and how long a gate of a large sweep takes.

    python -m benchmarks.harness.gate_calibration [--trials 2000] [--cv 0.03] [--unscaled]

Throughput of every repeat is drawn as mean * (1 + cv * N(0, 1)), the run-to-run noise of a benchmark cell;
the sweep's mean is the baseline's times (1 + true change). Each trial is one gate check (`gate.judge`)
with the default settings (bootstrap 2000 resamples, 95%, threshold 5%); the plain threshold on one repeat
is shown beside it. Last, `gate.gate` on a planted sweep of 2 modes x 7 suites x 3 concurrencies x 5
repeats (210 cells), timed end to end (reading both folders included).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dflash_bench import gate
from dflash_bench.store import CellPlan, CellSummary, Manifest, Stat, SweepDir, cell_id

THROUGHPUT = gate.METRICS[0]


def fail_rate(change: float, repeats: int, cv: float, trials: int, rng: np.random.Generator) -> float:
    fails = 0
    for t in range(trials):
        base = 100 * (1 + cv * rng.standard_normal(repeats))
        cur = 100 * (1 + change) * (1 + cv * rng.standard_normal(repeats))
        chk = gate.judge(f"trial{t}", THROUGHPUT, list(base), list(cur), 0.05)
        fails += chk.verdict == "fail"
    return fails / trials


def big_sweep(path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    suites = ["gsm8k", "math500", "humaneval", "mbpp", "mt-bench", "alpaca", "speed-bench"]
    cells = [(m, s, c, r) for r in range(5) for m in ("ar", "dflash") for s in suites for c in (1, 8, 32)]
    plan = [CellPlan(cell_id=cell_id("vllm", m, s, c, r), engine="vllm", mode=m, suite=s, concurrency=c, repeat=r)
            for m, s, c, r in cells]
    sweep = SweepDir.create(path, Manifest(sweep_id=path.name, plan=plan))
    for m, s, c, r in cells:
        tput = 100.0 * c ** 0.8 * (3 if m == "dflash" else 1) * (1 + 0.03 * rng.standard_normal())
        sweep.write_summary(CellSummary(cell_id=cell_id("vllm", m, s, c, r), engine="vllm", mode=m, suite=s,
                                        concurrency=c, repeat=r, output_throughput=tput,
                                        tpot_ms=Stat(n=10, p50=1000 * c / tput),
                                        acceptance_length=6.0 if m == "dflash" else None))
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--cv", type=float, default=0.03, help="run-to-run coefficient of variation of a cell")
    ap.add_argument("--unscaled", action="store_true",
                    help="the plain percentile bootstrap (resampled means not scaled by sqrt(n/(n-1))), to compare")
    args = ap.parse_args()
    if args.unscaled:
        # the comparison module (its name is shadowed by gate.compare, the function)
        importlib.import_module("dflash_bench.gate.compare").resampled_means = lambda x, k, rng: x[rng.integers(0, len(x), size=(k, len(x)))].mean(axis=1)
    rng = np.random.default_rng(0)
    print(f"cv {args.cv:.0%}, threshold 5%, {args.trials} trials per row; fraction of checks that fail")
    print(f"{'true change':>12} {'1 repeat (plain)':>17} {'3 repeats':>10} {'5 repeats':>10}")
    for change in (0.0, -0.02, -0.05, -0.08, -0.10, -0.15):
        rates = [fail_rate(change, n, args.cv, args.trials, rng) for n in (1, 3, 5)]
        print(f"{change:>+12.0%} {rates[0]:>17.3f} {rates[1]:>10.3f} {rates[2]:>10.3f}")
    with tempfile.TemporaryDirectory() as tmp:
        a, b = big_sweep(Path(tmp) / "a", 1), big_sweep(Path(tmp) / "b", 2)
        t0 = time.perf_counter()
        result = gate.gate(a, b)
        dt = time.perf_counter() - t0
    print(f"gate of 210 cells (42 keys x 5 repeats), {len(result.checks)} checks: {dt:.2f} s, "
          f"{len(result.failures)} failed (noise cv 3%, no true change)")


if __name__ == "__main__":
    sys.exit(main())
