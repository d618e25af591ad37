"""The CI regression gate: a sweep against a baseline, cell by cell and metric by metric.

    dflash-bench gate SWEEP_DIR --baseline BASELINE [--thresholds gate.toml] [--junit FILE] [--markdown FILE]
    dflash-bench gate --export-baseline SWEEP_DIR -o baseline.json

Cells match on (engine, mode, suite, concurrency); the repeats of a cell are its samples. Each metric is
judged by the relative change of its mean, current / baseline - 1, against a threshold (the largest
change in the bad direction that still passes):

- tight: acceptance length where both cells verified one fixed width (the same run to run at temperature 0;
  under widths chosen by load, or two different widths, τ is not compared and the check says why: tau.py), and the
  lossless exact-match rate and task accuracy where the sweep has them.
- bootstrap: output throughput, TPOT p50 and speedup when both sides have repeats: a seeded percentile
  bootstrap interval of the ratio of means, each resample also moved by the baseline's run-to-run noise (noise.py:
  its repeats' spread, for the paired speedup only what moved a pass's cells alike, or its runs); the check
  fails only when the whole interval is past the
  threshold. Each check's interval is taken at 1 - (1 - confidence) / checks (compare.family), so that a rerun of
  the same code passes every check of the gate with the configured confidence.
- the speedup over the suites (compare.pooled_speedups): per speculative mode, engine and concurrency with 2 or more
  suites, each repeat's geometric mean of the suites' speedups, judged as a speedup, its noise its own repeats'
  spread: a loaded machine moves each cell's speedup on its own, a slower speculative server every suite alike.
- plain: the same noisy metrics without repeats: the single change against the threshold, widened by the
  baseline's noise where it carries one, labelled so.

Between runs whose machines ran at different speeds (their speed probes, machine.py), output throughput, TPOT
and DFlash tok/s at the SLO are reported as not comparable, not gated; the speedup and τ are gated all the same.

A partial cell (some of its measured requests failed) fails unless `[cells] allow_failed_share` allows its share.

Where the sweep holds the builtin engine and another engine on the same pair, each other engine's DFlash tau
is also judged against the builtin engine's, the reference, by the same rule (reference.py): a fail names
the suite, both engines and both tau.

A cell that failed in the sweep fails every metric its baseline has. Exit codes: 0 pass, 1 regression,
2 unusable input (a UserError: missing or corrupt baseline, bad thresholds, nothing in common).

Modules: config (gate.toml), baseline (what a sweep or a baseline file holds), compare (the verdicts),
reference (tau against the builtin engine), tau (which tau two cells compare on), noise (run-to-run noise), machine (one machine speed or not), output (terminal table, markdown, JUnit), command (the CLI entry point).
"""

from dflash_bench.gate.baseline import BASELINE_VERSION, Baseline, CellValues, collect, export_baseline, load_baseline
from dflash_bench.gate.command import gate, main
from dflash_bench.gate.compare import (
    METRICS, Check, GateResult, Metric, bootstrap_change, compare, judge, resampled_means,
)
from dflash_bench.gate.config import Bootstrap, CellsPolicy, GateConfig, Reference, Thresholds, load_config
from dflash_bench.gate.reference import ReferenceResult, TauComparison, compare_folders, compare_sweeps

__all__ = [
    "BASELINE_VERSION", "Baseline", "CellValues", "collect", "export_baseline", "load_baseline", "gate", "main",
    "METRICS", "Check", "GateResult", "Metric", "bootstrap_change", "compare", "judge", "resampled_means",
    "Bootstrap", "CellsPolicy", "GateConfig", "Reference", "Thresholds", "load_config",
    "ReferenceResult", "TauComparison", "compare_folders", "compare_sweeps",
]
