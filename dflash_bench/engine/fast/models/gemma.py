"""Gemma 4 (text) on the fast path: the target's forward over its two kinds of layers.

What differs from `dense.DenseTarget` (Qwen3/Llama), and how it is done here:
- sliding layers (16 KV heads x 256 on the 31B, window 1024, full rotary at theta 1e4) and full layers (4 x 512,
  the key projection serving as the value, `attention_k_eq_v`; proportional rotary, 0.25 of the head rotated):
  each kind its own KV cache, RoPE table and head size (`Kind`);
- a sliding layer keeps only its window: a ring of `window + RING_MARGIN` positions a slot, key k at row k % ring
  (enough for the window and any step's new tokens, so a step never overwrites a key one of its queries sees;
  `cache_layout.gemma_kinds`, the layout the pool is sized from);
  a full layer keeps every position. The attention kernels (Triton's on a GPU, the C ones on a CPU) read the
  ring in place; prefill and the torch path attend over the ring's earlier keys and the step's own;
- q and k RMSNorm with weights, v RMSNorm without; attention scale 1; the embedding times sqrt(hidden) (rounded to
  the weights' dtype, as transformers does); four norms a layer (after attention and after the MLP, then the
  residual add, times the layer's scalar); GeGLU with tanh GELU; the final logits softcapped (tanh, 30); tied head;
- its own Triton kernels beside the shared ones (`triton_gemma.py`: q/k/v norms + RoPE + cache write in one launch,
  GeGLU, the sandwich norms), picked here; torch ops on the CPU kernels' path;
- prompts do not ride a decode step (`rides` False): they are prefilled first.

The decoder layers' weights are copied into fused projections and, with `consume`, each HF layer is dropped as
soon as it is copied (a 31B model then never sits in memory twice). Per-layer embeddings (E2B/E4B), MoE blocks
and KV sharing are refused in one sentence.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from dflash_bench.engine.fast.kernels.selector import Kernels, check_head_dims, load_kernels, prepared
from dflash_bench.engine.fast.models.cache_layout import GEMMA_KINDS, CacheKind, gemma_kinds
from dflash_bench.engine.fast.models.decoder import (KERNEL_MAX_QUERIES, DecoderTarget, Taps, add_rms_norm, attention,
                                            embed_norm, fused, Index, matmul, weight_bytes)
from dflash_bench.engine.fast.models.shard import Shard
from dflash_bench.engine.reference.rope import cos_sin, kernel_tables, rope
from dflash_bench.errors import UserError

@dataclass
class GemmaLayer:
    wqkv: torch.Tensor  # q, k, v projections fused (k_eq_v: the key's weights twice, the value is the raw key)
    wo: torch.Tensor
    qn: torch.Tensor
    kn: torch.Tensor
    ln1: torch.Tensor  # input_layernorm
    post_attn: torch.Tensor
    pre_ff: torch.Tensor
    post_ff: torch.Tensor
    w13: torch.Tensor  # gate and up fused
    w2: torch.Tensor
    scalar: float  # the layer's output scale (layer_scalar)
    kind: int  # 0 sliding, 1 full
    local: int  # its index among the layers of its kind (its cache)


@dataclass
class Kind:
    """A kind of layer: its KV geometry, window, RoPE and cache (`ring` rows a slot, 0: every position)."""

    hkv: int
    hd: int
    window: int | None
    ring: int
    inv_freq: torch.Tensor
    rope_scale: float
    k: list[torch.Tensor]
    v: list[torch.Tensor]


def check_fast_gemma(cfg: Any) -> None:
    """What the fast path's Gemma 4 forward does not run, in one sentence."""
    if getattr(cfg, "hidden_size_per_layer_input", 0):
        raise UserError("the fast path runs Gemma 4 without per-layer embeddings (E2B/E4B have them): serve without --fast")
    if getattr(cfg, "enable_moe_block", False):
        raise UserError("the fast path runs dense Gemma 4 models, not MoE ones (26B-A4B): serve without --fast")
    if getattr(cfg, "attention_bias", False):
        raise UserError("the fast path runs Gemma 4 without attention biases: serve without --fast")
    if getattr(cfg, "hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise UserError(f"the fast path runs Gemma 4 with GeGLU (gelu_pytorch_tanh), not {cfg.hidden_activation!r}")


def gelu_mul(gu: torch.Tensor) -> torch.Tensor:
    g, u = gu.chunk(2, dim=-1)
    return F.gelu(g, approximate="tanh") * u


def qkv_torch(qkv: torch.Tensor, H: int, hkv: int, hd: int, qn: torch.Tensor, kn: torch.Tensor, eps: float,
              cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k `[t, heads, hd]` normed (weights qn, kn) and rotated, v normed (no weight), from the fused projection
    `[t, (H + 2 hkv) hd]`; cos, sin: `rope.cos_sin`'s of the tokens' positions. The torch path, and the reference
    of `triton_gemma.qkv_norm_rope_store`."""
    t = qkv.shape[0]
    q = F.rms_norm(qkv[:, :H * hd].view(t, H, hd), (hd,), qn, eps)
    k = F.rms_norm(qkv[:, H * hd:(H + hkv) * hd].view(t, hkv, hd), (hd,), kn, eps)
    v = F.rms_norm(qkv[:, (H + hkv) * hd:].view(t, hkv, hd), (hd,), None, eps)
    return rope(q, cos, sin), rope(k, cos, sin), v


def gemma_kernels(kernels: Kernels | None) -> ModuleType | None:
    """Gemma 4's own Triton kernels, beside the shared ones of a Triton step (None: torch ops)."""
    if kernels is None or kernels.name != "triton":
        return None
    from dflash_bench.engine.fast.kernels import triton_gemma

    return triton_gemma


class GemmaTarget(DecoderTarget):
    """A Gemma 4 text target on the fast path (`family.Target`)."""

    rides: ClassVar[bool] = False  # a Gemma 4 step carries no prompts: they are prefilled first
    packs: ClassVar[bool] = True  # an eager prefill's matmuls leave its padding out (`trunk`'s `packed`)

    def __init__(self, hf_model: Any, *, max_slots: int, max_len: int, kernels: bool | str | None = None,
                 consume: bool = False, shard: Shard | None = None):
        """`shard`: this rank's shard of the weights (`shard.py`): each kind of layer splits its own KV heads."""
        cfg = hf_model.config.get_text_config()
        check_fast_gemma(cfg)
        inner = hf_model.model
        self.shard = shard = shard or Shard()
        self.n_layers, self.hidden_size = cfg.num_hidden_layers, cfg.hidden_size
        self.H, self.eps = shard.heads(cfg.num_attention_heads, "attention heads"), cfg.rms_norm_eps
        shard.heads(cfg.intermediate_size, "MLP rows")
        self.vocab_size, self.embed, self.head = shard.vocab(hf_model)  # tied: the head is the embedding table
        self.dtype, self.device = self.embed.dtype, self.embed.device
        self.embed_scale = float(torch.tensor(cfg.hidden_size ** 0.5).to(self.dtype))  # rounded as HF rounds it
        self.norm = inner.norm.weight.detach()
        self.softcap = cfg.final_logit_softcapping
        self.kernels = load_kernels(self.device, kernels, self.dtype)
        self.lm_head = prepared(self.kernels, self.head)
        self.scale = float(inner.layers[0].self_attn.scaling)
        self.max_len, self.slots = max_len, max_slots
        self.index = Index()
        self.caches: list[CacheKind] = gemma_kinds(cfg, max_len, shard.size)  # the layout the pool sized (`cache_layout.py`)
        self.kinds = self._kinds(inner.rotary_emb, max_slots)
        check_head_dims(self.kernels, [k.hd for k in self.kinds], "target", self.dtype)
        # Triton's fused q/k/v norms + RoPE + cache write and GeGLU (torch ops on the CPU kernels' path and without)
        own = gemma_kernels(self.kernels)
        self.fused = own if own is not None and all(own.fits(k.hd) for k in self.kinds) else None
        self.tables = [kernel_tables(torch.arange(max_len, device=self.device), k.inv_freq.to(self.device),
                                     k.rope_scale) for k in self.kinds] if self.fused is not None else []
        self.layers = []
        for i in range(self.n_layers):
            self.layers.append(self._fuse(inner.layers[i], cfg, i))
            if consume:  # the HF layer's weights go now: a large model is not held twice
                inner.layers[i] = nn.Module()

    def _kinds(self, rot: Any, slots: int) -> list[Kind]:
        kinds = []
        for name, lay in zip(GEMMA_KINDS, self.caches):
            shape = (slots, lay.rows, lay.hkv, lay.hd)
            inv = getattr(rot, f"{name}_inv_freq", None)
            kinds.append(Kind(lay.hkv, lay.hd, lay.window, lay.ring,
                              inv.detach().float() if inv is not None else torch.zeros(lay.hd // 2),
                              float(getattr(rot, f"{name}_attention_scaling", 1.0)),
                              [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(lay.layers)],
                              [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(lay.layers)]))
        return kinds

    def _fuse(self, layer: Any, cfg: Any, i: int) -> GemmaLayer:
        a, m = layer.self_attn, layer.mlp
        kind = 0 if cfg.layer_types[i] == "sliding_attention" else 1
        v = a.v_proj if a.v_proj is not None else a.k_proj  # k_eq_v: the raw key is the value
        shard = self.shard
        return GemmaLayer(
            wqkv=fused(self.kernels, a.q_proj, a.k_proj, v, shard=shard), wo=prepared(self.kernels, shard.cols(a.o_proj.weight.detach())),
            qn=a.q_norm.weight.detach(), kn=a.k_norm.weight.detach(),
            ln1=layer.input_layernorm.weight.detach(), post_attn=layer.post_attention_layernorm.weight.detach(),
            pre_ff=layer.pre_feedforward_layernorm.weight.detach(),
            post_ff=layer.post_feedforward_layernorm.weight.detach(),
            w13=fused(self.kernels, m.gate_proj, m.up_proj, shard=shard),
            w2=prepared(self.kernels, shard.cols(m.down_proj.weight.detach())),
            scalar=float(layer.layer_scalar), kind=kind,
            local=sum(1 for t in cfg.layer_types[:i] if (t == "sliding_attention") == (kind == 0)))

    def weight_bytes(self) -> int:
        """Bytes one decode step reads: every weight but the embedding table (the tied head is read whole)."""
        return weight_bytes(self.layers, self.norm, self.lm_head)

    def kv_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for k in self.kinds for t in k.k + k.v)

    def trunk(self, ids: torch.Tensor, pos: torch.Tensor, starts: torch.Tensor, row0: int, L: int,
              slot: torch.Tensor | None, last: torch.Tensor | None, taps: Taps,
              packed: torch.Tensor | None = None, resumed: bool = False) -> torch.Tensor:
        """A prefill (`last`: each row's last prompt token) writes a sliding layer's ring only with its rows' own
        newest positions, never their padding; resumed, it reads the ring's keys before its rows' starts. `packed`
        (an eager prefill's real tokens among the bs x n): the layers run over those alone, and only attention sees
        the rows padded (a group padded to its longest prompt spends its matmuls, 83% of its time, on padding
        otherwise)."""
        bs, n = ids.shape
        ends = starts + n if last is None else last - self.index.offsets(bs, ids.device) * n + 1 + starts
        attend = self._attention(pos, starts, row0, L, slot, ends, fresh=last is not None and not resumed,
                                 packed=packed)
        kernels, eps = self.kernels, self.eps
        mm = matmul(kernels)
        nrm = kernels.ops.rms_norm if kernels else (lambda x, w, e: F.rms_norm(x, (x.shape[-1],), w, e))
        add_norm = kernels.ops.add_rms_norm if kernels else add_rms_norm
        act = self.fused.gelu_mul if self.fused is not None else gelu_mul

        def sandwich(h: torch.Tensor, a: torch.Tensor, wa: torch.Tensor, wn: torch.Tensor, eps: float,
                     scalar: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:  # (h + norm(a)) * scalar, and its norm: the next input
            if scalar == 1.0:
                return add_norm(h, nrm(a, wa, eps), wn, eps)
            h = (h + nrm(a, wa, eps)) * scalar
            return h, nrm(h, wn, eps)
        if self.fused is not None:  # in one launch
            sandwich = self.fused.norm_add_norm
        pad = (lambda t: t) if packed is None else (lambda t: padded(t, packed, bs * n))
        tokens = ids if packed is None else ids.reshape(-1).index_select(0, packed)[None]
        h, x = embed_norm(kernels, tokens, self.embed, self.layers[0].ln1, eps, scale=self.embed_scale, shard=self.shard)
        red = self.shard.reduce  # the row-parallel o_proj's and down_proj's partial sums (`shard.py`)
        for i, ly in enumerate(self.layers):
            nxt = self.layers[i + 1].ln1 if i + 1 < len(self.layers) else self.norm
            h, x = sandwich(h, red(mm(attend(ly, x), ly.wo)), ly.post_attn, ly.pre_ff, eps)
            h, x = sandwich(h, red(mm(act(mm(x, ly.w13)), ly.w2)), ly.post_ff, nxt, eps, ly.scalar)
            if i in taps.taps:
                taps.add(i, pad(h))
        return pad(x)

    def resumable(self, p: int, hi: int) -> bool:
        """A sliding layer's ring holds key k at row k % ring, so a write at k + ring (the slot's later positions,
        below `hi`) took the row of k: a prompt resumed at p reads the keys of its window before p, which must all be
        there (a conversation shorter than the ring always is; a longer one only when it resumes within the ring's
        margin of where its slot was last written)."""
        return all(max(0, p - (k.window or k.ring) + 1) + k.ring >= hi for k in self.kinds if k.ring)

    def forward_mixed(self, anchor: torch.Tensor, starts: torch.Tensor, L: int, ids: torch.Tensor,
                      slot: torch.Tensor, last: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError("a Gemma 4 step carries no prompts (`rides` is False)")

    def _attention(self, pos: torch.Tensor, starts: torch.Tensor, row0: int, L: int, slot: torch.Tensor | None,
                   ends: torch.Tensor, fresh: bool = False, packed: torch.Tensor | None = None
                   ) -> Callable[[GemmaLayer, torch.Tensor], torch.Tensor]:
        """`attend(layer, normed h) -> [t, H * hd]` for this step: q/k/v norms, RoPE, the cache write, attention.
        `fresh`: a prefill, every row from position 0 (nothing of its rows in the cache yet). `packed`: h holds
        only these of the bs x n tokens (`trunk`): their q/k/v and cache writes are theirs alone, and attention
        sees the rows padded again (zeros), its output taken at them."""
        bs, n = pos.shape
        H, dtype, fused = self.H, self.dtype, self.fused
        rows = slot.view(-1, 1).expand(bs, n) if slot is not None else self.index.offsets(n, pos.device, row0, bs)
        flat = pos.reshape(-1)
        ats = [ring_at(pos, ends, k.ring) if k.ring else pos for k in self.kinds]  # each token's place in its row
        # h's tokens (`packed`: the real ones alone) and, for attention, back in their padded rows
        tok = (lambda t: t) if packed is None else (lambda t: t.index_select(0, packed))
        full = (lambda t: t) if packed is None else (lambda t: padded(t, packed, bs * n))
        rows_t, pos_t, ats_t = tok(rows.reshape(-1)), tok(flat), [tok(a.reshape(-1)) for a in ats]
        tables = self.tables if fused is not None else \
            [cos_sin(pos_t, k.inv_freq.to(pos.device), dtype, k.rope_scale) for k in self.kinds]
        attn = self.kernels.attn if self.kernels is not None else None
        kernel = attn is not None and n <= KERNEL_MAX_QUERIES and slot is None
        masks: dict[int, torch.Tensor] = {}
        new: dict[str, torch.Tensor] = {}  # a ring read before this step's write: its keys' rows, places, buffers

        def attend(ly: GemmaLayer, x: torch.Tensor) -> torch.Tensor:
            g = self.kinds[ly.kind]
            hkv, hd = g.hkv, g.hd
            qkv = matmul(self.kernels)(x, ly.wqkv)
            t = qkv.shape[0]
            kc, vc = g.k[ly.local], g.v[ly.local]
            later = bool(g.ring) and not kernel  # the torch attention reads the ring's older keys, then writes
            cos, sin = tables[ly.kind]
            if fused is not None:
                if later:  # k and v into buffers of their own, written to the ring after the attention
                    if not new:
                        new.update(rows=self.index.offsets(t, pos.device), at=torch.zeros(t, dtype=torch.long, device=pos.device))
                    k = torch.empty((t, 1, hkv, hd), dtype=dtype, device=pos.device)
                    v = torch.empty_like(k)
                    q = fused.qkv_norm_rope_store(qkv, H, hkv, hd, ly.qn, ly.kn, cos, sin, new["rows"], pos_t,
                                                  new["at"], k, v, self.eps)
                else:
                    q = fused.qkv_norm_rope_store(qkv, H, hkv, hd, ly.qn, ly.kn, cos, sin, rows_t, pos_t,
                                                  ats_t[ly.kind], kc, vc, self.eps)
            else:
                q, k, v = qkv_torch(qkv, H, hkv, hd, ly.qn, ly.kn, self.eps, cos, sin)
                if not later:
                    kc.index_put_((rows_t, ats_t[ly.kind]), k.reshape(t, hkv, hd))
                    vc.index_put_((rows_t, ats_t[ly.kind]), v.reshape(t, hkv, hd))
            q = full(q).view(bs, n, H, hd)
            if kernel and attn is not None:
                return attn.decode_attention(q, kc, vc, starts, row0, L, self.scale, causal=True,
                                             **(dict(window=g.window, ring=g.ring) if g.ring else {}))
            if not g.ring:
                if ly.kind not in masks:
                    masks[ly.kind] = _mask(pos, torch.arange(L, device=pos.device).expand(bs, L), None, H // hkv, dtype)
                # a prefill's slots: their keys in [0, L) gathered, not their whole rows (max_len positions)
                kv = (kc[:, :L].index_select(0, slot), vc[:, :L].index_select(0, slot)) if slot is not None else \
                    (kc[row0:row0 + bs, :L], vc[row0:row0 + bs, :L])
                return tok(attention(q, kv[0], kv[1], masks[ly.kind], self.scale))
            # the ring's keys before this step's first position, then the step's own; a prefill starts at position 0,
            # so the ring holds none of its rows' keys: its own alone (Gemma 4 31B's prefill of 18 x 112 tokens on an
            # H200: 204 ms with the ring's gathers, 195 without; gemma4_31b_prefill_anatomy_h200*.json)
            k, v = full(k.reshape(t, hkv, hd)).view(bs, n, hkv, hd), full(v.reshape(t, hkv, hd)).view(bs, n, hkv, hd)
            if fresh:
                kpos, keys, vals = pos, k, v
            else:
                before = starts[:, None] - g.ring + self.index.offsets(g.ring, pos.device)
                srow = rows[:, :1].expand(bs, g.ring)
                kpos = torch.cat([before, pos], 1)
                keys = torch.cat([kc[srow, before % g.ring], k], 1)
                vals = torch.cat([vc[srow, before % g.ring], v], 1)
            if -ly.kind - 1 not in masks:
                masks[-ly.kind - 1] = _mask(pos, kpos, g.window, H // hkv, dtype)
            out = attention(q, keys, vals, masks[-ly.kind - 1], self.scale)
            kc.index_put_((rows, ats[ly.kind]), k)  # a padded row's padding to the ring's spare row (`ring_at`)
            vc.index_put_((rows, ats[ly.kind]), v)
            return tok(out)
        return attend


def padded(t: torch.Tensor, packed: torch.Tensor, total: int) -> torch.Tensor:
    """`t`'s rows set back among `total` rows at `packed` (an eager prefill's real tokens), zeros elsewhere."""
    return torch.zeros((total, *t.shape[1:]), dtype=t.dtype, device=t.device).index_copy_(0, packed, t)


def ring_at(pos: torch.Tensor, ends: torch.Tensor, ring: int) -> torch.Tensor:
    """Where a step's keys at `pos` `[bs, n]` go in a ring of `ring` rows (+ a spare): key p at p % ring if it is
    one of its row's `ring` newest (below `ends` `[bs]`, e.g. a prefill's prompt end), the rest (a prefill's
    padding, a long prompt's oldest) into the spare last row."""
    keep = (pos < ends[:, None]) & (pos >= ends[:, None] - ring)
    return torch.where(keep, pos % ring, ring)


def _mask(qpos: torch.Tensor, kpos: torch.Tensor, window: int | None, rep: int, dtype: torch.dtype) -> torch.Tensor:
    """Causal (and windowed) additive mask `[bs, 1, rep * n, keys]` of queries at `qpos` `[bs, n]` over keys at
    `kpos` `[bs, keys]` (negative positions: none), stacked for `decoder.attention`'s grouped query rows."""
    d = qpos[:, :, None] - kpos[:, None, :]
    vis = (d >= 0) & (kpos[:, None, :] >= 0)
    if window is not None:
        vis = vis & (d < window)
    m = torch.zeros(vis.shape, dtype=dtype, device=qpos.device).masked_fill(~vis, float("-inf"))
    return m.repeat(1, rep, 1)[:, None]
