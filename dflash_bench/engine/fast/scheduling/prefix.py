"""The prefix cache: freed slots keep their requests' tokens, and a new prompt that starts with one of them is
prefilled from where they part (vLLM's automatic prefix caching, per slot rather than per block).

A multi-turn chat sends each turn its whole conversation again: the last turn's prompt, the engine's answer and a
new message. Computed whole, a burst of 32 second turns of 1,300 tokens each waits for 32 full prefills; resumed,
each prefills its new message alone. The fast path's caches are a row per slot, so what a freed slot still holds
is the K/V (and the drafter's context) of its last request's tokens below the last step's start. This index,
on the host, knows which tokens those are; the runner keeps the slot's device state as it is (`FastRunner.release`
with `keep`), and a hit's prefill starts at its shared length (`Prefiller.rows` with starts).

Written positions past the kept tokens (steps in flight at release, a padding row's block) are bounded by `hi`;
a target whose layers keep a ring (Gemma 4's sliding window) may have overwritten keys a resumed prompt reads:
the target says which resumes it can serve (`Target.resumable`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

PREFIX_MIN_TOKENS = 64  # a shorter shared prefix is prefilled whole: a resumed prefill runs eagerly, a fresh one graphed


@dataclass(frozen=True)
class Kept:
    """A freed slot's tokens whose K/V it still holds, and an upper bound on the positions written to it
    (exclusive)."""

    ids: tuple[int, ...]
    hi: int


def shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many leading tokens `a` and `b` share (slices compared in C, halving the range: a conversation's
    thousands of tokens cost microseconds, not a Python loop over them)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixCache:
    """Per free slot, the tokens it keeps; `match` finds the slot sharing the longest prefix with a prompt."""

    def __init__(self, resumable: Callable[[int, int], bool], *, min_tokens: int = PREFIX_MIN_TOKENS):
        """`resumable(p, hi)`: whether a slot written below position `hi` still holds every key a prompt resumed at
        position p attends to (the target's rule); `min_tokens`: the shortest prefix worth resuming."""
        self.resumable, self.min_tokens = resumable, min_tokens
        self.kept: dict[int, Kept] = {}
        self.heads: dict[tuple[int, ...], set[int]] = {}  # a kept slot's first min_tokens ids -> the slots

    def keep(self, slot: int, ids: Sequence[int], hi: int) -> bool:
        """`slot` is free and holds the K/V of `ids` at positions 0.. (written nowhere at or past `hi`); whether they
        are kept (not when shorter than `min_tokens`)."""
        self.drop(slot)
        if len(ids) < self.min_tokens:
            return False
        self.kept[slot] = Kept(tuple(ids), hi)
        self.heads.setdefault(tuple(ids[:self.min_tokens]), set()).add(slot)
        return True

    def drop(self, slot: int) -> None:
        """`slot` is taken again: what it kept is being overwritten."""
        k = self.kept.pop(slot, None)
        if k is not None:
            head = k.ids[:self.min_tokens]
            self.heads[head].discard(slot)
            if not self.heads[head]:
                del self.heads[head]

    def clear(self) -> None:
        self.kept.clear()
        self.heads.clear()

    def match(self, prompt: Sequence[int], free: Sequence[int]) -> tuple[int, int] | None:
        """The free slot to resume `prompt` in and the tokens it shares with it (at most all but the prompt's last,
        whose logits give the first token), or None when no slot holds at least `min_tokens` of it that the target
        can resume from. The longest share wins; a tie goes to the lowest slot. Only the slots that share the
        prompt's first `min_tokens` tokens are compared."""
        if len(prompt) <= self.min_tokens:
            return None
        head = self.heads.get(tuple(prompt[:self.min_tokens]))
        if not head:
            return None
        want, best = tuple(prompt[:-1]), None
        for slot in sorted(head.intersection(free)):
            k = self.kept[slot]
            p = shared(k.ids, want)
            if (best is None or p > best[1]) and self.resumable(p, k.hi):
                best = (slot, p)
        return best
