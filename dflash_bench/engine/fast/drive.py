"""Driving an `EngineCore` to the end without a server: what tests and benchmarks decode with."""

from __future__ import annotations

from typing import Callable

from dflash_bench.engine.fast.core import EngineCore
from dflash_bench.engine.fast.scheduling.scheduler import Row


def generate(core: EngineCore, prompts: list[list[int]], max_new: int, *, pipeline: bool = True) -> list[list[int]]:
    """Greedy-decode every prompt to `max_new` tokens, all batched together in slots 0..n-1."""
    outs = [[core.add(i, p)] for i, p in enumerate(prompts)]
    decode(core, outs, max_new, pipeline=pipeline)
    return [o[:max_new] for o in outs]


def decode(core: EngineCore, outs: list[list[int]], max_new: int, *, pipeline: bool = True,
           on_done: Callable[[int], None] | None = None) -> None:
    """Extend each `outs[i]` (slot i, prefilled) to at least `max_new` tokens, releasing each slot when done
    (`on_done(i)` is called first: a benchmark's hook, e.g. when the first request finished).

    Pipelined: the next step is launched before this one's tokens are read, with the same slots, unless a
    slot could finish with the steps already in flight (that step would be wasted on it): the scheduler's
    step-ahead (`Scheduler.schedule`).
    """
    live = [i for i in range(len(outs)) if len(outs[i]) < max_new]
    while live:
        core.schedule([Row(i, left=max_new - len(outs[i])) for i in live], ahead=pipeline)
        got = core.collect()
        for i in live:
            outs[i].extend(got[i])
            if len(outs[i]) >= max_new:
                if on_done is not None:
                    on_done(i)
                core.release(i)
        live = [i for i in live if len(outs[i]) < max_new]
    while core.inflight:
        core.collect()
    for i in range(len(outs)):
        core.release(i)
