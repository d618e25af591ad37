"""The published shapes of known pairs whose weights are too large to fetch here: target and drafter configs.

`sweep` reads a target's geometry from its config.json (a local folder) or, for a known pair named by its
short name, from here, to size the context limit and to check that weights plus KV fit the GPUs before
anything launches (`sweep/fit.py`). `benchmarks/peers/big_shape.py` writes these configs, a tokenizer and the
drafter's config into folders that vLLM and SGLang load with `--load-format dummy` (random weights of the
real shape, never a 62 GB file).

gemma-4-31B-it: the model's published config (transformers' `Gemma4TextConfig` keys, text part only);
its DFlash drafter: the z-lab/gemma-4-31B-it-DFlash row of the reference table (5 layers, 4 sliding + 1
full, 6 target features at [1, 12, 23, 35, 46, 57], mask token 4, block 16, softcapping 30).

gemma-4-26B-A4B-it: the same family with a mixture of experts beside each layer's dense MLP (transformers'
`enable_moe_block`: 128 experts of width 704, 8 a token, and a dense MLP of width 2112), 30 layers of width 2816,
2 KV heads of 512 on its full layers; its drafter z-lab/gemma-4-26B-A4B-it-DFlash: 5 layers (4 sliding + 1 full)
of width 2816, 6 target features at [1, 6, 11, 17, 22, 27], as its config.json reads (quoted whole in a
third-party port's tests).

Qwen3-8B and its z-lab/Qwen3-8B-DFlash-b16 drafter: the reference table's rows. QWEN3_8B_EAGLE3 is an EAGLE-3
head of the shape EAGLE-3 publishes for its 8B targets (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: one Llama decoder
layer at the target's width and MLP width, a 32,000-token draft vocabulary, three target features), here at
Qwen3-8B's widths, loaded by vLLM's `LlamaForCausalLMEagle3`; the DFlash blog's EAGLE-3 baseline for Qwen3-8B
is RedHatAI/Qwen3-8B-speculator.eagle3, whose config is not quoted in anything read here.

gpt-oss-120b: openai/gpt-oss-120b's config.json as published (36 layers of width 2880 alternating a 128-token
sliding window and full attention, 64 query and 8 KV heads of 64, 128 experts of width 2880 and 4 a token, stored
in MXFP4; quoted whole in third-party tests that read it from the model's page). Its drafter
z-lab/gpt-oss-120b-DFlash is known second hand only: a third-party table made from each z-lab repository's
config.json and file sizes gives 8 full-attention layers of width 2880 and MLP width 7680, 64 query and 8 KV heads,
a block of 10, 5 target features at [1, 9, 17, 25, 33] and 1.46 GiB of weights (0.78B parameters, the card's
"0.8B"), and the head size follows (64: the target's, and what 0.78B needs). Not in that table, so chosen here,
none of which changes a step's time: the mask token (a reserved id of the Harmony vocabulary), the rope and the
norm's epsilon (the target's).
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

GEMMA4_26B_LAYERS = 30

GEMMA4_26B_A4B_TARGET: dict[str, Any] = {
    **GEMMA4_31B_TARGET,
    "hidden_size": 2816,
    "intermediate_size": 2112,  # the dense MLP beside the experts
    "num_hidden_layers": GEMMA4_26B_LAYERS,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,  # sliding layers
    "num_global_key_value_heads": 2,  # full layers
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * (GEMMA4_26B_LAYERS // 6),
    "enable_moe_block": True,
    "num_experts": 128,
    "top_k_experts": 8,
    "moe_intermediate_size": 704,
    "use_double_wide_mlp": False,
}

GEMMA4_26B_A4B_DRAFTER: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 2816,
    "intermediate_size": 5632,
    "num_hidden_layers": 5,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
    "sliding_window": 2048,
    "use_sliding_window": True,
    "max_window_layers": 5,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "vocab_size": 262144,
    "tie_word_embeddings": False,
    "max_position_embeddings": 262144,
    "final_logit_softcapping": 30.0,
    "block_size": 16,
    "num_target_layers": GEMMA4_26B_LAYERS,
    "dflash_config": {"mask_token_id": 4, "target_layer_ids": [1, 6, 11, 17, 22, 27]},
    "pad_token_id": 0,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "dtype": "bfloat16",
}

QWEN3_8B_TARGET: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "max_position_embeddings": 40960,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "dtype": "bfloat16",
}

QWEN3_8B_DRAFTER: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 5,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "tie_word_embeddings": True,
    "max_position_embeddings": 40960,
    "block_size": 16,
    "num_target_layers": 36,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
    "dtype": "bfloat16",
}

QWEN3_8B_EAGLE3: dict[str, Any] = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "vocab_size": 151936,
    "draft_vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 1,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "max_position_embeddings": 40960,
    "target_hidden_size": 4096,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "dtype": "bfloat16",
}

GPT_OSS_120B_TARGET: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "vocab_size": 201088,
    "hidden_size": 2880,
    "intermediate_size": 2880,  # each expert's
    "num_hidden_layers": 36,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
    "sliding_window": 128,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "attention_bias": True,
    "attention_dropout": 0.0,
    "num_local_experts": 128,
    "num_experts_per_tok": 4,
    "experts_per_token": 4,
    "router_aux_loss_coef": 0.9,
    "output_router_logits": False,
    "hidden_act": "silu",
    "swiglu_limit": 7.0,
    "rms_norm_eps": 1e-05,
    "rope_theta": 150000,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "initial_context_length": 4096,
    "max_position_embeddings": 131072,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "pad_token_id": 199999,
    "eos_token_id": 200002,
    "use_cache": True,
}

GPT_OSS_120B_DRAFTER: dict[str, Any] = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "vocab_size": 201088,
    "hidden_size": 2880,
    "intermediate_size": 7680,
    "num_hidden_layers": 8,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "hidden_act": "silu",
    "rope_theta": 150000,  # not published: the target's base
    "rms_norm_eps": 1e-05,  # not published: the target's
    "attention_bias": False,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
    "block_size": 10,
    "num_target_layers": 36,
    # the mask token is not published: <|reserved_200017|> of the Harmony vocabulary stands for it
    "dflash_config": {"mask_token_id": 200017, "target_layer_ids": [1, 9, 17, 25, 33]},
    "dtype": "bfloat16",
}

# known pair name -> (target config, drafter config)
SHAPES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "gemma-4-31B-it": (GEMMA4_31B_TARGET, GEMMA4_31B_DRAFTER),
    "gemma-4-26B-A4B-it": (GEMMA4_26B_A4B_TARGET, GEMMA4_26B_A4B_DRAFTER),
    "Qwen3-8B": (QWEN3_8B_TARGET, QWEN3_8B_DRAFTER),
    "gpt-oss-120b": (GPT_OSS_120B_TARGET, GPT_OSS_120B_DRAFTER),
}

# known pair name -> an EAGLE-3 head of the shape published for its target (sweep --modes ...,eagle3)
EAGLE3_SHAPES: dict[str, dict[str, Any]] = {
    "Qwen3-8B": QWEN3_8B_EAGLE3,
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


def eagle3_shape_of(pair_name: str) -> dict[str, Any] | None:
    """The config of an EAGLE-3 head of the published shape for a known pair's target, else None."""
    return EAGLE3_SHAPES.get(pair_name)


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
