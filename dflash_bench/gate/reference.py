"""τ of every engine against the builtin engine's, the reference, on the same target and drafter.

The builtin engine runs z-lab's DFlash step for step, so when a sweep (or the folders given to `report`) holds
the same pair measured on it and on another engine (vLLM, SGLang, llama.cpp), the other engine's τ should
match it. They are compared per suite, concurrency, prompt length and thinking arm, the DFlash cells' repeats
being the samples; `report` shows every comparison and `gate` fails when another engine under-accepts.

What is comparable: both cells complete with a τ counted under the same definition (CellSummary
`acceptance_definition`, metrics/definitions.py), at the same verify width (vLLM, SGLang and the emulator verify
the whole block, as the builtin engine's `--verify-width full`, or `auto` where every step took the whole block;
other widths are not compared: gate/tau.py), neither drawn by synthetic acceptance, and the same target
and drafter (the ids in a folder's manifest) asked the same requests (SAME_REQUESTS); a folder that names no
pair, as `dflash-bench run` writes, is compared only with itself. The engines' own counting differs from the definition (docs/acceptance.md) only upwards: vLLM
and llama.cpp count drafts accepted past the request's end, SGLang counts the prefill's token. So a gap
their counting explains reads as another engine *over*-accepting, never under: the check can miss a small
under-acceptance but does not invent one.

The spread is the gate's one decision (`compare.judge`), the builtin engine's τ as the baseline and the other
engine's as the current value: with `bootstrap.min_repeats` repeats on both engines, the bootstrap interval
of the ratio of mean τ, flagged only when the whole interval is past the tolerance (so the repeats' own spread
widens it); without, the single ratio against the tolerance. The tolerance is the gate's τ threshold
(`thresholds.acceptance_length`, 2%) unless gate.toml's `[reference] tolerance` sets another;
`[reference] check = false` leaves the check out of the gate (the report still shows it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dflash_bench.gate.baseline import Baseline, CellValues, collect
from dflash_bench.gate.compare import Check, Metric, judge
from dflash_bench.gate.config import GateConfig
from dflash_bench.gate.tau import comparable
from dflash_bench.store import CellKey, CellSummary

REFERENCE = "builtin"
# the mode whose τ the reference measures: the builtin engine runs DFlash, and no engine here runs EAGLE-3 step for
# step as its upstream does, so an EAGLE-3 cell's τ has no reference (a cell is matched on its mode: CellKey)
REFERENCE_MODE = "dflash"
# engines whose every verify step checks the whole block: their τ is the builtin engine's under --verify-width full
FULL_BLOCK = ("vllm", "sglang", "emulator")
# what two sweeps of one pair must share for their tau to be pooled: the requests (sampling, length, prompts)
SAME_REQUESTS = ("temperature", "max_tokens", "num_prompts", "seed")
REFERENCE_TAU = Metric("reference_tau", "τ against the builtin engine", "acceptance_length", True, True,
                       explained=True)


@dataclass
class TauComparison:
    """One engine's τ against the builtin engine's in one cell (its key: the builtin DFlash cell, repeat 0)."""

    engine: str
    key: CellKey
    check: Check  # baseline: the builtin engine's τ per repeat; current: the engine's; verdict from judge
    sweeps: tuple[str, ...] = ()  # the sweep ids whose cells were pooled (the same pair and requests)

    @property
    def reference_tau(self) -> float:
        return float(np.mean(self.check.baseline))

    @property
    def tau(self) -> float:
        return float(np.mean(self.check.current))

    @property
    def under(self) -> str | None:
        """The engine that accepts less beyond the spread (None: alike)."""
        return {"fail": self.engine, "improved": REFERENCE}.get(self.check.verdict)

    @property
    def where(self) -> str:
        """The cell in words: suite, concurrency and any other axis it has."""
        k = self.key
        parts = [f"{k.suite} at concurrency {k.concurrency}"]
        if k.input_len:
            parts.append(f"{k.input_len}-token prompts")
        if k.thinking_asked is not None:
            parts.append(f"thinking {'on' if k.thinking_asked else 'off'}")
        return ", ".join(parts)

    def sentence(self) -> str:
        c = self.check
        tail = f"({100 * (c.change or 0.0):+.1f}%, allowed {100 * c.allowed:+.1f}%, {c.method})"
        if self.under == self.engine:
            return (f"{self.engine} under-accepts on {self.where}: τ {self.tau:.3f} against the builtin engine's "
                    f"{self.reference_tau:.3f} {tail}")
        if self.under == REFERENCE:
            return (f"the builtin engine accepts less than {self.engine} on {self.where}: τ {self.reference_tau:.3f} "
                    f"against {self.tau:.3f} {tail}; {self.engine}'s counting may read above the definition")
        return f"{self.engine} accepts as the builtin engine on {self.where}: τ {self.tau:.3f} against {self.reference_tau:.3f}"


@dataclass
class ReferenceResult:
    comparisons: list[TauComparison] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)  # sentences: why a cell both engines have is not compared

    @property
    def under_accepting(self) -> list[TauComparison]:
        """Cells where another engine accepts less than the reference beyond the spread."""
        return [c for c in self.comparisons if c.under not in (None, REFERENCE)]


def tolerance(config: GateConfig) -> float:
    t = config.reference.tolerance
    return config.thresholds.acceptance_length if t is None else t


def compare_sweeps(sweeps: list[Baseline], config: GateConfig | None = None) -> ReferenceResult:
    """Every engine's DFlash τ against the builtin engine's, over the sweeps' cells of the same pair."""
    config = config or GateConfig()
    out = ReferenceResult()
    for ids, cells in _by_pair(sweeps).values():
        for rest, engines in sorted(_by_cell(cells).items(), key=lambda kv: kv[0].sort_key()):
            ref = engines.pop(REFERENCE, None)
            if ref is None:
                continue
            for engine, other in sorted(engines.items()):
                _compare_one(ref, other, engine, rest, tuple(ids), config, out)
    return out


def compare_folders(paths: list[Path], config: GateConfig | None = None, quiet: bool = False,
                    summaries: list[list[CellSummary]] | None = None) -> ReferenceResult:
    """`compare_sweeps` over sweep folders (`summaries`: each folder's, where the caller has read them already)."""
    read = summaries if summaries is not None else [None] * len(paths)
    return compare_sweeps([collect(p, quiet=quiet, summaries=s) for p, s in zip(paths, read)], config)


def reference_checks(sweep: Baseline, config: GateConfig) -> list[Check]:
    """The gate's checks: one per engine and cell compared with the builtin engine (none when turned off)."""
    if not config.reference.check:
        return []
    return [c.check for c in compare_sweeps([sweep], config).comparisons]


def _compare_one(ref: CellValues, other: CellValues, engine: str, key: CellKey, sweeps: tuple[str, ...],
                 config: GateConfig, out: ReferenceResult) -> None:
    name = f"{engine} vs {REFERENCE}/{key.suite}/c{key.concurrency}" + (f"/{key.input_len}" if key.input_len else "") \
        + ("" if key.thinking_asked is None else "/think" if key.thinking_asked else "/nothink")
    why = _not_comparable(ref, other)
    if why:
        out.not_compared.append(f"{name}: {why}")
        return
    full = other.model_copy(update={"width_policy": other.width_policy or "full"}) if engine in FULL_BLOCK else other
    pair = comparable(ref, full, "the builtin engine", engine)
    if isinstance(pair, str):
        out.not_compared.append(f"{name}: {pair}")
        return
    check = judge(name, REFERENCE_TAU, pair.base, pair.current, tolerance(config), config.bootstrap)
    comparison = TauComparison(engine=engine, key=key, check=check, sweeps=sweeps)
    check.note = comparison.sentence() + (f" (both verified {pair.width})" if pair.width else "")
    out.comparisons.append(comparison)


def _not_comparable(ref: CellValues, other: CellValues) -> str | None:
    for side, cell in ((REFERENCE, ref), (other.engine, other)):
        if not cell.metrics.get("acceptance_length"):
            return f"{side} has no τ there"
        if cell.metrics.get("synthetic_acceptance"):
            return f"{side}'s τ there was drawn by synthetic acceptance"
    a = set(ref.metrics.get("acceptance_definition", []))
    if len(a) != 1:
        return f"the builtin engine's τ was counted under {'several definitions' if a else 'no recorded definition'}"
    return None


def _by_pair(sweeps: list[Baseline]) -> dict[tuple, tuple[list[str], list[CellValues]]]:
    """The sweeps' ids and complete DFlash cells, grouped by target, drafter and SAME_REQUESTS (a sweep naming no
    pair alone)."""
    out: dict[tuple, tuple[list[str], list[CellValues]]] = {}
    for i, s in enumerate(sweeps):
        m, st = s.provenance.models, s.provenance.settings
        how = tuple(getattr(st, f) for f in SAME_REQUESTS) if st is not None else ()
        pair: tuple = (m.target.id, m.drafter.id, *how) if m.target and m.drafter else ("unnamed", i)
        ids, cells = out.setdefault(pair, ([], []))
        ids.append(s.sweep_id)
        cells.extend(c for c in s.cells if c.mode == REFERENCE_MODE and c.repeats)
    return out


def _by_cell(cells: list[CellValues]) -> dict[CellKey, dict[str, CellValues]]:
    """Per cell (engine left out), per engine: the cell's repeats, those of several sweeps pooled."""
    out: dict[CellKey, dict[str, CellValues]] = {}
    for c in cells:
        key = CellKey(**{**c.key.model_dump(exclude={"cell_id"}), "engine": REFERENCE})
        per = out.setdefault(key, {})
        if c.engine not in per:
            per[c.engine] = c.model_copy(deep=True)
            continue
        pooled = per[c.engine]
        pooled.repeats += c.repeats
        pooled.profiles += c.profiles
        pooled.widths = sorted({*pooled.widths, *c.widths})
        for metric, values in c.metrics.items():
            pooled.metrics.setdefault(metric, []).extend(values)
    return out
