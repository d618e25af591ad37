"""The serving team's question: at our interactivity target, how much does each side serve per GPU?

    slo = parse_slo("tok_s_user=30,ttft_p90_ms=2000,tpot_p90_ms=40")
    result = compare(ar_points, dflash_points, slo)
    result.headline  # "at >= 30 tok/s/user, AR serves 1,200 tok/s per GPU and DFlash 3,100 (2.58x)"

How a side is read off (`read_off`):
1. Points that break a latency cap (TTFT p90, TPOT p90) are dropped: a cap is a hard limit, and a
   measured point over it cannot be served. A point without the capped figure is dropped too.
2. The Pareto frontier of the rest: throughput per GPU against tok/s/user, both higher is better.
3. The answer is the best throughput with tok/s/user >= X. On the frontier that lies between the two
   points that bracket X: A (the slowest point still >= X) and B (the next one, < X). Between measured
   concurrencies both figures are taken as linear in log(concurrency), so with
   t = (user_A - X) / (user_A - user_B) the throughput is tput_A + t * (tput_B - tput_A) and the
   concurrency exp(log c_A + t * (log c_B - log c_A)). This is a straight line between two measured
   points, never a fit beyond them.
4. Outside the measured range nothing is extrapolated:
   - X above every point's tok/s/user (or every point over a cap): "not_reached", no throughput.
   - X at or below the slowest frontier point: the target holds even at the highest-throughput
     point measured, so its throughput is a lower bound ("lower_bound", shown as ">= A"); the
     sweep should go to higher concurrency to find the real figure.

tok/s/user is whatever statistic the caller passes: the sweep's per-request 1000/TPOT at p50 (the
median user) is the intended one (`points_from_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

from dflash_bench.errors import UserError

_KEYS = {"tok_s_user": "tok/s/user target", "ttft_p90_ms": "TTFT p90 cap (ms)", "tpot_p90_ms": "TPOT p90 cap (ms)"}
_SYNTAX = "tok_s_user=30,ttft_p90_ms=2000,tpot_p90_ms=40 (or 30,tpot_p90_ms=40, or just 30)"


class SloTarget(BaseModel):
    """What the serving team promises each user: a speed floor and optional latency caps."""

    tok_s_user: float = Field(gt=0)
    ttft_p90_ms: float | None = Field(default=None, gt=0)
    tpot_p90_ms: float | None = Field(default=None, gt=0)

    def label(self) -> str:
        parts = [f">= {_num(self.tok_s_user)} tok/s/user"]
        if self.ttft_p90_ms is not None:
            parts.append(f"TTFT p90 <= {_num(self.ttft_p90_ms)} ms")
        if self.tpot_p90_ms is not None:
            parts.append(f"TPOT p90 <= {_num(self.tpot_p90_ms)} ms")
        return ", ".join(parts)


class SloPoint(BaseModel):
    """One measured cell of one side, as the read-off needs it."""

    concurrency: int = Field(gt=0)
    tok_s_gpu: float = Field(ge=0)  # output tokens per second per GPU
    tok_s_user: float = Field(ge=0)
    ttft_p90_ms: float | None = None
    tpot_p90_ms: float | None = None


Status = Literal["measured", "interpolated", "lower_bound", "not_reached"]


class ReadOff(BaseModel):
    """One side's throughput at the target, and how it was found."""

    status: Status
    tok_s_gpu: float | None = None  # None when not reached; a lower bound when status is lower_bound
    concurrency: float | None = None  # measured, or interpolated in log space
    between: tuple[int, int] | None = None  # the bracketing measured concurrencies when interpolated
    best_tok_s_user: float | None = None  # fastest eligible point: how far a "not reached" side falls short
    dropped: list[str] = Field(default_factory=list)  # "c=64: TTFT p90 2400 ms > 2000 ms", ...
    frontier: list[SloPoint] = Field(default_factory=list)


class SloResult(BaseModel):
    slo: SloTarget
    ar: ReadOff
    dflash: ReadOff
    speedup: float | None = None
    speedup_bound: Literal["exact", "at_least", "at_most"] | None = None
    headline: str


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 10 or x == int(x) else f"{x:.3g}"


# ---------------------------------------------------------------- parsing


def parse_slo(text: str) -> SloTarget:
    """`--slo`: "tok_s_user=30,ttft_p90_ms=2000,tpot_p90_ms=40", or a bare number for the tok/s/user target."""
    raw = (text or "").strip()
    if not raw:
        raise UserError(f"--slo is empty: pass {_SYNTAX}.")
    values: dict[str, float] = {}
    for i, part in enumerate(raw.split(",")):
        if not part.strip() and i > 0:
            continue  # a trailing comma
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep and i == 0:  # "30" and "30,tpot_p90_ms=40": the first bare number is the target
            key, value = "tok_s_user", key
        if key not in _KEYS:
            raise UserError(f"--slo has an unknown key {key!r}: use tok_s_user, ttft_p90_ms and tpot_p90_ms, "
                            f"e.g. {_SYNTAX}.")
        if key in values:
            raise UserError(f"--slo gives {key} twice: give each of tok_s_user, ttft_p90_ms, tpot_p90_ms once.")
        try:
            number = float(value)
        except ValueError:
            raise UserError(f"--slo {key}={value!r} is not a number: pass e.g. {_SYNTAX}.") from None
        if not math.isfinite(number) or number <= 0:
            raise UserError(f"--slo {key} must be a positive number, not {value}.")
        values[key] = number
    if "tok_s_user" not in values:
        raise UserError(f"--slo needs a tok/s/user target (tok_s_user=...): pass e.g. {_SYNTAX}.")
    return SloTarget(**values)


def points_from_rows(rows: Iterable[Mapping[str, Any]], gpus: int = 1,
                     user_stat: str = "tok_s_user_p50") -> list[SloPoint]:
    """SloPoints from results.csv rows of ONE side (`store.results_row` of a CellSummary: `output_throughput`,
    `tok_s_user_p50`, `ttft_ms_p90`, `tpot_ms_p90`). Repeats of a concurrency are averaged; rows without
    a throughput or a tok/s/user figure (failed cells) are skipped. `gpus` divides the throughput."""
    if gpus < 1:
        raise ValueError("gpus must be at least 1")
    groups: dict[int, list[Mapping[str, Any]]] = {}
    for row in rows:
        if _num_or_none(row.get("output_throughput")) is None or _num_or_none(row.get(user_stat)) is None:
            continue
        groups.setdefault(int(row["concurrency"]), []).append(row)
    points = []
    for conc, group in sorted(groups.items()):
        points.append(SloPoint(
            concurrency=conc, tok_s_gpu=(_mean(group, "output_throughput") or 0.0) / gpus, tok_s_user=_mean(group, user_stat) or 0.0,
            ttft_p90_ms=_mean(group, "ttft_ms_p90"), tpot_p90_ms=_mean(group, "tpot_ms_p90")))
    return points


def _num_or_none(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _mean(group: list[Mapping[str, Any]], key: str) -> float | None:
    xs = [x for x in (_num_or_none(r.get(key)) for r in group) if x is not None]
    return sum(xs) / len(xs) if xs else None


# ---------------------------------------------------------------- the read-off


def _cap_breach(p: SloPoint, slo: SloTarget) -> str | None:
    for name, cap, got in (("TTFT", slo.ttft_p90_ms, p.ttft_p90_ms), ("TPOT", slo.tpot_p90_ms, p.tpot_p90_ms)):
        if cap is None:
            continue
        if got is None:
            return f"c={p.concurrency}: no {name} p90 measured"
        if got > cap:
            return f"c={p.concurrency}: {name} p90 {_num(got)} ms > {_num(cap)} ms"
    return None


def frontier(points: Iterable[SloPoint]) -> list[SloPoint]:
    """The Pareto frontier of throughput per GPU vs tok/s/user (both higher is better), fastest user first.

    A point is kept unless another is at least as good on both and better on one; of exact ties the
    lowest concurrency stays.
    """
    pts = sorted(points, key=lambda p: (-p.tok_s_user, -p.tok_s_gpu, p.concurrency))
    out: list[SloPoint] = []
    best = -math.inf
    for p in pts:  # walking down in tok/s/user, a point survives only by raising the best throughput
        if p.tok_s_gpu > best:
            out.append(p)
            best = p.tok_s_gpu
    return out


def read_off(points: Iterable[SloPoint], slo: SloTarget) -> ReadOff:
    """One side's throughput per GPU at tok/s/user >= slo.tok_s_user (see the module docstring)."""
    eligible, dropped = [], []
    for p in points:
        why = _cap_breach(p, slo)
        if why:
            dropped.append(why)
        else:
            eligible.append(p)
    front = frontier(eligible)
    if not front:
        return ReadOff(status="not_reached", dropped=dropped)
    x = slo.tok_s_user
    common = {"best_tok_s_user": front[0].tok_s_user, "dropped": dropped, "frontier": front}
    if front[0].tok_s_user < x:
        return ReadOff(status="not_reached", **common)
    above = [p for p in front if p.tok_s_user >= x]
    a = above[-1]  # the slowest frontier point that still meets the target: the most throughput
    if len(above) == len(front):
        status = "measured" if a.tok_s_user == x else "lower_bound"
        return ReadOff(status=status, tok_s_gpu=a.tok_s_gpu, concurrency=a.concurrency, **common)
    if a.tok_s_user == x:
        return ReadOff(status="measured", tok_s_gpu=a.tok_s_gpu, concurrency=a.concurrency, **common)
    b = front[len(above)]
    t = (a.tok_s_user - x) / (a.tok_s_user - b.tok_s_user)
    tput = a.tok_s_gpu + t * (b.tok_s_gpu - a.tok_s_gpu)
    conc = math.exp(math.log(a.concurrency) + t * (math.log(b.concurrency) - math.log(a.concurrency)))
    return ReadOff(status="interpolated", tok_s_gpu=tput, concurrency=conc,
                   between=(a.concurrency, b.concurrency), **common)


# ---------------------------------------------------------------- both sides


def compare(ar: Iterable[SloPoint], dflash: Iterable[SloPoint], slo: SloTarget, unit: str = "per GPU") -> SloResult:
    """Both sides read off at the same target, their ratio, and the one-line headline (throughput `unit`:
    "per GPU", or "per server" where the GPUs of a server are not known)."""
    a, d = read_off(ar, slo), read_off(dflash, slo)
    speedup, bound = None, None
    if a.tok_s_gpu and d.tok_s_gpu is not None and not (a.status == d.status == "lower_bound"):
        speedup = d.tok_s_gpu / a.tok_s_gpu
        # a lower bound on DFlash raises the ratio's floor; a lower bound on AR caps it
        bound = "at_least" if d.status == "lower_bound" else "at_most" if a.status == "lower_bound" else "exact"
    return SloResult(slo=slo, ar=a, dflash=d, speedup=speedup, speedup_bound=bound,
                     headline=headline(slo, a, d, speedup, bound, unit))


def _side(r: ReadOff) -> str:
    if r.tok_s_gpu is None:
        return "cannot"
    return (">= " if r.status == "lower_bound" else "") + _num(r.tok_s_gpu)


def _short(r: ReadOff) -> str:
    if r.best_tok_s_user is None:
        return "no measured point within the latency caps"
    return f"best {_num(r.best_tok_s_user)} tok/s/user"


def headline(slo: SloTarget, ar: ReadOff, dflash: ReadOff, speedup: float | None, bound: str | None,
             unit: str = "per GPU") -> str:
    """"at >= X tok/s/user, AR serves A tok/s per GPU and DFlash B (Nx)", with what is not known said plainly."""
    caps = slo.label().split(", ", 1)
    where = f"at {caps[0]}" + (f" ({caps[1]})" if len(caps) > 1 else "")
    if ar.tok_s_gpu is None and dflash.tok_s_gpu is None:
        return f"{where}, neither side reaches the target (AR {_short(ar)}, DFlash {_short(dflash)})"
    if ar.tok_s_gpu is None:
        return (f"{where}, AR cannot ({_short(ar)}) and DFlash serves {_side(dflash)} tok/s {unit}")
    if dflash.tok_s_gpu is None:
        return (f"{where}, AR serves {_side(ar)} tok/s {unit} and DFlash cannot ({_short(dflash)})")
    text = f"{where}, AR serves {_side(ar)} tok/s {unit} and DFlash {_side(dflash)}"
    if speedup is None:
        return text + " (ratio unknown: both meet the target at every measured concurrency; measure higher)"
    sign = {"at_least": ">= ", "at_most": "<= "}.get(bound or "", "")
    return text + f" ({sign}{speedup:.2f}x)"


# ---------------------------------------------------------------- a sweep's read-off


class SloGroup(BaseModel):
    """The read-off of one AR/DFlash comparison of a sweep: its engine and suite (and any other axis)."""

    group: dict[str, Any]  # the CellKey fields the group shares: engine, suite, ...
    result: SloResult

    @property
    def label(self) -> str:
        return group_label(self.group)


def group_label(group: Mapping[str, Any]) -> str:
    """"vllm / gsm8k / thinking on": an axis a group does not use (None) is left out, and so is input_len,
    which its long-<N> suite names already."""
    return " / ".join(f"thinking {'on' if v else 'off'}" if k == "thinking_asked" else str(v)
                      for k, v in group.items() if v is not None and k != "input_len")


def read_sweep(summaries: Iterable[Any], slo: SloTarget, gpus: int | None = 1) -> list[SloGroup]:
    """Every AR/DFlash comparison of a sweep's complete cells (`store.CellSummary`) read off at `slo`.

    A group is every cell that differs only in mode, concurrency and repeat; each side's points come from its
    results.csv rows (`points_from_rows`, repeats averaged). `gpus`: GPUs per server, dividing throughput
    (None: not known, throughput is per server and the headline says so)."""
    from dflash_bench.store import CellKey, results_row

    fields = [f for f in CellKey.pair_fields() if f not in ("concurrency", "repeat")]
    sides: dict[tuple, dict[str, list[dict[str, Any]]]] = {}
    for s in summaries:
        if s.status not in ("complete", "partial"):
            continue
        key = tuple(getattr(s, f) for f in fields)
        sides.setdefault(key, {}).setdefault(s.mode, []).append(results_row(s))
    out = []
    for key in sorted(sides, key=lambda k: tuple(str(v) for v in k)):
        by_mode = sides[key]
        if "ar" in by_mode and "dflash" in by_mode:
            ar, df = (points_from_rows(by_mode[m], gpus or 1) for m in ("ar", "dflash"))
            result = compare(ar, df, slo, "per GPU" if gpus else "per server")
            out.append(SloGroup(group=dict(zip(fields, key)), result=result))
    return out


HOW_READ = ("Each side's cells over a latency cap are dropped; of the rest, the Pareto frontier of throughput per "
            "GPU against the median user's tok/s (1000 / TPOT p50) is taken, and the throughput at the target is "
            "interpolated between the two measured concurrencies that bracket it, linearly in log concurrency. "
            "Nothing is extrapolated: 'cannot' means no measured concurrency is that fast for its users (the best "
            "reached is given); '>=' means even the highest concurrency measured met the target, so the true "
            "figure is higher (measure more concurrency).")
