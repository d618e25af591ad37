"""`build`: the builtin engine from an `EngineConfig`, the one entry point for `serve`, tests and benchmarks.

It owns what both engines share, once: the mode's drafter, synthetic acceptance's conditions, the device (`auto`
resolved, a GPU asked for and missing refused, torch's threads on a CPU), the dtype (`auto` resolved), the
tokenizer; then it makes the reference engine (`reference/decode.py`) or the fast path's (`fast/engine.py`,
`config.fast`), each from the config it resolved. Each engine's own defaults are the config's (`DEFAULT_SLOTS`,
`DEFAULT_MEMORY_UTILIZATION`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from dflash_bench.engine.config import EngineConfig
from dflash_bench.engine.interface import Engine
from dflash_bench.errors import UserError


def load_tokenizer(path: str) -> Any:
    from dflash_bench.tokenizer import load_tokenizer as load

    return load(path, "for the engine")


def resolved(config: EngineConfig) -> EngineConfig:
    """`config` as an engine runs it, checked: the drafter its mode needs, synthetic acceptance only where it may
    run, `device` and `dtype` as names of this machine's (auto resolved; a GPU asked for must be there)."""
    from dflash_bench.engine.reference.target import resolve_dtype

    mode, drawn, device = config.mode, config.step.drawn, config.device
    if mode == "dflash" and not config.draft:
        raise UserError("mode dflash needs a drafter: pass --draft <drafter folder>")
    if drawn and not config.benchmark_only:
        raise UserError("--synthetic-acceptance makes every answer wrong on purpose; it needs --benchmark-only")
    if drawn and mode != "dflash":
        raise UserError("--synthetic-acceptance only applies to mode dflash")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device {device!r} was asked for but no CUDA GPU is available; use --device cpu")
    dtype = str(resolve_dtype(config.dtype, device)).removeprefix("torch.")
    return dataclasses.replace(config, device=device, dtype=dtype, draft=config.draft if mode == "dflash" else None)


def build(config: EngineConfig, *, tokenizer: Any = None) -> Engine:
    """The engine `config` asks for, its weights loaded (`tokenizer`: the target's, when the caller has it).

    On a CPU torch runs one thread: small models run many tiny ops, where extra threads only add
    synchronisation, and 10-25x slower steps were measured with 2 threads on a busy 2-core machine."""
    config = resolved(config)
    if config.device == "cpu":
        torch.set_num_threads(1)
    tok = tokenizer or load_tokenizer(config.model)
    if config.fast:  # fast/: fused forward, CUDA graphs (greedy only)
        from dflash_bench.engine.fast.engine import fast_engine

        return fast_engine(config, tok)
    from dflash_bench.engine.reference.decode import reference_engine

    return reference_engine(config, tok)
