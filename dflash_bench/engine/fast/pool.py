"""How many slots (rows decoded together) the fast path's KV pool holds, and why not more.

The pool is chosen from a memory budget, as vLLM's `gpu_memory_utilization` chooses its KV blocks: on a GPU,
`memory_utilization` of the device's total memory less what is in use once the weights are loaded (this process's
and any other's), or a budget given in bytes (`--kv-cache-memory-bytes`, the only budget on the CPU). A slot costs
its K/V for `max_len` tokens in every target and drafter layer, and the float32 logits of one verified block.
`--max-slots N` asks for N slots: granted when they fit, else one sentence says why not.

The arithmetic knows the dense layouts (`model.KVCache`: Qwen3, Llama, the drafter). Gemma 4's per-kind layout
(`gemma.GemmaTarget._kinds`) is not sized here: its pool stays `DEFAULT_SLOTS` unless `--max-slots` is given.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from dflash_bench.errors import UserError

DEFAULT_SLOTS = 32  # without a budget (the CPU, or a layout not sized here): the pool as before
MOST_SLOTS = 128  # a pool chosen from memory holds at most this many (the most rows issue 44's table asks for)
log = logging.getLogger("dflash_bench.engine")
GIB = float(1 << 30)
MIB = float(1 << 20)


@dataclass(frozen=True)
class Budget:
    """Bytes the KV pool may take, and how they were found (for the sentence that refuses a pool)."""

    nbytes: int
    how: str  # e.g. "0.90 of the device's 79.1 GiB, less the 16.2 GiB in use after loading the weights"


def slot_bytes(cfg: Any, drafter_cfg: Any | None, *, max_len: int, dtype_bytes: int, block: int = 1) -> int | None:
    """Bytes one slot holds: K and V for `max_len` tokens in every layer of the target (`cfg`, a transformers text
    config) and the drafter, and float32 logits for `block` positions; None for a layout not sized here."""
    if getattr(cfg, "model_type", "") == "gemma4_text":
        return None
    heads = cfg.num_attention_heads
    hkv = getattr(cfg, "num_key_value_heads", None) or heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    per_token = cfg.num_hidden_layers * hkv * hd
    if drafter_cfg is not None:
        per_token += drafter_cfg.num_hidden_layers * drafter_cfg.num_key_value_heads * drafter_cfg.head_dim
    return 2 * per_token * max_len * dtype_bytes + block * cfg.vocab_size * 4


def device_budget(device: str, utilization: float) -> Budget | None:
    """The budget on a CUDA device after the weights are loaded (None on the CPU): `utilization` of its total
    memory, less what is in use now."""
    if not device.startswith("cuda"):
        return None
    import torch

    free, total = torch.cuda.mem_get_info(torch.device(device))
    used = total - free
    return Budget(int(utilization * total) - used,
                  f"{utilization:.2f} of the device's {total / GIB:.1f} GiB, less the {used / GIB:.1f} GiB in use "
                  "after loading the weights")


def given_budget(nbytes: int) -> Budget:
    return Budget(nbytes, "--kv-cache-memory-bytes")


def choose_slots(asked: int | None, budget: Budget | None, per_slot: int | None, *, max_len: int) -> int:
    """The pool's slots: `asked` when it fits the budget, else the most that fit (at most MOST_SLOTS); without a
    budget or a known slot size, `asked` or DEFAULT_SLOTS. Raises UserError (one sentence) when it cannot."""
    if asked is not None and asked < 1:
        raise UserError("--max-slots must be at least 1")
    if budget is None or per_slot is None:
        return asked if asked is not None else DEFAULT_SLOTS
    fit = max(budget.nbytes, 0) // per_slot
    each = f"{per_slot / MIB:.1f} MiB a slot of {max_len} tokens"
    if fit < 1:
        raise UserError(f"no KV slot fits: {each}, and {max(budget.nbytes, 0) / GIB:.2f} GiB is left for the pool "
                        f"({budget.how}); lower --max-model-len, or give the pool more memory")
    if asked is None:
        return min(fit, MOST_SLOTS)
    if asked > fit:
        raise UserError(f"--max-slots {asked} needs {asked * per_slot / GIB:.2f} GiB of KV cache ({each}) but "
                        f"{budget.nbytes / GIB:.2f} GiB is left for it ({budget.how}); {fit} slots fit: lower "
                        "--max-slots or --max-model-len, or give the pool more memory")
    return asked


def pool_slots(cfg: Any, drafter: Any, *, asked: int | None, device: str, dtype: Any, max_len: int,
               utilization: float, nbytes: int | None) -> int:
    """The KV pool's slots for this target (`cfg`) and drafter (a DFlashDrafter or None), once their weights are on
    the device; logs what it chose from what."""
    import torch

    if not 0 < utilization <= 1:
        raise UserError(f"--memory-utilization must lie in (0, 1], not {utilization:g}")
    if nbytes is not None and nbytes < 1:
        raise UserError("--kv-cache-memory-bytes must be a positive number of bytes")
    budget = given_budget(nbytes) if nbytes is not None else device_budget(device, utilization)
    dc = drafter.config if drafter is not None else None
    per_slot = slot_bytes(cfg, dc, max_len=max_len, dtype_bytes=torch.empty((), dtype=dtype).element_size(),
                          block=dc.block_size if dc is not None else 1)
    slots = choose_slots(asked, budget, per_slot, max_len=max_len)
    if budget is not None and per_slot is not None:
        log.info("KV pool: %d slots of %d tokens, %.2f GiB of the %.2f GiB left for it (%s)", slots, max_len,
                 slots * per_slot / GIB, budget.nbytes / GIB, budget.how)
    return slots
