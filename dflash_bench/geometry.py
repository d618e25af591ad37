"""What a model costs in memory and what a token reads, from its config alone (sweep/fit.py checks plans with it).

Weights: the attention and MLP projections and the embedding (a second table when it is not tied), in bf16.
A mixture of experts holds every expert in memory, so its weights count all of them; a token reads only its
`experts per token` of them, which `active_bytes` counts (the speed a memory-bound decode step can reach: the
weights it reads a step). The families covered:
- Gemma 4 with `enable_moe_block`: each layer's dense MLP (`intermediate_size`) and, beside it, `num_experts`
  experts of `moe_intermediate_size`, `top_k_experts` a token, and their router;
- Qwen MoE (`num_experts` with `moe_intermediate_size`): every layer's MLP is the experts (`mlp_only_layers`
  dense), `num_experts_per_tok` a token, plus a shared expert where `shared_expert_intermediate_size` says;
- Mixtral and gpt-oss (`num_local_experts`): experts of `intermediate_size`, `num_experts_per_tok` (gpt-oss:
  `experts_per_token`) a token; gpt-oss's MXFP4 experts (`quantization_config.quant_method` mxfp4) at 4.25 bits
  a weight (4-bit values and an 8-bit scale per 32).
Models with latent attention (`n_routed_experts`, DeepSeek's) are not covered: None.

KV per token: 2 (K and V) x KV heads x head size x 2 bytes per layer, each layer with its own kind's heads and
head size (Gemma 4's full layers: `global_head_dim`, `num_global_key_value_heads`; SGLang's naming of the same
model: `swa_*` for the sliding ones); a sliding-window layer keeps at most its window.

A drafter shares the target's embedding and head. A DFlash drafter adds its `fc` over the target features; an
EAGLE-3 head (`draft_vocab_size`) reads twice the width into its one layer's attention, adds its `fc` over three
target features, its draft-vocabulary head and the embedding table vLLM gives it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BYTES = 2  # bf16 weights and KV
MXFP4_BYTES = 4.25 / 8  # gpt-oss's experts: 4-bit values, one 8-bit scale per 32


@dataclass(frozen=True)
class Geometry:
    """What a model costs in memory: weights, and KV bytes per token of the layers that keep every token
    and of the sliding-window layers (which keep at most `window` tokens). `active_bytes`: the weights one
    token reads (all of a dense model's, a mixture's experts per token only), the head it computes logits with
    included (an EAGLE-3 head's: its draft vocabulary's) and the embedding table not (a token reads one row)."""

    weight_bytes: int
    kv_full: int
    kv_window: int
    window: int | None
    heads: int = 0  # attention heads: what a tensor-parallel size must divide
    active_bytes: int = 0
    experts: int = 0  # a mixture's experts per layer (0: dense)
    experts_per_token: int = 0

    def kv_bytes(self, tokens: int) -> int:
        kept = min(tokens, self.window) if self.window else tokens
        return self.kv_full * tokens + self.kv_window * kept


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    return config.get("text_config") if isinstance(config.get("text_config"), dict) else config  # type: ignore[return-value]


@dataclass(frozen=True)
class _Experts:
    count: int  # per MoE layer
    per_token: int
    width: int  # each expert's MLP width
    dense_width: int  # a dense MLP beside the experts (Gemma 4), or a shared expert (Qwen MoE); 0: none
    dense_layers: frozenset[int]  # layers whose MLP is dense instead (Qwen MoE's mlp_only_layers)
    expert_bytes: float  # bytes a weight of an expert


def _experts(c: dict[str, Any]) -> _Experts | None:
    """The mixture of a config, or None for a dense one (raises KeyError for a mixture whose widths are missing)."""
    quant = c.get("quantization_config") if isinstance(c.get("quantization_config"), dict) else {}
    expert_bytes = MXFP4_BYTES if (quant or {}).get("quant_method") == "mxfp4" else BYTES
    if c.get("enable_moe_block"):
        return _Experts(int(c["num_experts"]), int(c["top_k_experts"]), int(c["moe_intermediate_size"]),
                        int(c["intermediate_size"]), frozenset(), expert_bytes)
    if c.get("num_experts") and c.get("moe_intermediate_size") and c.get("num_experts_per_tok"):
        step = int(c.get("decoder_sparse_step") or 1)
        layers = int(c["num_hidden_layers"])
        dense = {int(i) for i in c.get("mlp_only_layers") or []} | {i for i in range(layers) if (i + 1) % step}
        return _Experts(int(c["num_experts"]), int(c["num_experts_per_tok"]), int(c["moe_intermediate_size"]),
                        int(c.get("shared_expert_intermediate_size") or 0), frozenset(dense), expert_bytes)
    if c.get("num_local_experts"):
        per_token = c.get("num_experts_per_tok") or c["experts_per_token"]
        return _Experts(int(c["num_local_experts"]), int(per_token), int(c["intermediate_size"]), 0, frozenset(),
                        expert_bytes)
    return None


def geometry(config: dict[str, Any] | None, *, drafter: bool = False) -> Geometry | None:
    """The memory geometry of a decoder from its config (None where it is not one the formulas cover)."""
    if not isinstance(config, dict):
        return None
    c = text_config(config)
    if c.get("n_routed_experts"):
        return None
    try:
        hidden, layers, heads = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["num_attention_heads"])
        inter, vocab = int(c["intermediate_size"]), int(c["vocab_size"])
        moe = _experts(c)
    except (KeyError, TypeError, ValueError):
        return None
    hd = int(c.get("head_dim") or hidden // heads)
    kv = int(c.get("num_key_value_heads") or heads)
    # full-attention layers: `global_*` where a config names them (Gemma 4), else the base values; sliding
    # layers: `swa_*` where a config names them (SGLang's naming of the same model), else the base values
    full_hd, full_kv = int(c.get("global_head_dim") or hd), int(c.get("num_global_key_value_heads") or kv)
    swa_hd, swa_kv = int(c.get("swa_head_dim") or hd), int(c.get("swa_num_key_value_heads") or kv)
    given = c.get("layer_types")
    types: list[Any] = given if isinstance(given, list) else ["full_attention"] * layers
    window = c.get("sliding_window") if any(t == "sliding_attention" for t in types) else None
    eagle3 = drafter and bool(c.get("draft_vocab_size"))
    attn_in = 2 * hidden if eagle3 else hidden  # EAGLE-3's layer attends over [embedding, hidden state]
    weights = active = 0.0
    kv_full = kv_window = 0
    for i, kind in enumerate(types[:layers]):
        full = kind != "sliding_attention"
        lhd, lkv = (full_hd, full_kv) if full else (swa_hd, swa_kv)
        k_eq_v = full and bool(c.get("attention_k_eq_v"))
        attn = attn_in * heads * lhd + heads * lhd * hidden + attn_in * lkv * lhd * (1 if k_eq_v else 2)
        if moe is None or i in moe.dense_layers:
            mlp = mlp_active = 3.0 * hidden * inter
        else:
            beside = 3 * hidden * moe.dense_width + hidden * moe.count  # dense MLP or shared expert, and the router
            one = 3 * hidden * moe.width * moe.expert_bytes / BYTES  # an expert, in bf16 weights' worth of bytes
            mlp, mlp_active = beside + moe.count * one, beside + moe.per_token * one
        weights += attn + mlp
        active += attn + mlp_active
        per_token = 2 * lkv * lhd * BYTES
        if full or not window:
            kv_full += per_token
        else:
            kv_window += per_token
    head = vocab * hidden
    if eagle3:
        extra = 3 * hidden * hidden + int(c["draft_vocab_size"]) * hidden + vocab * hidden
        weights, active = weights + extra, active + 3 * hidden * hidden + int(c["draft_vocab_size"]) * hidden
    elif drafter:
        dc = c.get("dflash_config") or {}
        feats = len(dc.get("target_layer_ids") or []) or int(c.get("num_target_layers") or 0)
        weights += feats * hidden * hidden
        active += feats * hidden * hidden + head  # its logits come from the target's head
    else:
        weights += head * (1 if c.get("tie_word_embeddings", True) else 2)
        active += head
    return Geometry(int(weights * BYTES), kv_full, kv_window, int(window) if window else None, heads,
                    int(active * BYTES), moe.count if moe else 0, moe.per_token if moe else 0)


def describe(g: Geometry) -> str:
    """The weights in memory and, for a mixture, what one token reads of them: the speed notes of a dry run."""
    gib = 1 << 30
    text = f"{g.weight_bytes / gib:.1f} GiB of weights"
    if g.experts:
        text += (f" (a mixture of {g.experts} experts, {g.experts_per_token} a token: a token reads "
                 f"{g.active_bytes / gib:.1f} GiB of them)")
    return text
