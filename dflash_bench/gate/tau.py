"""Which τ two cells can be compared on (docs/acceptance.md, "What the gate compares").

τ depends on the pair, the requests and the verify width, and on nothing else: at temperature 0 and one fixed
width the builtin engine commits the same tokens and counts the same τ run to run and at any concurrency. So two
cells' τ are set against each other only where every step of both verified the same width:

- the width each side verified: the one width its steps used (`CellValues.widths`, from the cell's
  `verify_widths`: a cell under `--verify-width auto` that verified one width only counts as that width), else its
  fixed policy (`full`, `w<N>`), else `full` where its profile shows every step verifying every position; another
  engine's None is its own fixed way, the same on both sides of a baseline comparison (gate/reference.py makes
  the engines that verify the whole block `full`);
- the same width on both sides: τ, judged with the tight threshold (a rerun reads the same τ);
- otherwise (widths chosen by load, two different widths, τ counted under different definitions): not comparable,
  with a sentence saying what differs. The acceptance profile does not bridge two widths: a narrower width starts
  more steps inside runs of easy tokens, so each position's share of accepted drafts rises as the width falls (the
  embedded pair: τ over the first 3 positions 2.32 at width 4, 1.87 at the full block, tests/test_tau_width.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dflash_bench.gate.baseline import CellValues


@dataclass(frozen=True)
class TauPair:
    """The τ per repeat of two cells verified at one width (`width`: full, w<N>, or None for an engine's own)."""

    base: list[float]
    current: list[float]
    width: str | None


def definitions(cell: CellValues) -> set[int]:
    return {int(v) for v in cell.metrics.get("acceptance_definition", [])}


def block_size(cell: CellValues) -> int | None:
    """The drafter's block, where the cell's acceptance profile says it (a position per draft)."""
    return len(cell.profiles[0]) + 1 if cell.profiles else None


def verified_width(cell: CellValues) -> str | None:
    """The one verify width every step of the cell used ("full" or "w<N>"), "auto" where the steps' widths varied
    (or were chosen by load and not recorded), None for an engine's own fixed way."""
    block = block_size(cell)
    if cell.widths:
        if len(cell.widths) > 1:
            return "auto"
        return "full" if cell.widths[0] == block or (block is None and cell.width_policy == "full") else f"w{cell.widths[0]}"
    policy = cell.width_policy
    if policy is None and cell.profiles and all(p[0][0] > 0 and len({v for v, _ in p}) == 1 for p in cell.profiles):
        return "full"  # every step verified every draft position (vLLM's counters, the emulator's)
    m = re.fullmatch(r"w(\d+)", policy or "")
    if m and block is not None and int(m.group(1)) >= block:
        return "full"
    if policy is None or policy == "full" or m:
        return policy
    return "auto"  # auto, or repeats under several policies ("auto,full"), with no widths recorded


def width_words(width: str | None, cell: CellValues) -> str:
    if width == "full":
        return "the whole block every step"
    if width and width.startswith("w"):
        return f"{width[1:]} token(s) a step"
    if width is None:
        return "its engine's own way (no width policy recorded)"
    used = ", ".join(map(str, sorted(cell.widths))) or "not recorded"
    how = "widths chosen by load" if cell.width_policy == "auto" else f"several widths (width policy {cell.width_policy})"
    return f"{how} ({used} tokens a step)"


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
    wa, wb = verified_width(base), verified_width(cur)
    if wa == wb and wa != "auto":
        return TauPair(a, b, wa)
    return (f"not comparable: {base_side} verified {width_words(wa, base)} and {cur_side} verified "
            f"{width_words(wb, cur)}; "
            "τ, and each draft position's share of accepted drafts, depend on the verify width "
            "(docs/acceptance.md): compare cells verified at one fixed width (serve --verify-width N or full)")
