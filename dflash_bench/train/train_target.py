"""Train a tiny Qwen3-architecture target LM from scratch on packed chat text (the tiny pair's target)."""

from __future__ import annotations

import json
import time
from typing import Any, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dflash_bench.train.loss import progress, schedule_lr
from dflash_bench.train.train_tokenizer import EOS, PAD


@dataclass
class TargetSpec:
    hidden: int = 256
    layers: int = 6
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 768
    max_positions: int = 2048
    rope_theta: float = 1_000_000.0


def vocab_rows(tokenizer: Any) -> int:
    """Embedding rows: the tokenizer plus at least one spare row (the DFlash mask id), rounded up to 64."""
    return (len(tokenizer) + 1 + 63) // 64 * 64


def build_target(tokenizer: Any, spec: TargetSpec, seed: int = 0) -> Any:
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config

    eos = [tokenizer.convert_tokens_to_ids(EOS), tokenizer.convert_tokens_to_ids(PAD)]
    cfg = Qwen3Config(
        vocab_size=vocab_rows(tokenizer),
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.hidden // spec.heads,
        max_position_embeddings=spec.max_positions,
        rope_theta=spec.rope_theta,  # type: ignore[call-arg]  # taken through **kwargs (legacy_rope below)
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=eos[1],
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=eos[1])
    return model


def pack(tokenizer: Any, texts: list[str], seq_len: int) -> torch.Tensor:
    """Concatenate the tokenised texts and cut the stream into `[n, seq_len]` windows."""
    ids: list[int] = []
    for i in range(0, len(texts), 1000):
        for row in tokenizer(texts[i : i + 1000], add_special_tokens=False).input_ids:
            ids.extend(row)
    n = len(ids) // seq_len
    return torch.tensor(ids[: n * seq_len], dtype=torch.long).view(n, seq_len)


def legacy_rope(config: Path) -> None:
    """Also write `rope_theta` at the top of a saved config.json, as Qwen3's own configs have it: transformers 5
    keeps it only in `rope_parameters`, and transformers 4 (which z-lab's reference code pins, 4.57.1) reads the
    top-level key, so without it decoded the pair with RoPE base 10000 (recipes/tiny_pair/zlab_check.py)."""
    from dflash_bench.store import atomic_write_json

    cfg = json.loads(config.read_text())
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta")
    if theta is not None and "rope_theta" not in cfg:
        atomic_write_json(config, {**cfg, "rope_theta": theta})


def train_target(tokenizer: Any, texts: list[str], out: str | Path, *, spec: TargetSpec | None = None, steps: int = 1000,
                 batch: int = 32, seq_len: int = 512, lr: float = 2e-3, device: str = "cpu", seed: int = 0,
                 time_limit: float | None = None, log: Callable[[str], object] = print) -> dict:
    """Train from scratch, save `out` (bf16 safetensors, tokenizer, generation config); return a summary."""
    spec = spec or TargetSpec()
    data = pack(tokenizer, texts, seq_len)
    if len(data) < 2:
        raise ValueError(f"only {len(data)} windows of {seq_len} tokens: need more text")
    model = build_target(tokenizer, spec, seed).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"target: {n_params / 1e6:.2f}M parameters, {data.numel() / 1e6:.2f}M training tokens, {steps} steps of {batch}x{seq_len}")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(seed)
    amp = device.startswith("cuda")
    t0, step = time.time(), 0
    warmup = max(1, min(100, steps // 20))
    model.train()
    while True:
        done = progress(step, steps, time.time() - t0, time_limit)
        if done >= 1.0:
            break
        for group in opt.param_groups:
            group["lr"] = schedule_lr(done, step, lr, warmup)
        x = data[torch.randint(len(data), (batch,), generator=g)].to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0:
            log(f"target step {step} ({done:.0%}) loss {loss.item():.3f} ({time.time() - t0:.0f} s)")
        step += 1
    seconds = time.time() - t0
    model.eval()
    model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    model.save_pretrained(str(out))
    legacy_rope(Path(out) / "config.json")
    tokenizer.save_pretrained(str(out))
    return {"params": n_params, "tokens": int(data.numel()), "steps": step, "batch": batch, "seq_len": seq_len,
            "final_loss": round(loss.item(), 4), "seconds": round(seconds, 1), "spec": asdict(spec), "device": device}
