"""The fast engine's core over a loaded target and drafter: what `engine.FastEngine` runs, and every other rank of a
tensor-parallel engine runs beside it (`ranks.py`), built the same way from the same config."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from dflash_bench.engine.config import EngineConfig, StepConfig
from dflash_bench.engine.fast.core import EngineCore
from dflash_bench.engine.fast.models.draft import FastDrafter
from dflash_bench.engine.fast.models.family import family_of, load_target
from dflash_bench.engine.fast.parallel.ranks import rank_device
from dflash_bench.engine.fast.models.shard import Shard

log = logging.getLogger("dflash_bench.engine")


def make_core(model: Any, drafter: Any, step: StepConfig, *, max_slots: int, max_len: int, kernels: bool = True,
              shard: Shard | None = None, consume: bool = False, graphs: bool | None = None,
              watch: Any = None) -> EngineCore:
    """The fast path's core (scheduler and runner) over a loaded transformers target and a `DFlashDrafter` (or
    None), this rank's shard of them with `shard`, stepping as `step` says, its graphs captured (`consume`: the
    target's layers are dropped once copied; `kernels` False: torch ops; `graphs` False: every step
    eager, as on a CPU; `watch`: a tensor-parallel rank's watchdog, `ranks.Watch`, each graph's capture one call)."""
    want = None if kernels else False
    ft = load_target(model, max_slots=max_slots, max_len=max_len, kernels=want, consume=consume, shard=shard)
    fd = (FastDrafter(drafter, ft.embed, ft.head, max_slots=max_slots, max_len=max_len, kernels=want, shard=shard)
          if drafter is not None else None)
    core = EngineCore(ft, fd, step, graphs=graphs, keep_logits=True)
    core.capture_all(watch)  # GPU: every graph before the first request (no capture pause mid-serving)
    return core


def load_pair(model: str, draft: str | None, *, dtype: Any, device: str, dummy: bool) -> tuple[Any, Any]:
    """The target (a transformers model) and the drafter (a DFlashDrafter, or None) as the fast path serves them:
    one sentence for a target it does not run, or a drafter that does not fit it."""
    from dflash_bench.engine.reference.drafter import load_drafter
    from dflash_bench.engine.reference.target import load_model, resolve_dtype

    dt = resolve_dtype(dtype, device) if isinstance(dtype, str) else dtype
    t0 = time.perf_counter()
    hf: Any = load_model(model, dtype=dt, device=device, dummy=dummy)  # a transformers model
    cfg = hf.config.get_text_config()
    family_of(cfg)  # one sentence when the fast path runs no such model
    drafter = None if draft is None else load_drafter(
        draft, target_hidden=cfg.hidden_size, target_layers=cfg.num_hidden_layers,
        target_vocab=hf.get_output_embeddings().weight.shape[0], dtype=dt, device=device, dummy=dummy)
    log.info("loaded the target%s on %s in %.1f s%s", " and the drafter" if drafter is not None else "", device,
             time.perf_counter() - t0, " (random weights)" if dummy else "")
    return hf, drafter


def rank_core(config: EngineConfig, rank: int, shard: Shard, slots: Callable[[], object],
              watch: Any) -> EngineCore | None:
    """What a tensor-parallel rank above 0 runs (`ranks.run_rank`): the pair loaded as rank 0 loads it and cut to this
    rank's shard, then its core made with rank 0's slots (`slots()`: rank 0's pool, sized from its device's memory; None
    when rank 0 stopped first), each graph's capture watched (`watch`, the rank's `ranks.Watch`). The core replays
    rank 0's runner calls (`EngineCore.replay`)."""
    hf, drafter = load_pair(config.model, config.draft, dtype=config.dtype, device=rank_device(config, rank),
                            dummy=config.dummy)
    shard = shard.cut(hf, drafter)
    n = slots()
    if not isinstance(n, int):
        return None
    core = make_core(hf, drafter, config.step, max_slots=n, max_len=config.max_model_len, kernels=config.kernels,
                     shard=shard, consume=True, graphs=False if config.enforce_eager else None, watch=watch)
    del hf
    return core
