"""The comparison: each gated metric of each common cell judged against its threshold (see the package docstring)."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from dflash_bench.errors import UserError
from dflash_bench.gate.baseline import Baseline, CellValues
from dflash_bench.gate.config import Bootstrap, GateConfig
from dflash_bench.gate.machine import ABSOLUTE, MachineSpeeds, machine_speeds
from dflash_bench.gate.noise import MACHINE_PACED, Noise, allowance, noise_of, pooled_cv, repeat_noise, widest
from dflash_bench.gate.tau import comparable, definitions, verified_width
from dflash_bench.store import SPECULATIVE, CellKey

EPS = 1e-9  # a change exactly at the threshold passes, whatever the float rounding
TAIL_RESAMPLES = 25  # resamples beyond each end of a bootstrap interval, at the least


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
# A speculative mode's speedup over all the suites of one engine and concurrency: per repeat the geometric mean of its
# cells' speedups (gate/compare.pooled_speedups). A slower speculative server slows every suite alike, while the load
# of a shared machine moves each cell's speedup on its own: pooled over the suites that noise shrinks and the
# regression stays.
POOLED_SPEEDUP = Metric("speedup_over_suites", "speedup over the suites", "speedup", True, True)
# Not a comparison with the baseline: a speculative cell (DFlash, EAGLE-3) of the sweep that did not speculate (no acceptance
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
    confidence: float | None = None  # the interval's own confidence (compare.family), where it has one

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
    machine: MachineSpeeds | None = None  # the two runs' machine speeds (gate/machine.py)

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
    noise = repeat_noise(base)
    own = {k: n for k, n in repeat_noise(sweep, source="sweep").items() if k[1] in MACHINE_PACED}
    pooled = pooled_speedups(ref, cur, common)
    noisy = sum(1 for k in common for m in METRICS if m.noisy and ref[k].metrics.get(m.name) and cur[k].metrics.get(m.name))
    noisy += len(pooled)
    each = config.model_copy(update={"bootstrap": family(config.bootstrap, noisy)})
    checks = [chk for k in common for chk in _check_cell(ref[k], cur[k], each, noise, own)]
    for name, (then, now, carried) in pooled.items():
        spread = pooled_cv([then])
        noise_here = widest(Noise(spread, "repeats", len(then)) if spread else None,
                            Noise(carried, "runs", 0) if carried else None)
        checks.append(judge(name, POOLED_SPEEDUP, then, now, each.thresholds.speedup, each.bootstrap, noise_here))
    speeds = machine_speeds(sweep, base, config)
    set_aside(checks, speeds)
    return GateResult(
        checks=checks,
        missing=[k.name for k in sorted(ref, key=CellKey.sort_key) if k not in cur],
        new=[k.name for k in sorted(cur, key=CellKey.sort_key) if k not in ref],
        sweep=sweep_label, baseline=baseline_label, config=config,
        notes=[speeds.note] + _provenance_notes(sweep, base) + _tau_notes(base, sweep, common)
        + _family_note(config, each, noisy), machine=speeds,
    )


def set_aside(checks: list[Check], speeds: MachineSpeeds) -> None:
    """Between runs of different machine speeds (gate/machine.py), each judged absolute check (ABSOLUTE) is
    skipped, its change kept in its note; a failed or unmeasured cell fails all the same."""
    if speeds.comparable:
        return
    for chk in checks:
        if chk.metric.name in ABSOLUTE and chk.method in ("bootstrap", "plain"):
            change = "" if chk.change is None else f"{100 * chk.change:+.1f}%, "
            chk.note = f"{change}not gated: {speeds.words()}"
            chk.method, chk.verdict, chk.change, chk.ci, chk.confidence = "not comparable", "skipped", None, None, None


def pooled_speedups(ref: dict[CellKey, CellValues], cur: dict[CellKey, CellValues],
                    common: list[CellKey]) -> dict[str, tuple[list[float], list[float], float]]:
    """Per speculative mode, engine and concurrency with 2 or more suites on both sides: the baseline's and the
    sweep's speedup over the suites (per repeat, the geometric mean of the suites' speedups, over the repeats every
    suite has), and the largest run-to-run noise a cell of it carries (`--noise-from`; 0: none)."""
    groups: dict[tuple[str, str, int], list[CellKey]] = {}
    for k in common:
        if k.mode in SPECULATIVE and all(side[k].metrics.get("speedup") and min(side[k].metrics["speedup"]) > 0
                                         for side in (ref, cur)):
            groups.setdefault((k.engine, k.mode, k.concurrency), []).append(k)
    out = {}
    for (engine, mode, c), keys in groups.items():
        if len(keys) < 2:
            continue
        sides = []
        for side in (ref, cur):
            n = min(len(side[k].metrics["speedup"]) for k in keys)
            logs = np.log([side[k].metrics["speedup"][:n] for k in keys])
            sides.append([float(x) for x in np.exp(logs.mean(axis=0))])
        carried = max(ref[k].noise.get("speedup", 0.0) for k in keys)
        out[f"{engine}/{mode}/{len(keys)}-suites/c{c}"] = (sides[0], sides[1], carried)
    return out


def family(boot: Bootstrap, checks: int) -> Bootstrap:
    """The settings each of `checks` noisy checks is judged with, so that together they hold the configured
    confidence (Bonferroni): a rerun of the same code fails none of them with at least that probability, where one
    check at 95% each would fail one of a demo's 50 now and then."""
    if checks <= 1:
        return boot
    return boot.model_copy(update={"confidence": 1 - (1 - boot.confidence) / checks})


def _family_note(config: GateConfig, each: GateConfig, checks: int) -> list[str]:
    if checks <= 1:
        return []
    return [f"each of the {checks} noise-aware checks takes a {level(each.bootstrap.confidence)} interval, so that a "
            f"rerun of the same code passes all of them with {level(config.bootstrap.confidence)} confidence"]


def level(confidence: float) -> str:
    """A confidence as a percentage with the digits it needs: 95%, 99.9%."""
    return f"{100 * confidence:.4g}%"


def _check_cell(ref: CellValues, cur: CellValues, config: GateConfig,
                noise: dict[tuple[tuple[str, str, int], str], Noise],
                own: dict[tuple[tuple[str, str, int], str], Noise]) -> list[Check]:
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
            out.append(judge(name, m, base, current, threshold, config.bootstrap, noise_of(ref, m.name, noise, own)))
    return out


def _tau_check(name: str, ref: CellValues, cur: CellValues, threshold: float, boot: Bootstrap) -> Check:
    """τ like with like (gate/tau.py): tight where both cells verified one width, else skipped with the sentence
    that says why not."""
    pair = comparable(ref, cur)
    if isinstance(pair, str):
        return Check(name, METRICS[2], "not comparable", "skipped", threshold, ref.metrics["acceptance_length"],
                     cur.metrics["acceptance_length"], note=pair)
    check = judge(name, METRICS[2], pair.base, pair.current, threshold, boot)
    check.note = f"both verified {pair.width}" if pair.width else ""
    return check


def _tau_notes(base: Baseline, sweep: Baseline, common: list[CellKey]) -> list[str]:
    """One sentence where the baseline's speculative cells (SPECULATIVE) differ from the sweep's in width policy or τ
    definition."""
    cur = {c.key: c for c in sweep.cells}
    ref = {c.key: c for c in base.cells}
    spec = [k for k in common if k.mode in SPECULATIVE]
    out = []
    widths = sorted({(str(verified_width(ref[k])), str(verified_width(cur[k]))) for k in spec
                     if verified_width(ref[k]) != verified_width(cur[k]) or verified_width(cur[k]) == "auto"})
    if widths:
        pairs = ", ".join(f"{a} against {b}" for a, b in widths).replace("None", "none recorded")
        out.append(f"the baseline's speculative cells and the sweep's were not all verified at one fixed width ({pairs}): "
                   "their τ is not compared (docs/acceptance.md); serve both with one --verify-width")
    defs = sorted({(tuple(sorted(definitions(ref[k]))), tuple(sorted(definitions(cur[k])))) for k in spec
                   if definitions(ref[k]) != definitions(cur[k])})
    if defs:
        words = ", ".join(f"{list(a) or 'none'} against {list(b) or 'none'}" for a, b in defs)
        out.append(f"the baseline's τ was counted under another definition than the sweep's ({words}): τ is not "
                   "compared; export the baseline again with this version")
    return out


def judge(cell: str, metric: Metric, base: list[float], current: list[float], threshold: float,
          boot: Bootstrap | None = None, noise: Noise | None = None) -> Check:
    """The verdict of one metric: bootstrap with repeats on both sides, else the plain or tight threshold. A noisy
    metric's run-to-run noise (gate/noise.py: the baseline's own repeats or runs) is drawn into every bootstrap
    resample; without repeats it widens the plain threshold."""
    boot = boot or Bootstrap()
    cv = noise.cv if noise is not None and metric.noisy else 0.0
    change = _ratio(float(np.mean(current)), float(np.mean(base))) - 1
    sign = 1.0 if metric.higher_is_better else -1.0  # bad = -sign * change
    repeats = min(len(base), len(current)) >= boot.min_repeats
    said = f"the interval covers a {noise.words()}" if cv and noise is not None else ""
    if metric.noisy and repeats and min(base) > 0:
        lo, hi = bootstrap_change(base, current, boot, seed_key=f"{cell}:{metric.name}", noise=cv)
        bad = sorted((-sign * lo, -sign * hi))
        verdict: Verdict = "fail" if bad[0] > threshold + EPS else "improved" if bad[1] < -threshold else "pass"
        return Check(cell, metric, "bootstrap", verdict, threshold, base, current, change, (lo, hi), note=said,
                     confidence=boot.confidence)
    widen = allowance(cv, boot.confidence)
    threshold += widen
    bad_change = -sign * change
    verdict = "fail" if bad_change > threshold + EPS else "improved" if bad_change < -threshold else "pass"
    method = "plain" if metric.noisy else "tight"
    note = (f"threshold widened by {100 * widen:.1f}% for the {noise.words()}" if widen and noise is not None else
            f"{len(base)} vs {len(current)} repeats: plain threshold, not noise-aware" if metric.noisy else "")
    return Check(cell, metric, method, verdict, threshold, base, current, change, note=note)


def bootstrap_change(base: list[float], current: list[float], boot: Bootstrap, seed_key: str = "",
                     noise: float = 0.0) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(current)/mean(base) - 1, each side resampled on its own, and each
    resample moved by a run-to-run shift drawn from the noise figure (log-normal, sd sqrt(2) x noise; 0: none).

    The resampled means' spread around the sample mean is scaled by sqrt(n / (n - 1)), the unbiased
    variance: a plain percentile bootstrap is too narrow at a few repeats (see benchmarks/harness/gate_calibration.py
    and its --unscaled: how often a true change equal to the threshold fails, 3 or 5 repeats, cv 3%).
    Seeded by the configured seed and the check's name, so the same inputs give the same interval."""
    rng = np.random.default_rng([boot.seed, zlib.crc32(seed_key.encode())])
    alpha = (1 - boot.confidence) / 2
    n = max(boot.resamples, math.ceil(TAIL_RESAMPLES / alpha))  # a tail of a family's check still holds resamples
    b_means = resampled_means(np.asarray(base, dtype=float), n, rng)
    c_means = resampled_means(np.asarray(current, dtype=float), n, rng)
    ratios = c_means / b_means
    if noise > 0:
        ratios = ratios * np.exp(rng.normal(0.0, math.sqrt(2) * noise, n))
    lo, hi = np.quantile(ratios, [alpha, 1 - alpha])
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
