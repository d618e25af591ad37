"""Tensor parallelism on the fast path (Megatron-LM's split): which part of each weight a rank holds, and the
collectives a sharded forward runs.

A rank of `size` holds:
- column-parallel projections (q/k/v, gate/up): its `1/size` of the output rows, whole heads: query heads
  `[r H/size, (r+1) H/size)` and the KV heads they read (`hkv % size == 0`, so a query head's KV head is local);
  Gemma 4's sliding and full layers split their own KV heads (16 and 4 on the 31B: 8 and 2 a rank at size 2);
- row-parallel projections (o_proj, down_proj): the matching input columns; their partial outputs are summed
  across ranks (`reduce`, one all-reduce after attention and one after the MLP);
- the embedding and the vocabulary head: rows `[r V/size, (r+1) V/size)`; a token's embedding is looked up by the
  rank that holds it and summed (`embed`), the logits gathered where the full vocabulary is needed
  (`gather_vocab`: logprobs, a prefill's first token), or the greedy token chosen from each rank's best
  (`argmax`: the lowest index among equal maxima, as `torch.argmax`).
Norms, RoPE tables, the drafter's fc and the step state are replicated: every rank computes the same tokens and
commits the same state. `Shard()` (size 1) is the single-GPU engine: every method returns its input.

A rank cuts the loaded models down to its part first (`cut`: in place, the rest freed), so that its KV pool is
sized from the memory its shard leaves; the targets then read the cut weights as they are (`cut_already`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dflash_bench.engine.fast.models.cache_layout import split


@dataclass(frozen=True)
class Shard:
    """Rank `rank` of `size` (`group`: the torch.distributed process group of the ranks; None: the default)."""

    rank: int = 0
    size: int = 1
    group: Any = None
    cut_already: bool = False  # the models' weights are this rank's part already (`cut`): rows/cols keep them

    ROWS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # column-parallel: a rank's output rows
    COLS = ("o_proj", "down_proj")  # row-parallel: a rank's input columns

    @property
    def on(self) -> bool:
        return self.size > 1

    def heads(self, n: int, what: str) -> int:
        """This rank's share of `n` heads (or rows); one sentence when `size` does not divide them."""
        return split(n, self.size, what)

    def rows(self, w: torch.Tensor) -> torch.Tensor:
        """Column-parallel: this rank's contiguous `1/size` of `w`'s first dimension (whole heads when the rows are
        heads), as a copy of its own (the full weight can then be freed)."""
        if not self.on or self.cut_already:
            return w
        return w.chunk(self.size, 0)[self.rank].clone(memory_format=torch.contiguous_format)

    def cols(self, w: torch.Tensor) -> torch.Tensor:
        """Row-parallel: this rank's `1/size` of `w`'s input columns `[out, in]`."""
        if not self.on or self.cut_already:
            return w
        return w.chunk(self.size, 1)[self.rank].clone(memory_format=torch.contiguous_format)

    def vocab(self, hf_model: Any) -> tuple[int, torch.Tensor, torch.Tensor]:
        """A transformers model's vocabulary size and this rank's rows of its embedding and head (the same tensor
        when they are tied)."""
        table, head = hf_model.get_input_embeddings().weight, hf_model.get_output_embeddings().weight
        vocab = head.shape[0] * (self.size if self.cut_already else 1)
        self.heads(vocab, "vocabulary rows")
        embed = self.rows(table.detach())
        return vocab, embed, embed if head is table else self.rows(head.detach())

    def cut(self, hf_model: Any, drafter: Any | None) -> "Shard":
        """Cut a loaded transformers target (its decoder layers' projections, its embedding and head) and a
        `DFlashDrafter` (its layers' projections) down to this rank's part, in place; the rest is freed. Returns
        the shard the targets then read them with. The models cannot run after."""
        if not self.on:
            return self

        def param(t: torch.Tensor) -> nn.Parameter:
            return nn.Parameter(t, requires_grad=False)

        for layer in [*hf_model.model.layers, *(drafter.layers if drafter is not None else [])]:
            for name, m in layer.named_modules():
                leaf = name.rsplit(".", 1)[-1]
                if isinstance(m, nn.Linear) and leaf in self.ROWS + self.COLS:
                    m.weight = param(self.rows(m.weight.detach()) if leaf in self.ROWS else self.cols(m.weight.detach()))
                    if m.bias is not None and leaf in self.ROWS:
                        m.bias = param(self.rows(m.bias.detach()))
        table, head = hf_model.get_input_embeddings(), hf_model.get_output_embeddings()
        tied = head.weight is table.weight
        self.heads(head.weight.shape[0], "vocabulary rows")
        table.weight = param(self.rows(table.weight.detach()))
        head.weight = table.weight if tied else param(self.rows(head.weight.detach()))
        if table.weight.is_cuda:
            torch.cuda.empty_cache()  # what was cut goes back to the device: the pool is sized from what is left
        return dataclasses.replace(self, cut_already=True)

    def reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's `x` (in place): a row-parallel projection's output."""
        if self.on:
            torch.distributed.all_reduce(x, group=self.group)
        return x

    def embed(self, ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """Rows of a vocabulary-parallel embedding `table` (this rank's rows) for token `ids` `[t]`: each token
        from the rank that holds it, zeros elsewhere, summed (exact: one term is not zero)."""
        if not self.on:
            return F.embedding(ids, table)
        v = table.shape[0]
        local = ids - self.rank * v
        mine = (local >= 0) & (local < v)
        h = F.embedding(local.clamp(0, v - 1), table) * mine[:, None].to(table.dtype)
        return self.reduce(h)

    def _gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` `[n, ...]` stacked: `[size, n, ...]`."""
        out = torch.empty((self.size * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        gather = getattr(torch.distributed, "all_gather_single", None) or torch.distributed.all_gather_into_tensor
        gather(out, x.contiguous(), group=self.group)
        return out.view(self.size, *x.shape)

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """The full vocabulary's logits `[..., V]` from this rank's `[..., V / size]`."""
        if not self.on:
            return logits
        lead = logits.shape[:-1]
        parts = self._gather(logits.reshape(-1, logits.shape[-1]))  # [size, t, V / size]
        return parts.permute(1, 0, 2).reshape(*lead, -1)

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """The greedy token of each row of this rank's logits `[..., V / size]` over the whole vocabulary: each
        rank's best (value, global index), the highest value's, the lowest rank among equals (its indices are
        lower)."""
        lead, v = logits.shape[:-1], logits.shape[-1]
        flat = logits.reshape(-1, v)
        idx = flat.argmax(-1)
        if not self.on:
            return idx.view(lead)
        vals = self._gather(flat.gather(1, idx[:, None])[:, 0].float())  # [size, t]
        ids = self._gather(idx + self.rank * v)
        best = vals.argmax(0)  # the first rank among equal maxima
        return ids.gather(0, best[None])[0].view(lead)
