"""The CI regression gate: a sweep against a baseline, cell by cell and metric by metric.

    dflash-bench gate SWEEP_DIR --baseline BASELINE [--thresholds gate.toml] [--junit FILE] [--markdown FILE]
    dflash-bench gate --export-baseline SWEEP_DIR -o baseline.json

Cells match on (engine, mode, suite, concurrency); the repeats of a cell are its samples. Each metric is
judged by the relative change of its mean, current / baseline - 1, against a threshold (the largest
change in the bad direction that still passes):

- tight: acceptance length, and the lossless exact-match rate and task accuracy where the sweep has them
  (nearly deterministic at temperature 0).
- bootstrap: output throughput, TPOT p50 and speedup when both sides have repeats: a seeded percentile
  bootstrap interval of the ratio of means; the check fails only when the whole interval is past the
  threshold, so run-to-run noise does not fail a build.
- plain: the same noisy metrics without repeats: the single change against the threshold, labelled so.

A cell that failed in the sweep fails every metric its baseline has. Exit codes: 0 pass, 1 regression,
2 unusable input (a UserError: missing or corrupt baseline, bad thresholds, nothing in common).
"""

from __future__ import annotations

import tomllib
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dflash_bench.errors import UserError
from dflash_bench.gate_baseline import (  # noqa: F401  (re-exported: the gate's public names live here)
    Baseline, CellValues, Key, cell_name, collect, export_baseline, load_baseline,
)

EPS = 1e-9  # a change exactly at the threshold passes, whatever the float rounding


@dataclass(frozen=True)
class Metric:
    name: str  # key in a baseline's metrics
    label: str
    threshold: str  # field of Thresholds
    higher_is_better: bool
    noisy: bool  # noise-aware (bootstrap with repeats), else tight
    optional: bool = False  # not measured in the sweep: skipped rather than failed


METRICS = (
    Metric("output_throughput", "output throughput", "throughput", True, True),
    Metric("tpot_ms_p50", "TPOT p50", "tpot", False, True),
    Metric("acceptance_length", "acceptance length", "acceptance_length", True, False),
    Metric("speedup", "speedup", "speedup", True, True),
    Metric("exact_match_rate", "lossless exact match", "exact_match", True, False, optional=True),
    Metric("accuracy", "task accuracy", "accuracy", True, False, optional=True),
)

# ---------------------------------------------------------------- thresholds (gate.toml)

Fraction = Annotated[float, Field(ge=0, lt=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Thresholds(_Strict):
    """Largest relative change in the bad direction that still passes (0.05 = 5%)."""

    acceptance_length: Fraction = 0.02
    throughput: Fraction = 0.05
    tpot: Fraction = 0.05
    speedup: Fraction = 0.05
    exact_match: Fraction = 0.02
    accuracy: Fraction = 0.05


class Bootstrap(_Strict):
    resamples: int = Field(2000, ge=100, le=200_000)
    confidence: float = Field(0.95, gt=0.5, lt=1)
    seed: int = 0
    min_repeats: int = Field(2, ge=2)  # on both sides, else the plain threshold


class CellsPolicy(_Strict):
    fail_on_missing: bool = False  # a baseline cell absent from the sweep fails the gate


class GateConfig(_Strict):
    thresholds: Thresholds = Field(default_factory=Thresholds)
    bootstrap: Bootstrap = Field(default_factory=Bootstrap)
    cells: CellsPolicy = Field(default_factory=CellsPolicy)


def load_config(path: Path | None) -> GateConfig:
    """The gate's settings from a TOML file (see examples/gate.toml); defaults without one."""
    if path is None:
        return GateConfig()
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"thresholds file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read thresholds file {path}: {err}") from None
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"thresholds file {path} is not valid TOML ({err})") from None
    try:
        return GateConfig.model_validate(data)
    except ValidationError as err:
        e = err.errors()[0]
        loc = ".".join(str(x) for x in e.get("loc", ()))
        raise UserError(f"thresholds file {path}: {loc}: {e.get('msg')}; see examples/gate.toml") from None


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
    common = sorted(k for k in ref if k in cur)
    if not common:
        raise UserError(f"the sweep and the baseline have no cell in common (sweep: {_some(cur)}; "
                        f"baseline: {_some(ref)}): they measured different plans")
    checks = [chk for k in common for chk in _check_cell(ref[k], cur[k], config)]
    return GateResult(
        checks=checks,
        missing=[cell_name(k) for k in sorted(ref) if k not in cur],
        new=[cell_name(k) for k in sorted(cur) if k not in ref],
        sweep=sweep_label, baseline=baseline_label, config=config,
        notes=_provenance_notes(sweep, base),
    )


def _check_cell(ref: CellValues, cur: CellValues, config: GateConfig) -> list[Check]:
    name = cell_name(ref.key)
    out = []
    for m in METRICS:
        base = ref.metrics.get(m.name)
        if not base:
            continue
        threshold = getattr(config.thresholds, m.threshold)
        current = cur.metrics.get(m.name, [])
        if cur.failed:
            why = "; ".join(f"{cid}: {reason}" for cid, reason in cur.failed.items())
            out.append(Check(name, m, "failed cell", "fail", threshold, base, current, note=f"failed in the sweep ({why})"))
        elif not current:
            verdict: Verdict = "skipped" if m.optional else "fail"
            out.append(Check(name, m, "not measured", verdict, threshold, base, [], note="not measured in the sweep"))
        else:
            out.append(judge(name, m, base, current, threshold, config.bootstrap))
    return out


def judge(cell: str, metric: Metric, base: list[float], current: list[float], threshold: float,
          boot: Bootstrap | None = None) -> Check:
    """The verdict of one metric: bootstrap with repeats on both sides, else the plain or tight threshold."""
    boot = boot or Bootstrap()
    change = _ratio(np.mean(current), np.mean(base)) - 1
    sign = 1.0 if metric.higher_is_better else -1.0  # bad = -sign * change
    repeats = min(len(base), len(current)) >= boot.min_repeats
    if metric.noisy and repeats and min(base) > 0:
        lo, hi = bootstrap_change(base, current, boot, seed_key=f"{cell}:{metric.name}")
        bad = sorted((-sign * lo, -sign * hi))
        verdict: Verdict = "fail" if bad[0] > threshold + EPS else "improved" if bad[1] < -threshold else "pass"
        return Check(cell, metric, "bootstrap", verdict, threshold, base, current, change, (lo, hi))
    bad_change = -sign * change
    verdict = "fail" if bad_change > threshold + EPS else "improved" if bad_change < -threshold else "pass"
    method = "plain" if metric.noisy else "tight"
    note = f"{len(base)} vs {len(current)} repeats: plain threshold, not noise-aware" if metric.noisy else ""
    return Check(cell, metric, method, verdict, threshold, base, current, change, note=note)


def bootstrap_change(base: list[float], current: list[float], boot: Bootstrap, seed_key: str = "") -> tuple[float, float]:
    """Percentile bootstrap interval of mean(current)/mean(base) - 1, each side resampled on its own.

    The resampled means' spread around the sample mean is scaled by sqrt(n / (n - 1)), the unbiased
    variance: a plain percentile bootstrap is too narrow at a few repeats (see benchmarks/gate_calibration.py
    and its --unscaled: how often a true change equal to the threshold fails, 3 or 5 repeats, cv 3%).
    Seeded by the configured seed and the check's name, so the same inputs give the same interval."""
    rng = np.random.default_rng([boot.seed, zlib.crc32(seed_key.encode())])
    b_means = _resampled_means(np.asarray(base, dtype=float), boot.resamples, rng)
    c_means = _resampled_means(np.asarray(current, dtype=float), boot.resamples, rng)
    alpha = (1 - boot.confidence) / 2
    lo, hi = np.quantile(c_means / b_means, [alpha, 1 - alpha])
    return float(lo) - 1, float(hi) - 1


def _resampled_means(x: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    means = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    return x.mean() + (means - x.mean()) * np.sqrt(len(x) / (len(x) - 1))


def _ratio(a: float, b: float) -> float:
    if b == 0:
        return 1.0 if a == 0 else float("inf") * np.sign(a)
    return float(a / b)


def _some(cells: dict[Key, Any], n: int = 4) -> str:
    names = [cell_name(k) for k in sorted(cells)]
    if not names:
        return "none"
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


PLAN_SETTINGS = {"engines", "suites", "concurrency", "repeats", "runner", "url_ar", "url_dflash"}


def _provenance_notes(sweep: Baseline, base: Baseline) -> list[str]:
    """What differs in models, hardware and measuring settings: shown, never failed on."""
    notes = []
    for section in ("models", "hardware", "settings"):
        a, b = sweep.provenance.get(section) or {}, base.provenance.get(section) or {}
        if not (a and b and isinstance(a, dict) and isinstance(b, dict)):
            continue
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and k not in PLAN_SETTINGS)
        if diff:
            notes.append(f"{section} differ from the baseline's: {', '.join(diff[:6])}" + (" ..." if len(diff) > 6 else ""))
    return notes


# ---------------------------------------------------------------- the command


def gate(sweep_dir: Path | str, baseline: Path | str, config: GateConfig | None = None) -> GateResult:
    """Load both sides and compare them."""
    base = load_baseline(baseline)
    sweep = collect(sweep_dir)
    return compare(sweep, base, config, sweep_label=str(sweep_dir), baseline_label=str(baseline))


def main(sweep_dir: Path, *, baseline: Path | None = None, export: bool = False, output: Path | None = None,
         thresholds: Path | None = None, junit: Path | None = None, markdown: Path | None = None) -> int:
    """The `gate` command: export a baseline, or gate a sweep and write the reports; returns the exit code."""
    from dflash_bench import gate_output

    if export:
        if output is None:
            raise UserError("--export-baseline needs -o FILE, the baseline file to write")
        if baseline or thresholds or junit or markdown:
            raise UserError("--export-baseline only writes a baseline; leave out --baseline, --thresholds, --junit and --markdown")
        written = export_baseline(sweep_dir, output)
        gate_output.print_export(written, output)
        return 0
    if output is not None:
        raise UserError("-o is for --export-baseline; use --junit FILE or --markdown FILE for the gate's reports")
    if baseline is None:
        raise UserError("give --baseline, a sweep folder or a file written by `dflash-bench gate --export-baseline`")
    config = load_config(thresholds)
    result = gate(sweep_dir, baseline, config)
    gate_output.print_table(result)
    if junit is not None:
        gate_output.write_junit(result, junit)
    if markdown is not None:
        gate_output.write_markdown(result, markdown)
    return result.exit_code
