"""How many tokens a DFlash step verifies per row (the anchor and its first w - 1 drafts), chosen by load.

A verify of bs rows x w tokens costs more as bs x w grows (on a GPU it turns compute-bound near 512
tokens), while drafts far into the block are rarely accepted. Each step takes the width w that maximises
expected committed tokens per second, rows x E[tokens | w] / T(bs, w), where

- E[tokens | w] = 1 + sum_{i < w} P(at least i drafts accepted), each P measured online from the rows'
  accepted counts (decayed, so it follows the workload), over the steps that verified position i;
- T(bs, w) is the measured time of a step of that batch bucket and width (an average of its recent steps).

A width of 1 (where the caller offers it: the runner does on a CPU) verifies the anchor alone, no draft: an
AR step (plus the drafter's context), for loads where no speculative step pays for itself (on a CPU at 32
rows a step's matmuls are already compute-bound, and each verified draft costs about what an AR token does).

An untimed (bucket, width) pair is tried once before the choice trusts the table, and every `explore`-th
step re-times whichever is stalest of the best width's two neighbours and (on a GPU) the whole block (which
keeps the far positions' acceptance measured), so neither table goes stale where it matters. A CPU does not
re-time the whole block: at 32 rows it costs ~10 AR steps there, and re-timing it every 128 steps took a
quarter of a run's time; the optimistic prior still lets the choice climb one neighbour at a time. The runner leaves out the
time of a step that captured a CUDA graph.
Greedy output is unchanged by the width: verification only commits tokens the target itself chose.
"""

from __future__ import annotations

WIDTHS = (2, 4, 6, 8, 10, 16)  # candidate tokens per row, capped at the block size (which is always a candidate)
CPU_WIDTHS = (1, 2, 3, 4, 6, 8, 10, 16)  # a CPU step has no graph per width: narrower steps, and none at all
DECAY = 0.999  # per row-step weight of older acceptance counts
# A CPU's: a demo's cells are short (4 requests of at most 64 tokens at concurrency 1) and run one after another
# on one server, so the suite before would decide the next one's widths (tests/test_width.py); in process
# (benchmarks/speed/suite_sequence.py) the difference was within a 2-core box's noise
CPU_DECAY = 0.99
ALPHA = 0.25  # weight of the newest step time in its running average
EXPLORE = 32  # every this many steps: re-time the stalest of the best width's neighbours and the whole block
PRIOR = 4.0  # row-steps of the optimistic guess behind each measured survival


class WidthChooser:
    """Tokens per row for the next verify, from measured acceptance by position and measured step times."""

    def __init__(self, block_size: int, widths: tuple[int, ...] = WIDTHS, explore: int = EXPLORE,
                 narrow_from: int = 1, explore_block: bool = True, decay: float = DECAY):
        """`narrow_from`: the smallest batch bucket that may verify less than the whole block (a GPU's verify of
        a few rows costs about the same at any width, and every width is a CUDA graph per bucket and length)."""
        self.B = block_size
        self.widths = sorted({w for w in widths if 0 < w < block_size} | {block_size})
        self.explore, self.narrow_from, self.explore_block = explore, narrow_from, explore_block
        self.decay = decay  # per row-step weight of older acceptance counts
        self.verified = [0.0] * block_size  # [i]: decayed row-steps that verified draft i (1-based)
        self.reached = [0.0] * block_size  # [i]: decayed row-steps that accepted drafts 1..i
        self.times: dict[tuple[int, int], float] = {}  # (batch bucket, width) -> seconds per step
        self.timed_at: dict[tuple[int, int], int] = {}
        self.steps = 0
        self.chosen: dict[int, int] = {}  # width -> steps that used it
        self._cached: list[float] | None = None  # survival by position, until the next observation

    def survival(self, i: int) -> float:
        """P(drafts 1..i all accepted), measured over the row-steps that verified position i; PRIOR row-steps
        of the optimistic guess survival(i - 1) keep a few early rows from deciding it (an unverified position
        looks as good as the one before it, so it gets tried)."""
        return self._curve()[i]

    def expected(self, w: int) -> float:
        """Expected tokens a row commits in a step of width w (the bonus token included)."""
        return 1.0 + sum(self._curve()[1:w])

    def _curve(self) -> list[float]:
        if self._cached is None:
            c = [1.0]
            for i in range(1, self.B):
                c.append(min(c[-1], (self.reached[i] + PRIOR * c[-1]) / (self.verified[i] + PRIOR)))
            self._cached = c
        return self._cached

    def candidates(self, bucket: int) -> list[int]:
        """The widths a step of this batch bucket may take."""
        return self.widths if bucket >= self.narrow_from else [self.B]

    def choose(self, bucket: int, rows: int) -> int:
        self.steps += 1
        widths = self.candidates(bucket)
        untimed = [w for w in widths if (bucket, w) not in self.times]
        if len(widths) == 1:
            w = widths[0]
        elif untimed:
            w = untimed[-1]
        else:
            w = max(widths, key=lambda w: rows * self.expected(w) / self.times[(bucket, w)])
            if self.steps % self.explore == 0:
                k = widths.index(w)
                near = widths[max(k - 1, 0): k + 2] + ([self.B] if self.explore_block else [])
                w = min(near, key=lambda w: self.timed_at[(bucket, w)])
        self.chosen[w] = self.chosen.get(w, 0) + 1
        return w

    def observe(self, bucket: int, w: int, accepted: list[int], seconds: float | None) -> None:
        """A collected step: each row's accepted drafts, and the step's time when it was measured."""
        self._cached = None
        n, keep = len(accepted), self.decay ** len(accepted)
        for i in range(1, self.B):
            self.verified[i] *= keep
            self.reached[i] *= keep
        hist = [0] * w  # rows by accepted drafts (at most w - 1)
        for a in accepted:
            hist[min(a, w - 1)] += 1
        at_least = n
        for i in range(1, w):
            at_least -= hist[i - 1]
            self.verified[i] += n
            self.reached[i] += at_least
        if seconds is not None and seconds > 0:
            key = (bucket, w)
            old = self.times.get(key)
            self.times[key] = seconds if old is None else (1 - ALPHA) * old + ALPHA * seconds
            self.timed_at[key] = self.steps
