"""Which τ two cells can be compared on (docs/acceptance.md, "What the gate compares").

τ depends on the pair, the requests and the verify width. So two cells' τ are set against each other only where
they mean the same thing:

- the same width policy (`CellSummary.width_policy`: full, auto or w<N>; another engine's None is its own fixed
  way, the same on both sides of a baseline comparison): τ. Under `auto` the widths follow the load, so τ is
  judged with the run-to-run noise (bootstrap over repeats, the baseline's noise figure), as throughput is;
- different policies, where both cells carry the acceptance profile: τ from the profile over the draft positions
  both verified (`metrics/definitions.py` `profile_tau`), which the widths do not move;
- otherwise, and where the two were counted under different definitions of τ: not comparable, with a sentence
  saying what differs.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_bench.gate.baseline import CellValues
from dflash_bench.metrics.definitions import profile_tau


@dataclass(frozen=True)
class TauPair:
    """What two cells' τ are compared on: `how` is "tau" (per repeat) or "profile" (one value a side)."""

    how: str
    base: list[float]
    current: list[float]
    noisy: bool  # judged with the run-to-run noise (auto width), not the tight threshold
    note: str = ""


def definitions(cell: CellValues) -> set[int]:
    return {int(v) for v in cell.metrics.get("acceptance_definition", [])}


def policy_words(policy: str | None) -> str:
    return f"width policy {policy}" if policy else "no width policy recorded (written before this version recorded it)"


def comparable(base: CellValues, cur: CellValues, base_side: str = "the baseline",
               cur_side: str = "the sweep") -> TauPair | str:
    """The τ values to judge `cur` against `base` by, or one sentence saying why they cannot be."""
    a, b = base.metrics.get("acceptance_length"), cur.metrics.get("acceptance_length")
    if not a or not b:
        return f"{base_side if not a else cur_side} has no τ there"
    da, db = definitions(base), definitions(cur)
    if da != db:
        words = lambda d: ", ".join(str(v) for v in sorted(d)) or "none recorded, an older one"  # noqa: E731
        return (f"τ counted under different definitions: {base_side} {words(da)}, {cur_side} {words(db)} "
                "(docs/acceptance.md); export the baseline again with this version")
    if base.width_policy == cur.width_policy:
        return TauPair("tau", a, b, noisy=cur.width_policy == "auto")
    k = common_positions(base, cur)
    if k:
        ta = [t for p in base.profiles if (t := profile_tau(p, k)) is not None]
        tb = [t for p in cur.profiles if (t := profile_tau(p, k)) is not None]
        note = (f"{base_side}: {policy_words(base.width_policy)}, {cur_side}: {policy_words(cur.width_policy)}; "
                f"τ from the acceptance profile over the {k} draft position(s) both verified")
        return TauPair("profile", ta, tb, noisy=False, note=note)
    missing = [side for side, c in ((base_side, base), (cur_side, cur)) if not c.profiles]
    why = (f"{' and '.join(missing)} {'has' if len(missing) == 1 else 'have'} no acceptance profile" if missing
           else "no draft position was verified on both sides")
    return (f"not comparable: {base_side} has {policy_words(base.width_policy)} and {cur_side} "
            f"{policy_words(cur.width_policy)}, and {why}")


def common_positions(a: CellValues, b: CellValues) -> int:
    """The leading draft positions every repeat of both cells verified (0: none, or a side without a profile)."""
    if not a.profiles or not b.profiles:
        return 0
    return min(next((i for i, (v, _) in enumerate(p) if v <= 0), len(p)) for p in a.profiles + b.profiles)
