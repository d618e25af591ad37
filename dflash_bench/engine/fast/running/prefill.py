"""A `FastRunner`'s prompts: prefilled into their slots, one graph per prompt or per group of 2-3, or a larger group
in one forward.

The runner's part that admits requests (its steps advance them; the scheduler groups the prompts). A prefill
writes the prompt's K/V (and the drafter's context) into its slot and leaves the first generated token as the
slot's anchor.
"""

from __future__ import annotations

import torch

from dflash_bench.engine.fast.models.family import Drafter, Target
from dflash_bench.engine.fast.running.device_state import GraphCache, SlotState

PREFILL_LANE = 2  # split-K workspace of a prefill's one-row matmul (the head): the steps use 0 and 1


def stage(buf: torch.Tensor, slots: list[int], prompts: list[list[int]], P: int) -> int:
    """A prefill graph's inputs in `buf` (host memory): the k slots, the index of each prompt's last token in the
    k x P ids, and the ids, each prompt padded with zeros to P. Returns how many entries it wrote."""
    k = len(prompts)
    for i, (slot, prompt) in enumerate(zip(slots, prompts)):
        n, at = len(prompt), 2 * k + i * P
        buf[i], buf[k + i] = slot, i * P + n - 1
        buf[at:at + n] = torch.tensor(prompt, dtype=torch.long)
        buf[at + n:at + P] = 0
    return 2 * k + k * P


class Prefiller:
    """Runs prefills into a `SlotState`: a captured graph per (bucket, prompts), or one eager forward."""

    def __init__(self, target: Target, drafter: Drafter | None, state: SlotState, graphs: GraphCache,
                 *, prompts: int):
        """`prompts`: the most prompts one graph stages (the pinned buffer of their inputs)."""
        self.t, self.d, self.s, self.graphs = target, drafter, state, graphs
        self.dev, self.max_len = target.device, target.max_len
        self.taps = tuple(drafter.c.target_layer_ids) if drafter else ()
        k = prompts
        self.pre_host = torch.zeros(2 * k + k * self.max_len, dtype=torch.long, pin_memory=self.dev.type == "cuda")

    def graphed(self, slots: list[int], prompts: list[list[int]], P: int) -> torch.Tensor:
        """k prompts (k = 1 or in GRAPHED_ROWS) by the graph of k rows and bucket P; their first tokens `[k]`."""
        self.stage_in(self.pre_host, slots, prompts, P)
        self.graph(P, len(prompts))
        return self.s.pre_tok[:len(prompts)]

    def stage_in(self, buf: torch.Tensor, slots: list[int], prompts: list[list[int]], P: int) -> None:
        """Stage k prompts in `buf` (pinned host memory) and copy them into `pre_in` on the current stream, padded
        to P."""
        m = stage(buf, slots, prompts, P)
        self.s.pre_in[:m].copy_(buf[:m], non_blocking=True)

    def graph(self, P: int, k: int = 1) -> None:
        """Run the prefill of the k prompts `pre_in` holds, padded to P (their graph on a GPU), on the current
        stream."""
        self.graphs.run(("prefill", P) if k == 1 else ("prefill", P, k), lambda: self.body(P, k))

    def rows(self, slots: list[int], prompts: list[list[int]], starts: list[int] | None = None) -> torch.Tensor:
        """One eager forward over right-padded prompts (the padding's K/V lands past each prompt, as in a graph's;
        a target that `packs` leaves the padding out of its matmuls); their first tokens `[k]`. `starts`: each
        prompt's first position (default 0), its slot holding the keys before it."""
        k, n = len(prompts), [len(p) for p in prompts]
        P = max(n)
        at = starts or [0] * k
        resumed = any(at)
        ids = torch.zeros(k, P, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, : n[i]] = torch.tensor(p, dtype=torch.long)
        dev = self.dev
        ids = ids.to(dev, non_blocking=True)
        slot = torch.tensor(slots, device=dev)
        last = torch.tensor([i * P + m - 1 for i, m in enumerate(n)], device=dev)
        packed = torch.tensor([i * P + j for i, m in enumerate(n) for j in range(m)], device=dev) \
            if self.t.packs and sum(n) < k * P else None
        first = torch.tensor(at, dtype=torch.long, device=dev)
        L = max(a + P for a in at)  # keys a row attends to: its slot's from position 0
        logits, feats = self.t.forward(ids, first, 0, L, last_only=True, taps=self.taps, slot=slot, last=last,
                                       packed=packed, resumed=resumed)
        if self.d:
            assert feats is not None  # the drafter's taps
            self.d.write_context(feats, first[:, None] + self.t.index.offsets(P, dev), 0, slot=slot)
        if self.s.logits is not None:
            self.s.logits[:, 0].index_copy_(0, slot, logits[:, 0])
        return logits[:, 0].argmax(-1)

    def admit(self, slot: int, n: int, tok: torch.Tensor) -> None:
        """A prefilled slot's device state: its anchor is the first token, `n` positions are committed."""
        self.s.start[slot] = n
        self.s.anchor[slot] = tok
        self.s.active[slot] = 1

    def body(self, P: int, k: int = 1) -> None:
        """k prompts padded to P tokens into the slots `pre_in` holds (`stage`); their first tokens into
        `pre_tok`."""
        s = self.s
        slot, last, ids = s.pre_in[0:k], s.pre_in[k:2 * k], s.pre_in[2 * k:2 * k + k * P].view(k, P)
        logits, feats = self.t.forward(ids, s.pre_start[:k], 0, P, last_only=True, taps=self.taps, slot=slot,
                                       last=last, lane=PREFILL_LANE)
        if self.d:
            assert feats is not None  # the drafter's taps
            self.d.write_context(feats, self.t.index.offsets(P, self.dev).expand(k, P), 0, slot=slot)
        if s.logits is not None:
            s.logits[:, 0].index_copy_(0, slot, logits[:, 0])
        s.pre_tok[:k].copy_(logits[:, -1].argmax(-1))
