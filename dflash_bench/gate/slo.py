"""The SLO as a gated metric: DFlash's throughput at the interactivity target, and its ratio to AR's there.

Both sweeps are read off at the same target (`dflash_bench.slo`), per engine and suite (and any other axis),
from their cells' means over repeats; throughput is per server on both sides, so a ratio of the two is what
is judged, under the throughput and speedup thresholds, like any other metric without repeats (plain).
- DFlash that cannot meet the target in the sweep fails, whatever the baseline did.
- A lower bound (the target met even at the highest concurrency measured) is only a floor: a current lower
  bound under the baseline proves nothing and is skipped with a note; a baseline lower bound is compared as
  its floor (the true baseline is at least that, so falling under it is a regression all the same).
"""

from __future__ import annotations

from dflash_bench.gate.baseline import Baseline, CellValues
from dflash_bench.gate.compare import Check, Metric, judge
from dflash_bench.gate.config import GateConfig
from dflash_bench.slo import SloPoint, SloResult, SloTarget, compare, group_label
from dflash_bench.store import CellKey

SLO_TPUT = Metric("slo_dflash_tok_s", "DFlash tok/s at the SLO", "throughput", True, True)
SLO_SPEEDUP = Metric("slo_speedup", "speedup at the SLO", "speedup", True, True)
NEEDED = ("output_throughput", "tok_s_user_p50")


def slo_checks(sweep: Baseline, base: Baseline, slo: SloTarget, config: GateConfig) -> list[Check]:
    """The two SLO checks of every AR/DFlash group both sides measured."""
    cur, ref = _groups(sweep), _groups(base)
    out: list[Check] = []
    for key in sorted(cur.keys() & ref.keys()):
        name = f"{key} @ SLO"
        now, then = _read(cur[key], slo), _read(ref[key], slo)
        if now is None or then is None:
            why = "the sweep" if now is None else "the baseline (exported before --slo could be read off)"
            out.append(Check(name, SLO_TPUT, "not measured", "skipped", 0.0, [], [],
                             note=f"{why} has no tok/s/user figures to read the SLO off"))
            continue
        out.append(_tput(name, now, then, config))
        out.append(_speedup(name, now, then, config))
    return out


def _groups(b: Baseline) -> dict[str, dict[str, list[CellValues]]]:
    """The cells of each AR/DFlash comparison, by its label (`slo.group_label`, as the sweep's read-off)."""
    fields = [f for f in CellKey.pair_fields() if f not in ("concurrency", "repeat")]
    out: dict[str, dict[str, list[CellValues]]] = {}
    for c in b.cells:
        if c.repeats:
            key = group_label({f: getattr(c, f) for f in fields})
            out.setdefault(key, {}).setdefault(c.mode, []).append(c)
    return {k: v for k, v in out.items() if "ar" in v and "dflash" in v}


def _points(cells: list[CellValues]) -> list[SloPoint] | None:
    if not all(all(c.metrics.get(m) for m in NEEDED) for c in cells):
        return None

    def mean(c: CellValues, m: str) -> float | None:
        xs = c.metrics.get(m)
        return sum(xs) / len(xs) if xs else None
    return [SloPoint(concurrency=c.concurrency, tok_s_gpu=mean(c, "output_throughput") or 0.0,
                     tok_s_user=mean(c, "tok_s_user_p50") or 0.0, ttft_p90_ms=mean(c, "ttft_ms_p90"),
                     tpot_p90_ms=mean(c, "tpot_ms_p90")) for c in cells]


def _read(sides: dict[str, list[CellValues]], slo: SloTarget) -> SloResult | None:
    ar, df = _points(sides["ar"]), _points(sides["dflash"])
    return None if ar is None or df is None else compare(ar, df, slo, "per server")


def _tput(name: str, now: SloResult, then: SloResult, config: GateConfig) -> Check:
    threshold = config.thresholds.throughput
    d, b = now.dflash, then.dflash
    if d.tok_s_gpu is None:
        return Check(name, SLO_TPUT, "not reached", "fail", threshold, [b.tok_s_gpu] if b.tok_s_gpu else [], [],
                     note=f"DFlash cannot meet the SLO in the sweep: {now.headline}")
    if b.tok_s_gpu is None:
        return Check(name, SLO_TPUT, "no baseline", "skipped", threshold, [], [d.tok_s_gpu],
                     note=f"the baseline's DFlash could not meet the SLO: {then.headline}")
    check = judge(name, SLO_TPUT, [b.tok_s_gpu], [d.tok_s_gpu], threshold, config.bootstrap)
    return _floors(check, d.status, b.status, now.headline)


def _speedup(name: str, now: SloResult, then: SloResult, config: GateConfig) -> Check:
    threshold = config.thresholds.speedup
    if now.speedup is None or then.speedup is None:
        return Check(name, SLO_SPEEDUP, "no ratio", "skipped", threshold, [then.speedup] if then.speedup else [],
                     [now.speedup] if now.speedup else [], note=f"no ratio to compare: {now.headline}")
    check = judge(name, SLO_SPEEDUP, [then.speedup], [now.speedup], threshold, config.bootstrap)
    cur = "lower_bound" if now.speedup_bound == "at_least" else "exact"
    return _floors(check, cur, "lower_bound" if then.speedup_bound == "at_least" else "exact", now.headline)


def _floors(check: Check, current: str, baseline: str, headline: str) -> Check:
    """A current lower bound under the baseline proves no regression: skipped, with why."""
    if check.verdict == "fail" and current == "lower_bound":
        check.verdict, check.method = "skipped", "lower bound"
        check.note = f"the sweep's figure is only a floor (measure higher concurrency): {headline}"
    elif baseline == "lower_bound":
        check.note = "the baseline's figure is a floor: compared as such"
    return check
