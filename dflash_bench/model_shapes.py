"""The published shapes of known pairs whose weights are too large to fetch here: target and drafter configs.

`sweep` reads a target's geometry from its config.json (a local folder) or, for a known pair named by its
short name, from here, to size the context limit and to check that weights plus KV fit the GPUs before
anything launches (`sweep/fit.py`). `benchmarks/peers/big_shape.py` writes these configs, a tokenizer and the
drafter's config into folders that vLLM and SGLang load with `--load-format dummy` (random weights of the
real shape, never a 62 GB file).

gemma-4-31B-it: the model's published config (transformers' `Gemma4TextConfig` keys, text part only);
its DFlash drafter: the z-lab/gemma-4-31B-it-DFlash row of the reference table (5 layers, 4 sliding + 1
full, 6 target features at [1, 12, 23, 35, 46, 57], mask token 4, block 16, softcapping 30).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dflash_bench.models import ModelPair

GEMMA4_LAYERS = 60
GEMMA4_LAYER_TYPES = (["sliding_attention"] * 5 + ["full_attention"]) * (GEMMA4_LAYERS // 6)

GEMMA4_31B_TARGET: dict[str, Any] = {
    "architectures": ["Gemma4ForCausalLM"],
    "model_type": "gemma4_text",
    "vocab_size": 262144,
    "hidden_size": 5376,
    "intermediate_size": 21504,
    "num_hidden_layers": GEMMA4_LAYERS,
    "num_attention_heads": 32,
    "num_key_value_heads": 16,  # sliding layers
    "head_dim": 256,
    "num_global_key_value_heads": 4,  # full layers
    "global_head_dim": 512,
    "attention_k_eq_v": True,
    "layer_types": GEMMA4_LAYER_TYPES,
    "sliding_window": 1024,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
    },
    "final_logit_softcapping": 30.0,
    "hidden_activation": "gelu_pytorch_tanh",
    "tie_word_embeddings": True,
    "hidden_size_per_layer_input": 0,
    "vocab_size_per_layer_input": 262144,
    "num_kv_shared_layers": 0,
    "enable_moe_block": False,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
    "dtype": "bfloat16",
}

GEMMA4_31B_DRAFTER: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 5376,
    "intermediate_size": 10752,
    "num_hidden_layers": 5,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
    "sliding_window": 2048,
    "use_sliding_window": True,  # Qwen3Config drops sliding_window without it (SGLang's DFlash needs the window)
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "vocab_size": 262144,
    "tie_word_embeddings": True,
    "max_position_embeddings": 262144,
    "final_logit_softcapping": 30.0,
    "block_size": 16,
    "num_target_layers": GEMMA4_LAYERS,
    "dflash_config": {"mask_token_id": 4, "target_layer_ids": [1, 12, 23, 35, 46, 57],
                      "final_logit_softcapping": 30.0},
    "dtype": "bfloat16",
}

# known pair name -> (target config, drafter config)
SHAPES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "gemma-4-31B-it": (GEMMA4_31B_TARGET, GEMMA4_31B_DRAFTER),
}


def sglang_naming(target: dict[str, Any]) -> dict[str, Any]:
    """A Gemma 4 text config in SGLang 0.5.16's naming: the base `head_dim` / `num_key_value_heads` are the
    full-attention layers' and `swa_*` the sliding layers' (SGLang converts only a multimodal `gemma4` config
    to it; a text-only `gemma4_text` one must carry it, else its KV pool asks for `swa_num_key_value_heads`)."""
    out = {k: v for k, v in target.items() if k not in ("global_head_dim", "num_global_key_value_heads")}
    out.update(head_dim=target["global_head_dim"], num_key_value_heads=target["num_global_key_value_heads"],
               swa_head_dim=target["head_dim"], swa_v_head_dim=target["head_dim"],
               swa_num_key_value_heads=target["num_key_value_heads"])
    return out


def shape_of(pair_name: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The (target, drafter) configs of a known pair whose shape is recorded here, else None."""
    return SHAPES.get(pair_name)


def mixes_layer_types(drafter_config: dict[str, Any] | None) -> bool:
    """Does a drafter mix sliding-window and full-attention layers (`layer_types`, top level or in dflash_config)?"""
    if not isinstance(drafter_config, dict):
        return False
    types = drafter_config.get("layer_types") or (drafter_config.get("dflash_config") or {}).get("layer_types")
    return isinstance(types, list) and len(set(types)) > 1


def read_config(path: str | Path | None) -> dict[str, Any] | None:
    """config.json of a local model folder, or None."""
    if path is None:
        return None
    file = Path(path) / "config.json"
    try:
        data = json.loads(file.read_text()) if file.is_file() else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def pair_configs(pair: ModelPair) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(target, drafter) configs of a ModelPair: its local folders' config.json, else its recorded shape."""
    shape = shape_of(pair.name) or (None, None)
    drafter = read_config(pair.drafter) if pair.drafter else None
    return read_config(pair.target) or shape[0], drafter or (shape[1] if pair.drafter else None)
