"""The DFlash drafter's forward on the fast path: fused projections, slot-row KV cache, fixed `[bs, B]` shapes.

Same math as `propose.DFlashProposer` (z-lab's forward): context features (fc over the tapped target layers,
then hidden_norm) become keys/values at their positions in every layer; the block `[anchor, mask x (B-1)]`
attends to context and block (non-causal, or causal with a window on sliding layers).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dflash_bench.engine.drafter import DFlashDrafter, rope_cos_sin
from dflash_bench.engine.fast.model import KVCache, Layer, attention, rms_norm, rope, silu_mul, step_mask


class FastDrafter:
    def __init__(self, drafter: DFlashDrafter, embed: torch.Tensor, head: torch.Tensor, *, max_slots: int, max_len: int):
        c = self.c = drafter.config
        self.B = c.block_size
        self.embed, self.head = embed, head
        self.dtype, self.device = embed.dtype, embed.device
        self.H, self.hkv, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.eps = c.rms_norm_eps
        self.layers = [self._fuse(ly) for ly in drafter.layers]
        self.kinds = [c.layer_mask_kind(i) for i in range(c.num_hidden_layers)]
        self.fc = drafter.fc.weight.detach()
        self.hidden_norm = drafter.hidden_norm.weight.detach()
        self.norm = drafter.norm.weight.detach()
        self.cache = KVCache(c.num_hidden_layers, max_slots, max_len, self.hkv, self.hd, self.dtype, self.device)

    def _fuse(self, layer) -> Layer:
        a, m = layer.self_attn, layer.mlp
        projs = (a.q_proj, a.k_proj, a.v_proj)
        return Layer(
            wqkv=torch.cat([p.weight.detach() for p in projs]),
            bqkv=torch.cat([p.bias.detach() for p in projs]) if a.q_proj.bias is not None else None,
            wo=a.o_proj.weight.detach(),
            q_norm=a.q_norm.weight.detach(),
            k_norm=a.k_norm.weight.detach(),
            ln1=layer.input_layernorm.weight.detach(),
            ln2=layer.post_attention_layernorm.weight.detach(),
            w13=torch.cat([m.gate_proj.weight.detach(), m.up_proj.weight.detach()]),
            w2=m.down_proj.weight.detach(),
        )

    def weight_bytes(self) -> int:
        """Bytes one draft step reads: the drafter's weights plus the target's lm_head it borrows."""
        n = self.fc.numel() + self.head.numel()
        for ly in self.layers:
            n += ly.wqkv.numel() + ly.wo.numel() + ly.w13.numel() + ly.w2.numel()
        return n * self.embed.element_size()

    def _rope(self, pos: torch.Tensor):
        return rope_cos_sin(pos, self.hd, self.c.rope_theta, self.dtype)

    def _kv(self, ly: Layer, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        kvd = self.hkv * self.hd
        b = None if ly.bqkv is None else ly.bqkv[-2 * kvd:]
        k, v = F.linear(x, ly.wqkv[-2 * kvd:], b).split([kvd, kvd], dim=-1)
        k = rms_norm(k.unflatten(-1, (self.hkv, self.hd)), ly.k_norm, self.eps)
        return rope(k, cos, sin), v.unflatten(-1, (self.hkv, self.hd))

    def write_context(self, feats: torch.Tensor, pos: torch.Tensor, row0: int) -> None:
        """Context K/V of target features `[bs, n, K*h]` at positions `pos` `[bs, n]` of slots from `row0`."""
        ctx = rms_norm(F.linear(feats, self.fc), self.hidden_norm, self.eps)
        cos, sin = self._rope(pos)
        for i, ly in enumerate(self.layers):
            k, v = self._kv(ly, ctx, cos, sin)
            self.cache.write(i, row0, pos, k, v)

    def draft(self, anchors: torch.Tensor, starts: torch.Tensor, row0: int, L: int) -> torch.Tensor:
        """Draft logits `[bs, B-1, V]` for the block `[anchor, mask x (B-1)]` at `starts[b]..starts[b]+B-1`."""
        c, B, bs = self.c, self.B, anchors.shape[0]
        block = torch.full((bs, B), c.mask_token_id, dtype=anchors.dtype, device=anchors.device)
        block[:, 0] = anchors
        h = F.embedding(block, self.embed) * c.input_embedding_scale
        pos = starts[:, None] + torch.arange(B, device=starts.device)
        cos, sin = self._rope(pos)
        masks = {k: step_mask(starts, B, L, self.H // self.hkv, self.dtype, causal=k[0], window=k[1])
                 for k in set(self.kinds)}
        H, hd, kvd = self.H, self.hd, self.hkv * self.hd
        for i, ly in enumerate(self.layers):
            x = rms_norm(h, ly.ln1, self.eps)
            q, k, v = F.linear(x, ly.wqkv, ly.bqkv).split([H * hd, kvd, kvd], dim=-1)
            q = rope(rms_norm(q.unflatten(-1, (H, hd)), ly.q_norm, self.eps), cos, sin)
            k = rope(rms_norm(k.unflatten(-1, (self.hkv, hd)), ly.k_norm, self.eps), cos, sin)
            self.cache.write(i, row0, pos, k, v.unflatten(-1, (self.hkv, hd)))
            kc, vc = self.cache.view(i, row0, bs, L)
            h = h + F.linear(attention(q, kc, vc, masks[self.kinds[i]], hd ** -0.5), ly.wo)
            h = h + F.linear(silu_mul(F.linear(rms_norm(h, ly.ln2, self.eps), ly.w13)), ly.w2)
        logits = F.linear(rms_norm(h[:, 1:], self.norm, self.eps), self.head) * c.output_multiplier
        if c.final_logit_softcapping:
            cap = float(c.final_logit_softcapping)
            logits = torch.tanh(logits / cap) * cap
        return logits
