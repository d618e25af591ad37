"""Tiny random-weight target/drafter pairs for tests and demos: real HF architectures, real z-lab format.

`make_tiny_pair(out_dir)` writes, in well under two seconds and without the hub:
- `target/`: a Qwen3 (or Llama) causal LM saved with `save_pretrained`, a byte-level BPE tokenizer with
  Qwen3-style special tokens and a Qwen3-style chat template that honours `enable_thinking`;
- `drafter/`: a DFlash drafter in z-lab's checkpoint format (config.json with `block_size` and
  `dflash_config{mask_token_id, target_layer_ids}`, model.safetensors with `fc`, `hidden_norm`, `norm`,
  `layers.N.*`).
"""

from __future__ import annotations

import os
from typing import Any
from pathlib import Path

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
VOCAB_SIZE = 272  # 256 bytes + 5 specials + padding rows, like Qwen3's table is wider than its tokenizer
MASK_TOKEN_ID = 256 + len(SPECIAL_TOKENS)  # the first row after the tokenizer's vocabulary (Qwen3 does the same)

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def make_tokenizer() -> Any:
    """A byte-level BPE tokenizer (one token per byte, no merges) with Qwen3's special tokens; works offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda c: _byte_of(c))
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
    )


def _byte_of(ch: str) -> int:
    # GPT-2's bytes_to_unicode: printable latin-1 bytes map to themselves, the rest to 256+n in order.
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    code = ord(ch)
    if code in printable:
        return code
    others = [b for b in range(256) if b not in printable]
    return others[code - 256]


def _target_config(arch: str, layers: int, hidden: int, kv_heads: tuple[int, int] = (2, 1)) -> Any:
    """`kv_heads`: (KV heads of every layer, or of Gemma 4's sliding ones; of Gemma 4's full ones)."""
    common: dict[str, Any] = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=kv_heads[0],
        head_dim=hidden // 4,
        max_position_embeddings=4096,
        rope_theta=1_000_000.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=[SPECIAL_TOKENS.index("<|im_end|>") + 256, 256],
        pad_token_id=256,
    )
    if arch == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(**common)
    if arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**common)
    if arch == "gemma3":  # sliding-window layers (window 8, shorter than most test prompts) and logit softcapping
        from transformers import Gemma3TextConfig

        common.pop("tie_word_embeddings")
        return Gemma3TextConfig(**common, sliding_window=8, final_logit_softcapping=30.0, tie_word_embeddings=False)
    if arch == "gemma4":  # Gemma 4's 31B layout in small: sliding layers (window 8) and full ones with their own
        # head size and KV heads, the key as the value (k_eq_v), partial rotary on full layers, softcapping, tied head
        from transformers import Gemma4TextConfig

        common.pop("tie_word_embeddings")
        common.pop("rope_theta")
        types = ["full_attention" if i % 3 == 2 or i == layers - 1 else "sliding_attention" for i in range(layers)]
        gemma4: dict[str, Any] = dict(global_head_dim=hidden // 2, num_global_key_value_heads=kv_heads[1])  # untyped
        return Gemma4TextConfig(**common, **gemma4, layer_types=types, sliding_window=8, attention_k_eq_v=True,
                                final_logit_softcapping=30.0, hidden_size_per_layer_input=0, tie_word_embeddings=True)
    raise ValueError(f"unknown tiny architecture {arch!r}; use 'qwen3', 'llama', 'gemma3' or 'gemma4'")


def drafter_config(target_cfg: Any, *, layers: int, block_size: int, target_layer_ids: list[int], gemma: bool = False,
                   kv_heads: int = 2) -> dict:
    """A z-lab style drafter config.json (a Qwen3 config plus block_size and dflash_config); `gemma` (a Gemma 4 target),
    the gemma-4 drafter's knobs: sliding (causal, windowed) and full draft layers, the target's embedding scale
    and its final-logit softcapping on the draft path."""
    hidden = target_cfg.hidden_size
    extra = {}
    if gemma:
        extra = {"layer_types": ["sliding_attention"] * (layers - 1) + ["full_attention"], "sliding_window": 4,
                 "use_sliding_window": True}
    base = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // 4,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "max_position_embeddings": target_cfg.max_position_embeddings,
        "vocab_size": target_cfg.vocab_size,
        "attention_bias": False,
        "tie_word_embeddings": True,
        "block_size": block_size,
        "num_target_layers": target_cfg.num_hidden_layers,
        "dflash_config": {"mask_token_id": MASK_TOKEN_ID, "target_layer_ids": target_layer_ids},
        "dtype": "float32",
    }
    if gemma:
        base["dflash_config"].update(input_embedding_scale=hidden**0.5,
                                     final_logit_softcapping=target_cfg.final_logit_softcapping)
    return {**base, **extra}


def make_tiny_pair(
    out_dir: str | os.PathLike,
    *,
    arch: str = "qwen3",  # or "llama", "gemma3", "gemma4"
    seed: int = 0,
    block_size: int = 8,
    layers: int = 4,
    hidden: int = 64,
    draft_layers: int = 2,
    predictable: bool = False,
    kv_heads: tuple[int, int] = (2, 1),
    draft_kv_heads: int = 2,
) -> tuple[Path, Path]:
    """Write a tiny random target and a matching z-lab format drafter under `out_dir`.

    Returns `(target_dir, drafter_dir)`. Weights are random (seeded): the drafter accepts ~nothing.
    With `predictable=True` both models are wired to always predict the letter "a" (layers silenced,
    one hidden dimension carrying a positive constant to the head): the drafter is then always right,
    every step accepts the whole block (tau = B), which shows DFlash's speedup on a CPU. `kv_heads`: the
    target's KV heads (Gemma 4: its sliding layers', its full layers'), of 4 query heads; `draft_kv_heads`: the
    drafter's.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from dflash_bench.engine.reference.drafter import DFlashDrafter, DrafterConfig, save_drafter

    out = Path(out_dir)
    target_dir, drafter_dir = out / "target", out / "drafter"
    torch.manual_seed(seed)
    cfg = _target_config(arch, layers, hidden, kv_heads)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # peaked next-token distributions: decisive argmax, meaningful sampling
        if cfg.tie_word_embeddings:  # the head is the embedding table: scale the final norm instead
            model.model.norm.weight.mul_(25.0)
        else:
            model.get_output_embeddings().weight.mul_(25.0)
        if predictable:
            _wire_constant(model, model.get_input_embeddings().weight, model.model.norm.weight,
                           model.get_output_embeddings().weight)
    model.generation_config = GenerationConfig(eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id)
    model.save_pretrained(target_dir)
    make_tokenizer().save_pretrained(target_dir)

    ids = sorted({0, max(0, layers // 2), max(0, layers - 2)})
    if arch == "gemma4":  # six target features, as the gemma-4-31B drafter reads
        ids = [round(i * (layers - 2) / 5) for i in range(6)]  # not the last layer (HF reports it normed)
    dcfg = DrafterConfig.from_dict(drafter_config(cfg, layers=draft_layers, block_size=block_size, target_layer_ids=ids,
                                                 gemma=arch == "gemma4", kv_heads=draft_kv_heads))
    drafter = DFlashDrafter(dcfg)
    drafter.init_random(seed)
    if predictable:
        with torch.no_grad():
            _wire_constant(drafter, None, drafter.norm.weight, None)
    save_drafter(drafter, drafter_dir)
    return target_dir, drafter_dir


PREDICTED_TOKEN = ord("a")


def _wire_constant(model: torch.nn.Module, embed: torch.Tensor | None, norm_weight: torch.Tensor,
                   head: torch.Tensor | None) -> None:
    """Silence every layer (zero o_proj/down_proj) and route hidden dim 0 (kept positive) to PREDICTED_TOKEN."""
    for name, p in model.named_parameters():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            p.zero_()
    norm_weight.zero_()
    norm_weight[0] = 1.0
    if embed is not None:
        embed[:, 0] = embed[:, 0].abs() + 1.0
    if head is not None:
        head[:, 0] = torch.rand(head.shape[0]) * 0.5
        head[PREDICTED_TOKEN, 0] = 1.0
