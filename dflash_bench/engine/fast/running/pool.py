"""How many slots (rows decoded together) the fast path's KV pool holds, and why not more.

The pool is chosen from a memory budget, as vLLM's `gpu_memory_utilization` chooses its KV blocks: on a GPU,
`memory_utilization` of the device's total memory less what is in use once the weights are loaded (this process's
and any other's), or a budget given in bytes (`--kv-cache-memory-bytes`, the only budget on the CPU). A slot costs
its K/V for `max_len` tokens in every target and drafter layer, and the float32 logits of one verified block.
`--max-slots N` asks for N slots: granted when they fit, else one sentence says why not.

A slot's bytes come from the layout the caches are allocated from (`cache_layout.py`): the dense targets' one cache,
Gemma 4's sliding layers (a ring of their window) and full ones, the drafter's layers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from dflash_bench.engine.config import DEFAULT_SLOTS, MIN_MODEL_LEN
from dflash_bench.engine.fast.models.family import target_kinds
from dflash_bench.engine.fast.models.cache_layout import drafter_kind, reference_kinds
from dflash_bench.errors import UserError

MOST_SLOTS = 128  # a pool chosen from memory holds at most this many (the most rows a measured table of the engines asks for)
log = logging.getLogger("dflash_bench.engine")
GIVEN = "--kv-cache-memory-bytes"  # a budget's `how` when the user gave it in bytes
GIB = float(1 << 30)
MIB = float(1 << 20)


@dataclass(frozen=True)
class Budget:
    """Bytes the KV pool may take, and how they were found (for the sentence that refuses a pool)."""

    nbytes: int
    how: str  # e.g. "0.90 of the device's 79.1 GiB, less the 16.2 GiB in use after loading the weights"


def slot_bytes(cfg: Any, drafter_cfg: Any | None, *, max_len: int, dtype_bytes: int, block: int = 1,
               fast: bool = True, tp: int = 1) -> int:
    """Bytes one slot holds: K and V in every cache of the target (`cfg`, a transformers text config) and the
    drafter (a `DrafterConfig`) as `cache_layout.py` lays them out for `max_len` tokens, and float32 logits for `block`
    positions. `fast` False: the reference engine's caches (the sweep's check of a builtin server without --fast).
    `tp`: on one rank of that many (its share of the KV heads; the logits are gathered whole on every rank)."""
    kinds = target_kinds(cfg, max_len, tp) if fast else reference_kinds(cfg, max_len)
    kinds += [drafter_kind(drafter_cfg, max_len, tp)] if drafter_cfg is not None else []
    return sum(k.slot_bytes(dtype_bytes) for k in kinds) + block * cfg.vocab_size * 4


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
    return Budget(nbytes, GIVEN)


def human(nbytes: int) -> str:
    n = max(nbytes, 0)
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"


def choose_slots(asked: int | None, budget: Budget | None, per_slot: int, *, max_len: int,
                 at: Callable[[int], int] | None = None) -> int:
    """The pool's slots: `asked` when it fits the budget, else the most that fit (at most MOST_SLOTS); without a
    budget (the CPU without --kv-cache-memory-bytes), `asked` or DEFAULT_SLOTS. Raises UserError (one sentence) when
    it cannot, saying what fits: fewer slots, the longest --max-model-len at which `asked` slots fit (`at`: a slot's
    bytes at a length), or more memory."""
    if budget is None:
        return asked if asked is not None else DEFAULT_SLOTS
    fit = max(budget.nbytes, 0) // per_slot
    each = f"{per_slot / MIB:.1f} MiB a slot of {max_len} tokens"
    more = (f"a larger {GIVEN}" if budget.how == GIVEN else
            "a higher --memory-utilization or a GPU with more memory")
    if fit < 1:
        one = longest_len(1, budget.nbytes, at, below=max_len) if at is not None else 0
        raise UserError(f"no KV slot fits: {each}, and {human(budget.nbytes)} is left for the pool "
                        f"({budget.how}); lower --max-model-len" + (f" to {one}" if one else "")
                        + f", or give the pool more memory ({more})")
    if asked is None:
        return min(fit, MOST_SLOTS)
    if asked > fit:
        shorter = longest_len(asked, budget.nbytes, at, below=max_len) if at is not None else 0
        raise UserError(f"--max-slots {asked} needs {human(asked * per_slot)} of KV cache ({each}) but "
                        f"{human(budget.nbytes)} is left for it ({budget.how}); {fit} slots fit: use "
                        f"--max-slots {fit}" + (f", or --max-model-len {shorter} for {asked} slots" if shorter else "")
                        + f", or give the pool more memory ({more})")
    return asked


def longest_len(slots: int, nbytes: int, at: Callable[[int], int], *, below: int) -> int:
    """The longest --max-model-len (at least MIN_MODEL_LEN, under `below`) at which `slots` slots of `at(len)` bytes
    fit `nbytes`; 0 when none does. A slot's bytes never shrink with its length."""
    lo, hi = MIN_MODEL_LEN - 1, below  # slots fit at lo (or lo is below MIN_MODEL_LEN), not at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if slots * at(mid) <= nbytes else (lo, mid)
    return lo if lo >= MIN_MODEL_LEN else 0


def pool_slots(cfg: Any, drafter: Any, *, asked: int | None, device: str, dtype: Any, max_len: int,
               utilization: float, nbytes: int | None, tp: int = 1) -> int:
    """The KV pool's slots for this target (`cfg`) and drafter (a DFlashDrafter or None), once their weights are on
    the device (`tp`: a rank's shard of them, on this rank's device); logs what it chose from what. `utilization`
    and `nbytes` as `EngineConfig` checked them."""
    import torch

    budget = given_budget(nbytes) if nbytes is not None else device_budget(device, utilization)
    dc = drafter.config if drafter is not None else None
    nb, block = torch.empty((), dtype=dtype).element_size(), dc.block_size if dc is not None else 1
    per_slot = slot_bytes(cfg, dc, max_len=max_len, dtype_bytes=nb, block=block, tp=tp)
    slots = choose_slots(asked, budget, per_slot, max_len=max_len,
                         at=lambda n: slot_bytes(cfg, dc, max_len=n, dtype_bytes=nb, block=block, tp=tp))
    if budget is not None:
        log.info("KV pool: %d slots of %d tokens, %.2f GiB of the %.2f GiB left for it (%s)", slots, max_len,
                 slots * per_slot / GIB, budget.nbytes / GIB, budget.how)
    return slots
