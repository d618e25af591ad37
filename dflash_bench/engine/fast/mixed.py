"""A decode step that carries a prompt (AR, `serve --fast --prefill mixed`): one forward over the running rows'
next tokens and a new prompt's tokens, as vLLM's scheduler mixes a prefill into the decode batch.

Between two steps, a prefill stalls every running row for its whole length (the 8B shape on an H100: a
~300-token prompt ~11 ms, a step of 32 rows ~8 ms, the weights read once for each). In one forward the matmuls
take the rows and the prompt together and read the weights once: the prompt's compute is what that forward
costs, and the rows' step rides along. Each half keeps its own attention (`StepAttention`): the rows over
their slots' caches, the prompt causally over its own slot. The rows' K/V is written before the prompt's, so
the prompt's slot, a padding row of the step when it lies inside the batch bucket, is overwritten by the
prompt (that row's start is 0: a freed slot's).

The graph of a (batch bucket, prompt bucket) pair reads the prompt from `pre_in` (`prefill.stage`) and leaves
its first token in `pre_tok[0]`; the slot's start and anchor are set inside it, while the slot's `active` stays
as the host's mask left it (off): the next step the host launches with the slot in it turns it on.
"""

from __future__ import annotations

import torch

from dflash_bench.engine.fast.model import FastTarget, embed_norm, matmul, offsets, run_layers
from dflash_bench.engine.fast.prefill import PREFILL_BUCKET

MIXED_TOKENS = 1024  # prompts up to this many tokens (padded) may ride in a step; longer ones prefill alone


def forward_mixed(t: FastTarget, anchor: torch.Tensor, starts: torch.Tensor, L: int, ids: torch.Tensor,
                  slot: torch.Tensor, last: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' tokens `anchor` `[bs]` at `starts` (slots 0..bs-1, keys in `[0, L)`) and a prompt `ids` `[1, P]`
    into `slot` `[1]` at positions 0..P-1 (`zero`: a `[1]` zero, its start) in one forward. Returns the final
    norm's rows `[bs, hidden]` and the prompt's at index `last` `[1, hidden]`."""
    bs, P = anchor.shape[0], ids.shape[1]
    rows = t.attention(starts[:, None], starts, 0, L)
    prompt = t.attention(offsets(P, ids.device)[None], zero, 0, P, slot)
    mm = matmul(t.kernels)

    def attend(i, ly, x):
        qkv = mm(x, ly.wqkv, ly.bqkv)
        return torch.cat([rows(i, ly, x[:bs], qkv[:bs]), prompt(i, ly, x[bs:], qkv[bs:])])

    h, x = embed_norm(t.kernels, torch.cat([anchor, ids.view(-1)])[:, None], t.embed, t.layers[0].ln1, t.eps)
    _, x, _ = run_layers(t.layers, h, x, attend, t.norm, t.eps, t.kernels)
    return x[:bs], x[bs:].index_select(0, last)


class MixedSteps:
    """The mixed steps of `FastRunner` (which holds the state they use: see there)."""

    def mixed_buckets(self) -> list[int]:
        """The prompt buckets a step may carry: multiples of PREFILL_BUCKET up to MIXED_TOKENS (and the cache)."""
        return list(range(PREFILL_BUCKET, min(MIXED_TOKENS, self.max_len - 1) + 1, PREFILL_BUCKET))

    def can_ride(self, prompt: list[int]) -> bool:
        """Whether `prompt` may ride in a step (its padded length has a mixed graph)."""
        return 0 < len(prompt) and self.padded(len(prompt)) in self.mixed_buckets()

    def _mixed(self, bs: int, P: int) -> None:
        """The AR step of rows 0..bs-1 with the prompt `pre_in` holds (padded to P): the rows' commit, then the
        prompt's slot takes its length as start and its first token as anchor."""
        slot, last, ids = self.pre_in[0:1], self.pre_in[1:2], self.pre_in[2:2 + P].view(1, P)
        x, xp = forward_mixed(self.t, self.anchor[:bs], self.start[:bs], self.max_len, ids, slot, last,
                              self.pre_start[:1])
        self._commit(bs, self._greedy(x, bs, 1))
        tok = self._argmax(matmul(self.t.kernels)(xp, self.t.lm_head).view(1, 1, -1)).view(1)
        self.pre_tok[:1].copy_(tok)
        self.start.index_copy_(0, slot, last + 1)
        self.anchor.index_copy_(0, slot, tok)
