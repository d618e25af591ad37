"""The comparison: each gated metric of each common cell judged against its threshold (see the package docstring)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from dflash_bench.errors import UserError
from dflash_bench.gate.baseline import Baseline, CellValues
from dflash_bench.gate.config import Bootstrap, GateConfig
from dflash_bench.gate.noise import allowance
from dflash_bench.gate.tau import comparable, definitions
from dflash_bench.store import CellKey

EPS = 1e-9  # a change exactly at the threshold passes, whatever the float rounding


@dataclass(frozen=True)
class Metric:
    name: str  # key in a baseline's metrics
    label: str
    threshold: str  # field of Thresholds
    higher_is_better: bool
    noisy: bool  # noise-aware (bootstrap with repeats), else tight
    optional: bool = False  # not measured in the sweep: skipped rather than failed
    explained: bool = False  # the check's note says its verdict in a sentence (gate/reference.py)


METRICS = (
    Metric("output_throughput", "output throughput", "throughput", True, True),
    Metric("tpot_ms_p50", "TPOT p50", "tpot", False, True),
    Metric("acceptance_length", "acceptance length", "acceptance_length", True, False),
    Metric("speedup", "speedup", "speedup", True, True),
    Metric("exact_match_rate", "lossless exact match", "exact_match", True, False, optional=True),
    Metric("accuracy", "task accuracy", "accuracy", True, False, optional=True),
)
# tau where it follows the load (--verify-width auto on both sides), or from the acceptance profile where the two
# sides' widths differ (gate/tau.py)
TAU_AUTO = Metric("acceptance_length", "acceptance length (auto width)", "acceptance_length", True, True)
TAU_PROFILE = Metric("acceptance_length", "acceptance length over the positions both verified", "acceptance_length",
                     True, False)
# Not a comparison with the baseline: a DFlash cell of the sweep that did not speculate (no acceptance
# source, draft counters that did not move, tau ~ 1) is the silent fallback to AR, and fails on its own.
SPECULATION = Metric("speculation", "speculation", "acceptance_length", True, False)
# Nor this: a partial cell of the sweep (some measured requests failed) fails unless `[cells] allow_failed_share`
# allows its share
PARTIAL = Metric("failed_requests", "failed requests", "acceptance_length", False, False)

# ---------------------------------------------------------------- the comparison

Verdict = Literal["pass", "fail", "improved", "skipped"]


@dataclass
class Check:
    """One gated metric of one cell: a JUnit test case, a row of the table."""

    cell: str
    metric: Metric
    method: str  # bootstrap | plain | tight | failed cell | not measured
    verdict: Verdict
    threshold: float
    baseline: list[float]
    current: list[float]
    change: float | None = None  # mean(current) / mean(baseline) - 1
    ci: tuple[float, float] | None = None  # bootstrap interval of the change
    note: str = ""

    @property
    def allowed(self) -> float:
        """The worst change that passes, signed in the bad direction."""
        return -self.threshold if self.metric.higher_is_better else self.threshold


@dataclass
class GateResult:
    checks: list[Check]
    missing: list[str]  # cells of the baseline that the sweep lacks
    new: list[str]  # cells of the sweep that the baseline lacks
    sweep: str
    baseline: str
    config: GateConfig
    notes: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.verdict == "fail"]

    @property
    def missing_fails(self) -> bool:
        return bool(self.missing) and self.config.cells.fail_on_missing

    @property
    def passed(self) -> bool:
        return not self.failures and not self.missing_fails

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1


def compare(sweep: Baseline, base: Baseline, config: GateConfig | None = None,
            sweep_label: str = "sweep", baseline_label: str = "baseline") -> GateResult:
    """Gate the cells of `sweep` against those of `base`; a UserError when they share no cell."""
    config = config or GateConfig()
    cur = {c.key: c for c in sweep.cells}
    ref = {c.key: c for c in base.cells if c.repeats}
    common = sorted((k for k in ref if k in cur), key=CellKey.sort_key)
    if not common:
        raise UserError(f"the sweep and the baseline have no cell in common (sweep: {_some(cur)}; "
                        f"baseline: {_some(ref)}): they measured different plans")
    checks = [chk for k in common for chk in _check_cell(ref[k], cur[k], config)]
    return GateResult(
        checks=checks,
        missing=[k.name for k in sorted(ref, key=CellKey.sort_key) if k not in cur],
        new=[k.name for k in sorted(cur, key=CellKey.sort_key) if k not in ref],
        sweep=sweep_label, baseline=baseline_label, config=config,
        notes=_provenance_notes(sweep, base) + _tau_notes(base, sweep, common),
    )


def _check_cell(ref: CellValues, cur: CellValues, config: GateConfig) -> list[Check]:
    name = ref.key.name
    out = [Check(name, SPECULATION, "no speculation", "fail", 0.0, [], [], note=f"{cid}: {why}")
           for cid, why in cur.no_speculation.items()]
    allowed = config.cells.allow_failed_share
    out += [Check(name, PARTIAL, "partial cell", "fail" if share > allowed + EPS else "pass", allowed, [], [share],
                  note=f"{cid}: {why} (allowed: {100 * allowed:.0f}% of a cell's requests, [cells] allow_failed_share)")
            for cid, (share, why) in cur.partial.items()]
    for m in METRICS:
        base = ref.metrics.get(m.name)
        if not base:
            continue
        threshold = getattr(config.thresholds, m.threshold)
        current = cur.metrics.get(m.name, [])
        if m.name == "acceptance_length" and not cur.failed and current:
            out.append(_tau_check(name, ref, cur, threshold, config.bootstrap))
        elif cur.failed:
            why = "; ".join(f"{cid}: {reason}" for cid, reason in cur.failed.items())
            out.append(Check(name, m, "failed cell", "fail", threshold, base, current, note=f"failed in the sweep ({why})"))
        elif not current:
            verdict: Verdict = "skipped" if m.optional else "fail"
            out.append(Check(name, m, "not measured", verdict, threshold, base, [], note="not measured in the sweep"))
        else:
            out.append(judge(name, m, base, current, threshold, config.bootstrap, ref.noise.get(m.name)))
    return out


def _tau_check(name: str, ref: CellValues, cur: CellValues, threshold: float, boot: Bootstrap) -> Check:
    """τ like with like (gate/tau.py): as τ under the same width policy, over the profile where they differ, else
    skipped with the sentence that says why not."""
    pair = comparable(ref, cur)
    if isinstance(pair, str):
        return Check(name, METRICS[2], "not comparable", "skipped", threshold, ref.metrics["acceptance_length"],
                     cur.metrics["acceptance_length"], note=pair)
    metric = TAU_PROFILE if pair.how == "profile" else TAU_AUTO if pair.noisy else METRICS[2]
    check = judge(name, metric, pair.base, pair.current, threshold, boot,
                  ref.noise.get("acceptance_length") if pair.noisy else None)
    check.note = "; ".join(x for x in (pair.note, check.note) if x)
    return check


def _tau_notes(base: Baseline, sweep: Baseline, common: list[CellKey]) -> list[str]:
    """One sentence where the baseline's DFlash cells differ from the sweep's in width policy or τ definition."""
    cur = {c.key: c for c in sweep.cells}
    ref = {c.key: c for c in base.cells}
    dflash = [k for k in common if k.mode == "dflash"]
    out = []
    policies = sorted({(str(ref[k].width_policy), str(cur[k].width_policy)) for k in dflash
                       if ref[k].width_policy != cur[k].width_policy})
    if policies:
        pairs = ", ".join(f"{a} against {b}" for a, b in policies).replace("None", "none recorded")
        out.append(f"the baseline's DFlash cells were measured under another width policy than the sweep's ({pairs}): "
                   "τ is compared over the acceptance profile where both have one, else not at all")
    defs = sorted({(tuple(sorted(definitions(ref[k]))), tuple(sorted(definitions(cur[k])))) for k in dflash
                   if definitions(ref[k]) != definitions(cur[k])})
    if defs:
        words = ", ".join(f"{list(a) or 'none'} against {list(b) or 'none'}" for a, b in defs)
        out.append(f"the baseline's τ was counted under another definition than the sweep's ({words}): τ is not "
                   "compared; export the baseline again with this version")
    return out


def judge(cell: str, metric: Metric, base: list[float], current: list[float], threshold: float,
          boot: Bootstrap | None = None, noise: float | None = None) -> Check:
    """The verdict of one metric: bootstrap with repeats on both sides, else the plain or tight threshold; a noisy
    metric's threshold widened by the baseline's run-to-run noise figure (gate/noise.py) where it carries one."""
    boot = boot or Bootstrap()
    widen = allowance(noise, boot.confidence) if metric.noisy else 0.0
    threshold += widen
    change = _ratio(float(np.mean(current)), float(np.mean(base))) - 1
    sign = 1.0 if metric.higher_is_better else -1.0  # bad = -sign * change
    repeats = min(len(base), len(current)) >= boot.min_repeats
    if metric.noisy and repeats and min(base) > 0:
        lo, hi = bootstrap_change(base, current, boot, seed_key=f"{cell}:{metric.name}")
        bad = sorted((-sign * lo, -sign * hi))
        verdict: Verdict = "fail" if bad[0] > threshold + EPS else "improved" if bad[1] < -threshold else "pass"
        return Check(cell, metric, "bootstrap", verdict, threshold, base, current, change, (lo, hi),
                     note=_noise_note(noise, widen))
    bad_change = -sign * change
    verdict = "fail" if bad_change > threshold + EPS else "improved" if bad_change < -threshold else "pass"
    method = "plain" if metric.noisy else "tight"
    note = (_noise_note(noise, widen) if widen else
            f"{len(base)} vs {len(current)} repeats: plain threshold, not noise-aware" if metric.noisy else "")
    return Check(cell, metric, method, verdict, threshold, base, current, change, note=note)


def _noise_note(noise: float | None, widen: float) -> str:
    return (f"threshold widened by {100 * widen:.1f}% for the baseline's run-to-run noise (cv {100 * noise:.1f}%)"
            if noise and widen else "")


def bootstrap_change(base: list[float], current: list[float], boot: Bootstrap, seed_key: str = "") -> tuple[float, float]:
    """Percentile bootstrap interval of mean(current)/mean(base) - 1, each side resampled on its own.

    The resampled means' spread around the sample mean is scaled by sqrt(n / (n - 1)), the unbiased
    variance: a plain percentile bootstrap is too narrow at a few repeats (see benchmarks/harness/gate_calibration.py
    and its --unscaled: how often a true change equal to the threshold fails, 3 or 5 repeats, cv 3%).
    Seeded by the configured seed and the check's name, so the same inputs give the same interval."""
    rng = np.random.default_rng([boot.seed, zlib.crc32(seed_key.encode())])
    b_means = resampled_means(np.asarray(base, dtype=float), boot.resamples, rng)
    c_means = resampled_means(np.asarray(current, dtype=float), boot.resamples, rng)
    alpha = (1 - boot.confidence) / 2
    lo, hi = np.quantile(c_means / b_means, [alpha, 1 - alpha])
    return float(lo) - 1, float(hi) - 1


def resampled_means(x: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    means = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    return x.mean() + (means - x.mean()) * np.sqrt(len(x) / (len(x) - 1))


def _ratio(a: float, b: float) -> float:
    if b == 0:
        return 1.0 if a == 0 else float("inf") * np.sign(a)
    return float(a / b)


def _some(cells: dict[CellKey, Any], n: int = 4) -> str:
    names = [k.name for k in sorted(cells, key=CellKey.sort_key)]
    if not names:
        return "none"
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


PLAN_SETTINGS = {"engines", "suites", "concurrency", "repeats", "runner", "port", "url_ar", "url_dflash", "slo"}


def _provenance_notes(sweep: Baseline, base: Baseline) -> list[str]:
    """What differs in models, hardware and measuring settings: shown, never failed on."""
    notes = []
    for section in ("models", "hardware", "settings"):
        a, b = sweep.provenance.section(section), base.provenance.section(section)
        if not (a and b):
            continue
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and k not in PLAN_SETTINGS)
        if diff:
            notes.append(f"{section} differ from the baseline's: {', '.join(diff[:6])}" + (" ..." if len(diff) > 6 else ""))
    return notes
