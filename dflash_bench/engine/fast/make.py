"""The fast engine's core over a loaded target and drafter: what `engine.FastEngine` runs, and every other rank of a
tensor-parallel engine runs beside it (`ranks.py`), built the same way from the same config."""

from __future__ import annotations

from typing import Any

from dflash_bench.engine.config import StepConfig
from dflash_bench.engine.fast.core import EngineCore
from dflash_bench.engine.fast.draft import FastDrafter
from dflash_bench.engine.fast.family import family_of, load_target
from dflash_bench.engine.fast.shard import Shard


def make_core(model: Any, drafter: Any, step: StepConfig, *, max_slots: int, max_len: int, kernels: bool = True,
              tp: Shard | None = None, consume: bool = False, graphs: bool | None = None,
              watch: Any = None) -> EngineCore:
    """The fast path's core (scheduler and runner) over a loaded transformers target and a `DFlashDrafter` (or
    None), this rank's shard of them with `tp`, stepping as `step` says, its graphs captured (`consume`: the
    target's layers are dropped once copied; `kernels` False: torch ops; `graphs` False: every step
    eager, as on a CPU; `watch`: a tensor-parallel rank's watchdog, `ranks.Watch`, each graph's capture one call)."""
    want = None if kernels else False
    ft = load_target(model, max_slots=max_slots, max_len=max_len, kernels=want, consume=consume, tp=tp)
    fd = (FastDrafter(drafter, ft.embed, ft.head, max_slots=max_slots, max_len=max_len, kernels=want, tp=tp)
          if drafter is not None else None)
    core = EngineCore(ft, fd, step, graphs=graphs, keep_logits=True)
    core.capture_all(watch)  # GPU: every graph before the first request (no capture pause mid-serving)
    return core


def load_pair(model: str, draft: str | None, *, dtype: Any, device: str, dummy: bool) -> tuple[Any, Any]:
    """The target (a transformers model) and the drafter (a DFlashDrafter, or None) as the fast path serves them:
    one sentence for a target it does not run, or a drafter that does not fit it."""
    from dflash_bench.engine.build import resolve_dtype
    from dflash_bench.engine.drafter import load_drafter
    from dflash_bench.engine.target import load_model

    dt = resolve_dtype(dtype, device) if isinstance(dtype, str) else dtype
    hf: Any = load_model(model, dtype=dt, device=device, dummy=dummy)  # a transformers model
    cfg = hf.config.get_text_config()
    family_of(cfg)  # one sentence when the fast path runs no such model
    if draft is None:
        return hf, None
    return hf, load_drafter(draft, target_hidden=cfg.hidden_size, target_layers=cfg.num_hidden_layers,
                            target_vocab=hf.get_output_embeddings().weight.shape[0], dtype=dt, device=device,
                            dummy=dummy)
