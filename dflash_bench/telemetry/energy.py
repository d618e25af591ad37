"""Energy of a measured window from its GPU samples, and energy per output token.

Energy comes from the GPU's total-energy counter (last minus first reading) where every GPU has one;
otherwise from power integrated over time (trapezoids), which is valid only when the samples have no
gap longer than `max_gap_s`. Both numbers are kept where both exist, as a cross-check. Several GPUs add up.

A window too short for its source is invalid, with the reason, and has no energy per token: fewer than
MIN_SAMPLES samples of a GPU (either source), or a counter that moved fewer times than it updates in a second
(its update rate read from the window itself: a counter that updates every 100 ms needs a window of ~1 s).
`--min-cell-seconds` lengthens a cell until its energy can be measured.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from dflash_bench.store.telemetry_csv import Sample
from dflash_bench.telemetry.nvml import SLOWDOWN_MASK, throttle_names


MIN_SAMPLES = 10  # telemetry samples of each GPU a window needs before its energy is worth a number
LENGTHEN = "--min-cell-seconds lengthens a cell"


def default_max_gap(interval_s: float) -> float:
    """The longest pause between samples that still integrates well: 5 missed ticks, at least 0.5 s."""
    return max(5 * interval_s, 0.5)


def trapezoid(ts: list[float], ys: list[float]) -> float:
    """∫ y dt by the trapezoid rule over points sorted by t."""
    return sum((ts[i] - ts[i - 1]) * (ys[i] + ys[i - 1]) / 2 for i in range(1, len(ts)))


def find_gaps(ts: list[float], max_gap_s: float, window_s: float | None = None) -> list[tuple[float, float]]:
    """(start, length) of every pause longer than `max_gap_s`, the window's edges (0, window_s) included."""
    edges = [0.0, *ts, window_s] if window_s is not None else list(ts)
    return [(a, b - a) for a, b in zip(edges, edges[1:]) if b - a > max_gap_s]


@dataclass
class GpuEnergy:
    gpu: int
    n_samples: int
    duration_s: float  # first to last sample
    counter_j: float | None  # None: no usable counter (counter_note says why)
    counter_note: str
    integrated_j: float | None
    integrated_valid: bool
    integrated_note: str
    power_column: str  # which power reading was integrated
    max_gap_s: float  # longest pause between samples


def gpu_energy(samples: list[Sample], max_gap_s: float, window_s: float | None = None) -> GpuEnergy:
    """Energy of one GPU's samples (all of the same GPU)."""
    ss = sorted(samples, key=lambda s: s.t_s)
    gpu = ss[0].gpu
    duration = ss[-1].t_s - ss[0].t_s
    counter_j, counter_note = _counter(ss)
    column = "power_instant_w" if all(s.power_instant_w is not None for s in ss) else "power_w"
    pts = [(s.t_s, getattr(s, column)) for s in ss if getattr(s, column) is not None]
    ts = [t for t, _ in pts]
    gaps = find_gaps(ts, max_gap_s, window_s)
    longest = max((b - a for a, b in zip(ts, ts[1:])), default=0.0)
    if len(pts) < 2:
        integrated, valid, note = None, False, f"fewer than 2 power readings on GPU {gpu}"
    else:
        integrated = trapezoid(ts, [p for _, p in pts])
        start, length = max(gaps, key=lambda g: g[1]) if gaps else (0.0, 0.0)
        valid = not gaps
        note = "" if valid else (
            f"{len(gaps)} gap(s) in the power samples of GPU {gpu}, the longest {length:.2f} s at "
            f"t={start:.2f} s (limit {max_gap_s:.2f} s)"
        )
        if counter_j is not None and counter_j == 0 and integrated > 1.0:
            counter_j, counter_note = None, f"the energy counter of GPU {gpu} did not move"
    return GpuEnergy(gpu, len(ss), duration, counter_j, counter_note, integrated, valid, note, column, longest)


def _counter(ss: list[Sample]) -> tuple[float | None, str]:
    gpu = ss[0].gpu
    if len(ss) < 2:
        return None, f"fewer than 2 samples on GPU {gpu}"
    if all(s.energy_mj is None for s in ss):
        return None, f"GPU {gpu} has no energy counter"
    if ss[0].energy_mj is None or ss[-1].energy_mj is None:
        return None, f"the energy counter of GPU {gpu} was not read at the window's edges"
    values = [s.energy_mj for s in ss if s.energy_mj is not None]
    if any(b < a for a, b in zip(values, values[1:])):
        return None, f"the energy counter of GPU {gpu} went backwards (driver reloaded?)"
    moves, rate = counter_moves(ss)
    if rate is None or moves < rate:
        said = f"about {rate:.0f} times a second" if rate else "too rarely to tell how often"
        return None, (f"the energy counter of GPU {gpu} moved {moves} times in the window and updates {said}: too "
                      f"short for the counter ({LENGTHEN})")
    return (values[-1] - values[0]) / 1000.0, ""


def counter_moves(ss: list[Sample]) -> tuple[int, float | None]:
    """How often the energy counter moved in the window, and how often it updates (moves per second between
    its first and last move; None with fewer than 2 moves)."""
    read = [s for s in ss if s.energy_mj is not None]
    times = [b.t_s for a, b in zip(read, read[1:]) if b.energy_mj != a.energy_mj]
    if len(times) < 2 or times[-1] <= times[0]:
        return len(times), None
    return len(times), (len(times) - 1) / (times[-1] - times[0])


@dataclass
class EnergySummary:
    """A window's energy and what it cost per token, plus the GPU state that explains it."""

    energy_j: float | None
    source: Literal["counter", "integrated", "none"]
    valid: bool
    reason: str  # why not valid, or why integrated rather than counted; "" when the counter was used
    duration_s: float | None = None
    avg_power_w: float | None = None  # all GPUs together
    peak_power_w: float | None = None  # highest reading of any one GPU
    output_tokens: int = 0
    j_per_token: float | None = None
    tokens_per_j: float | None = None
    energy_counter_j: float | None = None
    energy_integrated_j: float | None = None
    n_samples: int = 0
    max_gap_s: float | None = None
    gpu_util_mean_pct: float | None = None
    sm_clock_mean_mhz: float | None = None
    temp_max_c: int | None = None
    mem_used_max_mib: float | None = None
    throttle_reasons: list[str] = field(default_factory=list)  # every reason seen, idle excluded
    throttled_frac: float | None = None  # share of samples slowed by power, thermal or hardware limits
    per_gpu: list[GpuEnergy] = field(default_factory=list)
    telemetry: str = "on"  # or "off: <why>", the cell summary's `telemetry` field

    def summary_fields(self) -> dict[str, Any]:
        """The energy fields of the cell summary (store.CellSummary)."""
        return {
            "telemetry": self.telemetry,
            "energy_j": self.energy_j,
            "energy_source": self.source,
            "energy_valid": self.valid,
            "energy_note": self.reason or None,
            "avg_power_w": self.avg_power_w,
            "j_per_token": self.j_per_token,
            "tokens_per_j": self.tokens_per_j,
        }

    def extra_fields(self) -> dict[str, Any]:
        """The rest, for the summary's `extra` (flat, so results.csv can carry it)."""
        d = asdict(self)
        for k in set(self.summary_fields()) | {"source", "valid", "reason", "per_gpu", "output_tokens"}:
            d.pop(k, None)
        d["throttle_reasons"] = ";".join(self.throttle_reasons)
        return {f"telemetry_{k}" if not k.startswith("energy") else k: v for k, v in d.items()}


def summarize(
    samples: list[Sample],
    output_tokens: int,
    *,
    interval_s: float = 0.1,
    max_gap_s: float | None = None,
    window_s: float | None = None,
    off_reason: str | None = None,
) -> EnergySummary:
    """Energy, J per output token and GPU state of one window. `window_s` (the window's length, samples
    timed from its start) also flags missing samples at its edges; `off_reason` explains an empty list."""
    if not samples:
        if off_reason:
            return EnergySummary(None, "none", False, f"telemetry off: {off_reason}", output_tokens=output_tokens,
                                 telemetry=f"off: {off_reason}")
        return EnergySummary(None, "none", False, "no telemetry samples", output_tokens=output_tokens)
    max_gap_s = default_max_gap(interval_s) if max_gap_s is None else max_gap_s
    by_gpu: dict[int, list[Sample]] = {}
    for s in samples:
        by_gpu.setdefault(s.gpu, []).append(s)
    per = [gpu_energy(ss, max_gap_s, window_s) for _, ss in sorted(by_gpu.items())]

    counters = [g.counter_j for g in per]
    integrals = [g.integrated_j for g in per]
    counted = sum(j for j in counters if j is not None) if None not in counters else None
    integrated = sum(j for j in integrals if j is not None) if None not in integrals else None
    energy: float | None
    source: Literal["counter", "integrated", "none"]
    if counted is not None:
        energy, source, valid, reason = counted, "counter", True, ""
    else:
        notes = [g.counter_note for g in per if g.counter_note]
        notes += [g.integrated_note for g in per if g.integrated_note]
        energy, source = integrated, ("integrated" if integrated is not None else "none")
        valid = integrated is not None and all(g.integrated_valid for g in per)
        reason = "; ".join(notes)

    few = [g for g in per if g.n_samples < MIN_SAMPLES]
    if few:
        valid = False
        reason = "; ".join([f"only {g.n_samples} telemetry samples of GPU {g.gpu} in the window (fewer than "
                            f"{MIN_SAMPLES}): too short to measure energy ({LENGTHEN})" for g in few]
                           + ([reason] if reason else []))
    duration = max(g.duration_s for g in per)
    out = EnergySummary(energy, source, valid, reason, duration_s=duration, output_tokens=output_tokens)
    out.energy_counter_j, out.energy_integrated_j = counted, integrated
    out.per_gpu, out.n_samples = per, len(samples)
    out.max_gap_s = max(g.max_gap_s for g in per)
    if energy is not None and duration > 0:
        out.avg_power_w = energy / duration
    if energy is not None and valid and output_tokens > 0:  # an invalid window shows no energy per token
        out.j_per_token = energy / output_tokens
        out.tokens_per_j = output_tokens / energy if energy > 0 else None
    _gpu_state(out, samples)
    return out


def _gpu_state(out: EnergySummary, samples: list[Sample]) -> None:
    def col(name: str) -> list:
        return [getattr(s, name) for s in samples if getattr(s, name) is not None]

    powers = col("power_instant_w") + col("power_w")
    out.peak_power_w = max(powers) if powers else None
    util, clock, temp, mem = col("gpu_util_pct"), col("sm_clock_mhz"), col("temp_c"), col("mem_used_mib")
    out.gpu_util_mean_pct = sum(util) / len(util) if util else None
    out.sm_clock_mean_mhz = sum(clock) / len(clock) if clock else None
    out.temp_max_c = max(temp) if temp else None
    out.mem_used_max_mib = max(mem) if mem else None
    masks = col("throttle_reasons")
    if masks:
        seen = 0
        for m in masks:
            seen |= m
        out.throttle_reasons = [n for n in throttle_names(seen) if n != "gpu_idle"]
        out.throttled_frac = sum(1 for m in masks if m & SLOWDOWN_MASK) / len(masks)
