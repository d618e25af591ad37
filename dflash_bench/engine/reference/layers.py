"""What a target's config says about each decoder layer: its KV geometry (Gemma 4's full layers have their
own head size and KV heads), and which configs the builtin engine refuses (one sentence each)."""

from __future__ import annotations

from typing import Any

from dflash_bench.errors import UserError


def layer_config(cfg: Any, i: int) -> Any:
    """Layer i's view of the config: its own where transformers marks the config per-layer (heterogeneous)."""
    return cfg.per_layer_config[i] if getattr(cfg, "is_heterogeneous", False) else cfg


def kv_shapes(cfg: Any) -> list[tuple[int, int]]:
    """Each decoder layer's (KV heads, head size), read layer by layer."""
    out = []
    for i in range(cfg.num_hidden_layers):
        c = layer_config(cfg, i)
        heads = c.num_attention_heads
        out.append((getattr(c, "num_key_value_heads", None) or heads, getattr(c, "head_dim", None) or c.hidden_size // heads))
    return out


def check_servable(cfg: Any) -> None:
    """Refuse, in one sentence, what the slot cache cannot run: recurrent layers (their state cannot be rolled
    back) and layers that read another layer's keys and values of the same forward (Gemma 4's KV sharing)."""
    kinds = set(getattr(cfg, "layer_types", None) or [])
    other = kinds - {"full_attention", "sliding_attention"}
    if other:
        raise UserError(f"the target ({cfg.model_type}) has {', '.join(sorted(other))} layers; the builtin engine "
                        "serves attention-only models (use vLLM or SGLang for hybrid ones)")
    if getattr(cfg, "num_kv_shared_layers", 0):
        raise UserError(f"the target ({cfg.model_type}) shares keys and values across its last "
                        f"{cfg.num_kv_shared_layers} layers, which the builtin engine does not serve (use vLLM or SGLang)")
    if getattr(cfg, "use_bidirectional_attention", None) == "all":
        raise UserError(f"the target ({cfg.model_type}) attends bidirectionally; the builtin engine serves causal models")
