"""Proposers: what drafts the B-1 tokens of a block. `DFlashProposer` runs the z-lab drafter.

A proposer has `block_size`, the target `layer_ids` it reads, and three calls made by the decode loop:
`prefill(slot, feats)` after a request's prefill, `propose(seqs)` before each verify (returns draft tokens
or draft logits), and `commit(seqs, feats, starts)` after each verify (the new context features).
Tests inject their own proposers (an oracle that knows the target's tokens, one that is always wrong).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import torch
import torch.nn.functional as F

from dflash_bench.engine.reference.slot_cache import SlotCache, attend, row_mask
from dflash_bench.engine.reference.drafter import DFlashDrafter, rope_cos_sin
from dflash_bench.engine.reference.rope import rope


class Proposer(Protocol):
    block_size: int
    layer_ids: list[int]

    def prefill(self, slot: int, feats: torch.Tensor | None) -> None: ...

    def propose(self, seqs: Sequence) -> tuple[torch.Tensor | None, torch.Tensor | None]: ...

    def commit(self, seqs: Sequence, feats: torch.Tensor | None, starts: torch.Tensor) -> None: ...


class DFlashProposer:
    """Drafts a block in one drafter pass over `[anchor, mask x (B-1)]` with cached context K/V."""

    def __init__(self, drafter: DFlashDrafter, embed_weight: torch.Tensor, lm_head: Callable[[torch.Tensor], torch.Tensor], *,
                 max_slots: int, max_len: int) -> None:
        c = drafter.config
        self.drafter: Any = drafter  # its modules are read by attribute (nn.Module's getattr is untyped)
        self.c = c
        self.block_size = c.block_size
        self.layer_ids = list(c.target_layer_ids)
        self.embed_weight, self.lm_head = embed_weight, lm_head
        w = embed_weight
        self.cache = SlotCache([(c.num_key_value_heads, c.head_dim)] * c.num_hidden_layers, max_slots, max_len, w.dtype,
                               w.device)
        self.pending: dict[int, tuple[torch.Tensor, int]] = {}  # slot -> (features [B, K*h], first position)

    def _rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(pos, self.c.head_dim, self.c.rope_theta, self.embed_weight.dtype)

    def _write_context(self, feats: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor) -> None:
        ctx = self.drafter.context(feats)
        cos, sin = self._rope(pos)
        for i, layer in enumerate(self.drafter.layers):
            k, v = layer.self_attn.kv(ctx, cos, sin)
            self.cache.write(i, slots, pos, k, v)

    @torch.inference_mode()
    def prefill(self, slot: int, feats: torch.Tensor | None) -> None:
        """Store the context K/V of the whole prompt (features `[P, K*h]`) in the slot."""
        self.pending.pop(slot, None)
        assert feats is not None  # a DFlash target taps its layers
        pos = torch.arange(feats.shape[0], device=feats.device)[None]
        self._write_context(feats[None], pos, torch.tensor([slot], device=feats.device))

    def commit(self, seqs: Sequence, feats: torch.Tensor | None, starts: torch.Tensor) -> None:
        """Keep the verify features; the accepted ones become context on the next draft (the rest is overwritten)."""
        assert feats is not None  # a DFlash target taps its layers
        for row, s in enumerate(seqs):
            self.pending[s.slot] = (feats[row], int(starts[row]))

    @torch.inference_mode()
    def propose(self, seqs: Sequence) -> tuple[None, torch.Tensor]:
        """Draft logits `[bs, B-1, V]` for the mask slots of each row's block."""
        dev, B, c = self.embed_weight.device, self.block_size, self.c
        slots = torch.tensor([s.slot for s in seqs], device=dev)
        starts = torch.tensor([s.start for s in seqs], device=dev)
        ar = torch.arange(B, device=dev)
        block_pos = starts[:, None] + ar
        feats, ctx_pos = self._pending_context(seqs, block_pos)
        self._write_context(feats, ctx_pos, slots)

        block = torch.full((len(seqs), B), c.mask_token_id, device=dev)
        block[:, 0] = torch.tensor([s.out[-1] for s in seqs], device=dev)
        h = F.embedding(block, self.embed_weight) * c.input_embedding_scale
        cos, sin = self._rope(block_pos)
        kv_len = int(starts.max()) + B
        masks = {}
        for i, layer in enumerate(self.drafter.layers):
            kind = c.layer_mask_kind(i)
            if kind not in masks:
                masks[kind] = row_mask(starts, B, kv_len, causal=kind[0], window=kind[1])
            a = layer.self_attn
            x = layer.input_layernorm(h)
            k, v = a.kv(x, cos, sin)
            self.cache.write(i, slots, block_pos, k, v)
            q = rope(a.q_norm(a.q_proj(x).unflatten(-1, (-1, c.head_dim))), cos, sin).transpose(1, 2)
            kc, vc = self.cache.read(i, slots, kv_len)
            h = h + a.o_proj(attend(q, kc, vc, masks[kind], c.head_dim**-0.5).flatten(2))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        logits = self.lm_head(self.drafter.norm(h[:, 1:])) * c.output_multiplier
        if c.final_logit_softcapping:
            cap = float(c.final_logit_softcapping)
            logits = torch.tanh(logits / cap) * cap
        return None, logits

    def _pending_context(self, seqs: Sequence[Any], block_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's new context features and positions; a row with none writes zeros the block overwrites."""
        rows: list[torch.Tensor | None] = []
        pos: list[torch.Tensor] = []
        for row, s in enumerate(seqs):
            got = self.pending.pop(s.slot, None)
            if got is None:
                rows.append(None)
                pos.append(block_pos[row])
            else:
                rows.append(got[0])
                pos.append(got[1] + torch.arange(got[0].shape[0], device=block_pos.device))
        width = len(self.layer_ids) * self.c.hidden_size
        zero = torch.zeros(self.block_size, width, dtype=self.embed_weight.dtype, device=block_pos.device)
        return torch.stack([zero if r is None else r for r in rows]), torch.stack(pos)
