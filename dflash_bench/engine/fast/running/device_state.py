"""The device side of a `FastRunner`: its slots' state, and the CUDA graphs captured over it.

State lives on the device, one entry per slot: `start` (anchor position = committed KV length) and the token
row `[anchor, drafts]` (the last committed token, then the block's drafts); `out` holds a step's results per
row (accepted, drafts..., bonus); a prefill reads its prompts from `pre_in` and leaves their first tokens in
`pre_tok`. The runner's parts (steps.py's bodies, prefill.py) read and write these tensors, in
stream order; the host's facts about the slots are the scheduler's.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

from dflash_bench.engine.fast.models.decoder import Index


class SlotState:
    """The device tensors of `slots` slots: what the captured graphs read and write."""

    def __init__(self, *, slots: int, block: int, max_len: int, vocab: int, dtype: torch.dtype, device: torch.device,
                 keep_logits: bool, prompts: int):
        """`prompts`: the most prompts one prefill or mixed step stages (the inputs' buffers)."""
        def long(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=torch.long, device=device)
        self.start = long(slots)
        self.active = long(slots)
        # per slot the next verify's tokens: the anchor (last committed token), then the drafts (AR: none)
        self.tokens = long(slots, block)
        self.anchor = self.tokens[:, 0]
        self.drafts = self.tokens[:, 1:] if block > 1 else long(slots, 1)
        self.pos = long(slots, block)  # the step's positions: set by the draft, read by the verify
        self.out = long(slots, block + 1)  # per row: accepted, drafts..., bonus (AR: the token)
        # target logits of the last step per slot (for logprobs); the prefill's last logits go to position 0
        self.logits = torch.zeros(slots, block, vocab, dtype=dtype, device=device) if keep_logits else None
        # a prefill's inputs (slot, index of the last prompt token, ids padded to the bucket), copied in one go
        k = prompts  # up to k prompts: k slots, k last indices, k padded rows of ids
        self.pre_in = long(2 * k + k * max_len)
        self.pre_start = long(k)
        self.pre_tok = long(k)


class GraphCache:
    """One captured CUDA graph per step shape (its key), replayed; without graphs (a CPU) the body runs eagerly.

    Capturing runs a graph's body once beforehand (warm-up); the state it commits (`committed`) is put back, so
    the first step of a new shape advances exactly once.
    """

    def __init__(self, on: bool, committed: Callable[[], list[torch.Tensor]], indexes: list[Index]):
        """`indexes`: the target's and drafter's, whose index tensors a body makes once and keeps."""
        self.on, self.indexes = on, indexes
        self.committed = committed
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.pool = torch.cuda.graph_pool_handle() if on else None

    def __len__(self) -> int:
        return len(self.graphs)

    def __iter__(self) -> Iterator[tuple]:
        return iter(self.graphs)

    def clear(self) -> None:
        """Drop every captured graph, once the device has run what was queued. A tensor-parallel engine's graphs hold
        its process group's communicator: NCCL ends a group only once they are destroyed (`ranks.Followers.stop`)."""
        if self.graphs:
            torch.cuda.synchronize()
        self.graphs.clear()

    def run(self, key: tuple, body: Callable[[], None]) -> None:
        def fn() -> None:
            with contextlib.ExitStack() as keep:  # the step's index tensors are made once, outside capture, and kept
                for index in self.indexes:
                    keep.enter_context(index.keeping())
                body()
        if not self.on:
            fn()
            return
        g = self.graphs.get(key)
        if g is None:
            state = [t.clone() for t in self.committed()]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()  # warm-up (lazy inits stay out of the graph); its commit is undone below
            torch.cuda.current_stream().wait_stream(side)
            for t, saved in zip(self.committed(), state):
                t.copy_(saved)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                fn()
            self.graphs[key] = g
        g.replay()
