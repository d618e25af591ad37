"""The DFlash drafter's forward on the fast path: fused projections, slot-row KV cache, fixed `[bs, B]` shapes.

Same math as `propose.DFlashProposer` (z-lab's forward): context features (fc over the tapped target layers,
then hidden_norm) become keys/values at their positions in every layer; the block `[anchor, mask x (B-1)]`
attends to context and block (non-causal, or causal with a window on sliding layers).
"""

from __future__ import annotations

from typing import Any

import torch

from dflash_bench.engine.reference.drafter import DFlashDrafter
from dflash_bench.engine.fast.kernels.selector import check_head_dims, load_kernels, prepared
from dflash_bench.engine.fast.models.cache_layout import check_drafter_split, drafter_kind
from dflash_bench.engine.fast.models.decoder import (Index, KVCache, StepAttention, embed_norm, fuse_layer, matmul, norm,
                                            rms_norm, run_layers, weight_bytes)
from dflash_bench.engine.fast.models.shard import Shard
from dflash_bench.engine.reference.rope import cos_sin, inv_freq, rope
from dflash_bench.errors import UserError


class FastDrafter:
    def __init__(self, drafter: DFlashDrafter, embed: torch.Tensor, head: torch.Tensor, *, max_slots: int, max_len: int,
                 kernels: bool | str | None = None, shard: Shard | None = None):
        """`embed`, `head`: the target's (with `shard`, this rank's vocabulary rows of them); `shard`: this rank's shard
        of the drafter's weights (`shard.py`)."""
        c = self.c = drafter.config
        self.shard = shard = shard or Shard()
        if c.attention_bias:  # _fuse keeps the q/k/v biases; o_proj's would be dropped
            raise UserError("the fast path runs drafters without attention biases: serve without --fast")
        if c.hidden_act != "silu":
            raise UserError(f"the fast path runs drafters with SwiGLU MLPs, not {c.hidden_act!r}: serve without --fast")
        self.B = c.block_size
        self.embed, self.head = embed, head
        self.dtype, self.device = embed.dtype, embed.device
        self.kernels = load_kernels(self.device, kernels, self.dtype)
        self.lm_head = prepared(self.kernels, head)  # the borrowed head as this drafter's matmuls read it
        check_drafter_split(c, shard.size)
        lay = drafter_kind(c, max_len, shard.size)  # the cache's layout: what the pool sized (`cache_layout.py`)
        self.H, self.hkv, self.hd = c.num_attention_heads // shard.size, lay.hkv, c.head_dim
        check_head_dims(self.kernels, [self.hd], "drafter", self.dtype)
        self.eps = c.rms_norm_eps
        # every layer's context K/V projection stacked: one matmul per step instead of one per layer
        layers: list[Any] = list(drafter.layers)  # the drafter's modules, read by attribute
        kv = [torch.cat([shard.rows(ly.self_attn.k_proj.weight.detach()), shard.rows(ly.self_attn.v_proj.weight.detach())])
              for ly in layers]
        self.wkv = prepared(self.kernels, torch.cat(kv))
        self.layers = [fuse_layer(ly, self.kernels, self.H, self.hkv, shard) for ly in layers]
        kvd = 2 * self.hkv * self.hd
        biases = [ly.bqkv[-kvd:] for ly in self.layers if ly.bqkv is not None]  # every layer's or none
        self.bkv = torch.cat(biases) if biases else None
        self.kinds = [c.layer_mask_kind(i) for i in range(c.num_hidden_layers)]
        self.fc = prepared(self.kernels, drafter.fc.weight.detach())
        self.hidden_norm = drafter.hidden_norm.weight.detach()
        self.norm = drafter.norm.weight.detach()
        self.index = Index()  # its steps' index tensors
        self.cache = KVCache(lay.layers, max_slots, lay.rows, lay.hkv, lay.hd, self.dtype, self.device, self.index)
        self.inv_freq = inv_freq(self.hd, c.rope_theta, self.device)
        self.attention = StepAttention(self.cache, self.kernels, heads=self.H, kv_heads=self.hkv, head_dim=self.hd,
                                       eps=self.eps, scale=self.hd ** -0.5, kinds=self.kinds, inv_freq=self.inv_freq,
                                       rope_scale=1.0)

    def weight_bytes(self) -> int:
        """Bytes one draft step reads: the drafter's weights plus the target's lm_head it borrows."""
        return weight_bytes(self.layers, self.fc, self.lm_head)

    def write_context(self, feats: torch.Tensor | list[torch.Tensor], pos: torch.Tensor, row0: int, *,
                      lane: int = 0, slot: torch.Tensor | None = None) -> None:
        """Context K/V of target features `[bs, n, K*h]` (or the K tapped outputs `[bs * n, h]`, joined here)
        at positions `pos` `[bs, n]` of slots from `row0`, or of the slot the device tensor `slot` holds (a
        prefill graph's) (`lane` 1 when it runs beside the target's forward: see `decoder.matmul`)."""
        bs, n = pos.shape
        if isinstance(feats, list):
            feats = torch.cat(feats, -1)
        mm = matmul(self.kernels, lane)
        ctx = norm(self.kernels)(mm(feats.reshape(bs * n, -1), self.fc), self.hidden_norm, self.eps)
        kv_all = mm(ctx, self.wkv, self.bkv)
        rows = self.cache.rows(row0, pos, slot)
        H, hkv, hd, eps = self.H, self.hkv, self.hd, self.eps
        kvd = 2 * hkv * hd
        wk = [ly.wqk[H:] for ly in self.layers if ly.wqk is not None]  # the drafter's k norms (it has q/k norms)
        if self.kernels is not None:
            for i in range(len(self.layers)):
                self.kernels.ops.qk_rope_store(kv_all[:, i * kvd:(i + 1) * kvd], 0, hkv, hd, self.attention.cos,
                                              self.attention.sin, rows.reshape(-1), pos.reshape(-1), self.cache.k[i],
                                              self.cache.v[i], wk[i], eps)
            return
        cos, sin = cos_sin(pos.reshape(-1), self.inv_freq, self.dtype)
        for i in range(len(self.layers)):
            kv = kv_all[:, i * kvd:(i + 1) * kvd]
            k = rope(rms_norm(kv[:, :kvd // 2].view(-1, hkv, hd), None, eps) * wk[i], cos, sin)
            self.cache.write(i, rows, pos, k.view(bs, n, hkv, hd), kv[:, kvd // 2:].view(bs, n, hkv, hd))

    @property
    def plain_head(self) -> bool:
        """Whether the draft's logits are the lm_head's as they are (no multiplier, no softcap): then its
        greedy tokens can be taken without writing the logits (`triton_gemm.linear_argmax`)."""
        return self.c.output_multiplier == 1.0 and not self.c.final_logit_softcapping

    def hidden(self, anchors: torch.Tensor, starts: torch.Tensor, row0: int, L: int,
               pos: torch.Tensor | None = None, n: int | None = None) -> torch.Tensor:
        """The draft for the block `[anchor, mask x (n-1)]` at `starts[b]..starts[b]+n-1` (n: the block size B,
        or fewer for a cut block: it attends only to its own n positions), up to the final norm: its output
        `[bs * (n-1), hidden]` at the mask positions (`logits` maps it to the vocabulary). `pos`: the block's
        positions `starts[:, None] + arange(n)`, when the caller has them already."""
        c, bs = self.c, anchors.shape[0]
        n = self.B if n is None else n
        h, x = embed_norm(self.kernels, anchors[:, None], self.embed, self.layers[0].ln1, self.eps,
                          scale=c.input_embedding_scale, n=n, fill=c.mask_token_id, shard=self.shard)
        if pos is None:
            pos = starts[:, None] + self.index.offsets(n, starts.device)
        attend = self.attention(pos, starts, row0, L)
        _, x = run_layers(self.layers, h, x, attend, self.norm, self.eps, self.kernels, shard=self.shard)
        # a contiguous [bs * (n-1), hidden] input: on a strided 3-D view F.linear falls back to a batched
        # matmul that reads the whole lm_head once per row
        return x.view(bs, n, -1)[:, 1:].reshape(bs * (n - 1), -1)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Draft logits of `hidden`'s rows (with `shard`, of this rank's vocabulary rows)."""
        c = self.c
        logits = matmul(self.kernels)(x, self.lm_head)
        if c.output_multiplier != 1.0:
            logits = logits * c.output_multiplier
        if c.final_logit_softcapping:
            cap = float(c.final_logit_softcapping)
            logits = torch.tanh(logits / cap) * cap
        return logits
