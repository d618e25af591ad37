"""A decode step that carries new prompts (AR, `serve --fast --prefill mixed`): one forward over the running rows'
next tokens and up to MIXED_ROWS prompts, as vLLM's scheduler mixes prefills into the decode batch.

Between two steps, a prefill stalls every running row for its whole length, and each forward reads the weights
once. In one forward the matmuls take the rows' and the prompts' tokens together: on the 8B shape on an H100
(`benchmarks/mixed_step.py`) a step of 31 rows takes 6.7 ms, a 320-token prompt's prefill 11.1 ms, the step that
carries it 12.6 ms. Each half keeps its own attention (`StepAttention`): the rows over their slots' caches, the
prompts causally over their own slots. The rows' K/V is written before the prompts': a prompt's slot that the
batch bucket covers is a padding row of the step (its start is 0, a freed slot's), overwritten by the prompt.

The graph of a (batch bucket, prompt bucket, prompts) triple reads the prompts from `pre_in` (`prefill.stage`)
and leaves their first tokens in `pre_tok`; their slots' start and anchor are set inside it, while `active`
stays as the host's mask left it (off): the next step the host launches with a slot in it turns it on.
"""

from __future__ import annotations

import os

import torch

from dflash_bench.engine.fast.model import FastTarget, embed_norm, matmul, offsets, run_layers
from dflash_bench.engine.fast.prefill import PREFILL_BUCKET

MIXED_TOKENS = 1024  # padded prompt tokens a step may carry: one prompt up to this, k prompts up to this / k each
MIXED_ROWS = (1, 2, 3)  # prompts a step may carry (a group of more is prefilled in one forward of its own)
# prompts that may wait to ride (a burst past it is prefilled at once); DFLASH_BENCH_RIDE_QUEUE sets it. On the
# 8B shape at 32 rows (H100, README) every prompt riding beat six at most: 3236.4 against 3170.2 tok/s
RIDE_QUEUE = int(os.environ.get("DFLASH_BENCH_RIDE_QUEUE", 64))


def forward_mixed(t: FastTarget, anchor: torch.Tensor, starts: torch.Tensor, L: int, ids: torch.Tensor,
                  slot: torch.Tensor, last: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' tokens `anchor` `[bs]` at `starts` (slots 0..bs-1, keys in `[0, L)`) and k prompts `ids` `[k, P]`
    into `slot` `[k]` at positions 0..P-1 (`zero`: k zeros, their starts) in one forward. Returns the final norm's
    rows `[bs, hidden]` and the prompts' rows at `last` `[k]` (indices into the k x P prompt tokens)."""
    bs, (k, P) = anchor.shape[0], ids.shape
    rows = t.attention(starts[:, None], starts, 0, L)
    prompts = t.attention(offsets(P, ids.device)[None].expand(k, P), zero, 0, P, slot)
    mm = matmul(t.kernels)

    def attend(i, ly, x):
        qkv = mm(x, ly.wqkv, ly.bqkv)
        return torch.cat([rows(i, ly, x[:bs], qkv[:bs]), prompts(i, ly, x[bs:], qkv[bs:])])

    h, x = embed_norm(t.kernels, torch.cat([anchor, ids.reshape(-1)])[:, None], t.embed, t.layers[0].ln1, t.eps)
    _, x, _ = run_layers(t.layers, h, x, attend, t.norm, t.eps, t.kernels)
    return x[:bs], x[bs:].index_select(0, last)


class MixedSteps:
    """The mixed steps of `FastRunner` (which holds the state they use: see there)."""

    def mixed_buckets(self) -> list[tuple[int, int]]:
        """(P, k) of every step that may carry prompts: k in MIXED_ROWS, each padded to P, a multiple of
        PREFILL_BUCKET with k * P <= MIXED_TOKENS (and P below the cache)."""
        return [(P, k) for k in MIXED_ROWS
                for P in range(PREFILL_BUCKET, min(MIXED_TOKENS // k, self.max_len - 1) + 1, PREFILL_BUCKET)]

    def can_ride(self, prompts: list[list[int]]) -> bool:
        """Whether `prompts` may ride in one step together (a mixed graph of their count and longest bucket: see
        `mixed_buckets`)."""
        k = len(prompts)
        return (self.mixed and k in MIXED_ROWS and all(prompts)
                and self.padded(max(map(len, prompts))) <= min(MIXED_TOKENS // k, self.max_len - 1))

    def _stage_rides(self, rides: list[tuple[int, list[int]]]) -> tuple[int, int]:
        """Copy riding prompts' inputs into `pre_in` (in stream order, behind the steps in flight) and count their
        slots admitted; returns their (bucket, count)."""
        slots, prompts = [s for s, _ in rides], [p for _, p in rides]
        if not self.can_ride(prompts):
            raise ValueError(f"prompts of {[len(p) for p in prompts]} tokens cannot ride in one step of this runner")
        # this launch's host buffer: free, for the launch before last was collected
        P = self.stage_in(self.ride_host[self.launched % len(self.host)], slots, prompts)
        for s in slots:
            self.admitted[s] += 1
            self.riding[s] = self.admitted[s]
        return P, len(rides)

    def _took(self, riders: list[tuple[int, int, int]], first: torch.Tensor) -> None:
        """Admit on the host the prompts (slot, admission number, length) that rode in a collected step, unless
        released since; their first tokens (`first`, in order) go to `took`."""
        self.took = {}
        for i, (slot, admitted, n) in enumerate(riders):
            if self.riding.get(slot) == admitted:
                del self.riding[slot]
                self.host_start[slot] = n
                self.took[slot] = int(first[i])
                self.rode += 1

    def _mixed(self, bs: int, P: int, k: int) -> None:
        """The AR step of rows 0..bs-1 with the k prompts `pre_in` holds (padded to P): the rows' commit, then each
        prompt's slot takes its length as start and its first token as anchor."""
        slot, last, ids = self.pre_in[0:k], self.pre_in[k:2 * k], self.pre_in[2 * k:2 * k + k * P].view(k, P)
        x, xp = forward_mixed(self.t, self.anchor[:bs], self.start[:bs], self.max_len, ids, slot, last,
                              self.pre_start[:k])
        self._commit(bs, self._greedy(x, bs, 1))
        tok = self._argmax(matmul(self.t.kernels)(xp, self.t.lm_head).view(k, 1, -1)).view(k)
        self.pre_tok[:k].copy_(tok)
        self.start.index_copy_(0, slot, last + 1 - offsets(k, slot.device) * P)  # last = i * P + n_i - 1
        self.anchor.index_copy_(0, slot, tok)
