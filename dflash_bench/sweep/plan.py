"""What a sweep will do: its cells from checked settings (sweep/check.py), the order it runs them in, and resume checks."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from typing import TYPE_CHECKING, Any

from dflash_bench.errors import UserError
from dflash_bench.profiles import base as base_profile
from dflash_bench.store import CellPlan, SweepSettings

if TYPE_CHECKING:
    from dflash_bench.models import ModelPair
    from dflash_bench.synthetic import SyntheticProfile

__all__ = ["MODES", "Launch", "SweepSettings", "check_resume", "launches", "plan_cells", "resolve_pair"]

MODES = base_profile.MODES


@dataclass(frozen=True)
class Launch:
    """One server lifetime: an (engine, mode) and the consecutive cells measured on it."""

    engine: str
    mode: str
    cells: tuple[CellPlan, ...]
    slots: int | None = None  # the concurrency of every cell, for an engine whose slots follow it (slots_per_cell)
    # the acceptance profile its DFlash server draws (paired: its group's, which an AR server does not take)
    synthetic: SyntheticProfile | None = None


def resolve_pair(settings: SweepSettings) -> ModelPair:
    """The target/drafter pair the settings name (--model, and --drafter kept in engine_options)."""
    from dflash_bench import models

    return models.resolve(settings.model, drafter=settings.engine_options.get("drafter"),
                          eagle3=settings.engine_options.get("eagle3"))


def plan_cells(settings: SweepSettings) -> list[CellPlan]:
    """engine x repeat x mode x suite x concurrency, in run order (paired: mode innermost).

    Modes alternate with the repeat (AR, DFlash, then DFlash, AR, ...; with --modes ar,dflash,eagle3 the three in
    turn, then reversed) so that slow drift of the machine (clocks, temperature) lands on every mode equally;
    consecutive cells of one mode share a launch. Paired, both modes' servers run together and each (suite,
    concurrency) is measured AR then DFlash, seconds apart. The settings are checked ones (sweep/check.py).
    """
    out = []
    suites = [(suite, None) for suite in settings.suites] + [(long_suite(n), n) for n in settings.input_lens]
    drawn = synthetic_profiles(settings, [suite for suite, _ in suites])
    arms: list[bool | None] = [False, True] if settings.thinking_both else [None]
    keys = [(suite, n, arm, c) for suite, n in suites for arm in arms for c in settings.concurrency]
    for engine in settings.engines:
        if _slots_per_cell(engine):  # a server per concurrency: its cells consecutive
            keys = sorted(keys, key=lambda k: k[3])
        for repeat in range(settings.repeats):
            modes = settings.modes if repeat % 2 == 0 else settings.modes[::-1]
            order = [(m, k) for k in keys for m in modes] if settings.paired else [(m, k) for m in modes for k in keys]
            for mode, (suite, n, arm, c) in order:
                out.append(CellPlan(engine=engine, mode=mode, suite=suite, concurrency=c, repeat=repeat, input_len=n,
                                    thinking_asked=arm, synthetic=drawn.get((mode, suite))))
    return out


def synthetic_profiles(settings: SweepSettings, suites: list[str]) -> dict[tuple[str, str], SyntheticProfile]:
    """(mode, suite) -> the acceptance profile that mode's server draws for the suite's cells under
    --synthetic-acceptance (synthetic.py): DFlash's over its block, an EAGLE-3 server's the same tau over its own
    draft length; none without the option, nor for AR."""
    if settings.synthetic_acceptance is None:
        return {}
    from dflash_bench.synthetic import for_draft, suite_profile

    pair = resolve_pair(settings)
    out = {}
    for suite in suites:
        drawn = suite_profile(settings.synthetic_acceptance, pair, suite)
        if drawn is not None:
            out["dflash", suite] = drawn
            if "eagle3" in settings.modes:
                out["eagle3", suite] = for_draft(drawn, pair.eagle3_tokens)
    return out


def long_suite(n: int) -> str:
    """The suite of the --input-len axis at n tokens: long-4k, long-1000 (longctx.build_prompts' name)."""
    from dflash_bench.longctx import length_label

    return f"long-{length_label(n)}"


def launches(plan: list[CellPlan], pending_only: bool = True, paired: bool = False) -> list[Launch]:
    """Group the plan into server lifetimes: consecutive cells of one (engine, mode); paired, one lifetime per
    (engine, mode) over the engine's consecutive cells (its two servers run together: `launch.servers_up`)."""
    cells = [c for c in plan if c.status in ("pending", "running", "failed")] if pending_only else list(plan)
    if not paired:
        return [Launch(engine, mode, tuple(group), slots, synthetic)
                for (engine, mode, slots, synthetic), group in groupby(cells, key=_launch_key)]
    # an engine's two servers start together, so a new DFlash profile (card: each suite's) relaunches both: an AR
    # cell goes with the profile its DFlash cell draws
    drawn = {c.pair_key(): c.synthetic for c in cells if c.mode == "dflash"}
    out = []
    for (engine, slots, synthetic), group in groupby(cells, key=lambda c: (c.engine, _slots(c), drawn.get(c.pair_key()))):
        mine = list(group)
        out += [Launch(engine, mode, tuple(c for c in mine if c.mode == mode), slots, synthetic)
                for mode in MODES if any(c.mode == mode for c in mine)]
    return out


def _slots_per_cell(engine: str) -> bool:
    from dflash_bench import profiles

    return profiles.get(engine).slots_per_cell


def _launch_key(c: CellPlan) -> tuple[str, str, int | None, SyntheticProfile | None]:
    """(engine, mode, slots, synthetic profile): one server lifetime; slots is the concurrency where the engine's
    slots follow it; a DFlash server draws one profile (with `card`, a suite's)."""
    return c.engine, c.mode, _slots(c), c.synthetic


def _slots(c: CellPlan) -> int | None:
    return c.concurrency if _slots_per_cell(c.engine) else None



def check_resume(saved: SweepSettings | dict[str, Any] | None, current: SweepSettings) -> None:
    """Refuse to resume when what is measured differs; name the first differing settings."""
    if saved is None:
        raise UserError("cannot resume: the folder's manifest records no sweep settings (it was written by "
                        "`dflash-bench run`, not `sweep`); start a new sweep")
    saved = saved.identity() if isinstance(saved, SweepSettings) else saved
    now = current.identity()
    diff = [k for k in sorted(set(saved) | set(now)) if k not in current.RESUME_FREE and saved.get(k) != now.get(k)]
    if diff:
        shown = ", ".join(f"{k} (sweep: {saved.get(k)!r}, now: {now.get(k)!r})" for k in diff[:3])
        raise UserError(f"cannot resume: the settings differ from the sweep's manifest: {shown}; "
                        "drop those options to reuse the saved ones, or start a new sweep")
