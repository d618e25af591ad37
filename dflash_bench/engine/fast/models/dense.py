"""The dense family on the fast path (Qwen3, Qwen2, Llama, Mistral): a fused forward over one static slot KV cache.

Weights come from a loaded Hugging Face model (q/k/v and gate/up concatenated once, `decoder.fuse_layer`; everything
else shared by reference). The cache is `[slots, max_len, kv_heads, head_dim]` per layer (`cache_layout.dense_kind`) and
a batch of `bs` rows always covers slots `row0 .. row0 + bs - 1`.

Prompts may ride a decode step (`rides`: AR with `serve --fast --prefill mixed`, `forward_mixed`), as vLLM's
scheduler mixes prefills into the decode batch. Between two steps, a prefill stalls every running row for its
whole length, and each forward reads the weights once. In one forward the matmuls take the rows' and the
prompts' tokens together: on the 8B shape on an H100 (`benchmarks/speed/mixed_step.py`) a step of 31 rows takes 6.7 ms,
a 320-token prompt's prefill 11.1 ms, the step that carries it 12.6 ms. Each half keeps its own attention
(`StepAttention`): the rows over their slots' caches, the prompts causally over their own slots. The rows' K/V is
written before the prompts': a prompt's slot that the batch bucket covers is a padding row of the step (its start
is 0, a freed slot's), overwritten by the prompt.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from dflash_bench.engine.fast.kernels.selector import check_head_dims, load_kernels, prepared
from dflash_bench.engine.fast.models.cache_layout import CacheKind, dense_kind
from dflash_bench.engine.fast.models.decoder import (DecoderTarget, Layer, Index, KVCache, StepAttention, Taps, embed_norm,
                                            fuse_layer, matmul, run_layers, weight_bytes)
from dflash_bench.engine.fast.models.shard import Shard
from dflash_bench.errors import UserError


def windows(cfg: Any) -> list[int | None]:
    """Each layer's sliding window, as transformers applies it (None: full attention)."""
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if types:  # Qwen2/Qwen3 with use_sliding_window: only the layers typed sliding
        return [window if t == "sliding_attention" else None for t in types]
    return [window] * cfg.num_hidden_layers  # Mistral: every layer when set


class DenseTarget(DecoderTarget):
    """The target's forward with fused projections over a `KVCache`; can return the outputs of chosen layers."""

    rides: ClassVar[bool] = True  # prompts may ride a decode step (`forward_mixed`)
    packs: ClassVar[bool] = False  # its prefill's matmuls run over the padding too

    def __init__(self, hf_model: Any, *, max_slots: int, max_len: int, kernels: bool | str | None = None,
                 consume: bool = False, shard: Shard | None = None):
        """`hf_model`: a loaded transformers causal LM (`target.load_model`), whose weights are copied out (with
        `consume`, each layer is dropped from it once copied: it cannot run after); `shard`: this rank's shard of
        them (`shard.py`)."""
        cfg = hf_model.config.get_text_config()
        inner = hf_model.model
        self.shard = shard = shard or Shard()
        self.n_layers = cfg.num_hidden_layers
        self.H = shard.heads(cfg.num_attention_heads, "attention heads")
        shard.heads(cfg.intermediate_size, "MLP rows")
        kv = dense_kind(cfg, max_len, shard.size)  # the cache's layout: what the pool sized (`cache_layout.py`)
        self.caches: list[CacheKind] = [kv]
        self.hkv, self.hd = kv.hkv, kv.hd
        self.eps = cfg.rms_norm_eps
        self.hidden_size = cfg.hidden_size
        # `[V / size, hidden]` each, the head lent to the drafter; the whole vocabulary's size (logits are gathered)
        self.vocab_size, self.embed, self.head = shard.vocab(hf_model)
        self.norm = inner.norm.weight.detach()
        self.dtype, self.device = self.embed.dtype, self.embed.device
        self.kernels = load_kernels(self.device, kernels, self.dtype)
        check_head_dims(self.kernels, [self.hd], "target", self.dtype)
        self.lm_head = prepared(self.kernels, self.head)  # the head as this target's matmuls read it
        rot = inner.rotary_emb
        self.inv_freq = rot.inv_freq.detach().float()
        self.rope_scale = float(getattr(rot, "attention_scaling", 1.0))
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            if any(p.bias is not None for p in (a.o_proj, m.gate_proj, m.up_proj, m.down_proj)):
                raise UserError("the fast path runs models without o_proj or MLP biases (Llama attention_bias / "
                                "mlp_bias): serve without --fast")
        self.scale = float(getattr(inner.layers[0].self_attn, "scaling", self.hd ** -0.5))
        self.layers = []
        for i in range(self.n_layers):
            self.layers.append(fuse_layer(inner.layers[i], self.kernels, self.H, self.hkv, shard))
            if consume:
                inner.layers[i] = nn.Module()
        self.windows = windows(cfg)
        self.index = Index()
        self.cache = KVCache(kv.layers, max_slots, kv.rows, self.hkv, self.hd, self.dtype, self.device, self.index)
        self.slots, self.max_len = max_slots, max_len
        self.attention = StepAttention(self.cache, self.kernels, heads=self.H, kv_heads=self.hkv, head_dim=self.hd,
                                       eps=self.eps, scale=self.scale, kinds=[(True, w) for w in self.windows],
                                       inv_freq=self.inv_freq, rope_scale=self.rope_scale)

    def weight_bytes(self) -> int:
        """Bytes one decode step must read: every weight but the embedding table (one row of it is read)."""
        return weight_bytes(self.layers, self.norm, self.lm_head)

    def trunk(self, ids: torch.Tensor, pos: torch.Tensor, starts: torch.Tensor, row0: int, L: int,
              slot: torch.Tensor | None, last: torch.Tensor | None, taps: Taps,
              packed: torch.Tensor | None = None, resumed: bool = False) -> torch.Tensor:
        if packed is not None:
            raise ValueError("the dense family's prefill does not pack its tokens (`packs` is False)")
        attend = self.attention(pos, starts, row0, L, slot)
        h, x = embed_norm(self.kernels, ids, self.embed, self.layers[0].ln1, self.eps, shard=self.shard)
        return run_layers(self.layers, h, x, attend, self.norm, self.eps, self.kernels, taps, self.shard)[1]

    def forward_mixed(self, anchor: torch.Tensor, starts: torch.Tensor, L: int, ids: torch.Tensor, slot: torch.Tensor,
                      last: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' tokens `anchor` `[bs]` at `starts` (slots 0..bs-1, keys in `[0, L)`) and k prompts `ids` `[k, P]`
        into `slot` `[k]` at positions 0..P-1 (`zero`: k zeros, their starts) in one forward. Returns the final
        norm's rows `[bs, hidden]` and the prompts' rows at `last` `[k]` (indices into the k x P prompt tokens)."""
        bs, (k, P) = anchor.shape[0], ids.shape
        rows = self.attention(starts[:, None], starts, 0, L)
        prompts = self.attention(self.index.offsets(P, ids.device)[None].expand(k, P), zero, 0, P, slot)
        mm = matmul(self.kernels)

        def attend(i: int, ly: Layer, x: torch.Tensor) -> torch.Tensor:
            qkv = mm(x, ly.wqkv, ly.bqkv)
            return torch.cat([rows(i, ly, x[:bs], qkv[:bs]), prompts(i, ly, x[bs:], qkv[bs:])])

        h, x = embed_norm(self.kernels, torch.cat([anchor, ids.reshape(-1)])[:, None], self.embed, self.layers[0].ln1,
                          self.eps, shard=self.shard)
        _, x = run_layers(self.layers, h, x, attend, self.norm, self.eps, self.kernels, shard=self.shard)
        return x[:bs], x[bs:].index_select(0, last)
