"""Driving a `FastRunner` to the end without a server: what tests and benchmarks decode with."""

from __future__ import annotations

from dflash_bench.engine.fast.runner import FastRunner


def generate(runner: FastRunner, prompts: list[list[int]], max_new: int, *, pipeline: bool = True) -> list[list[int]]:
    """Greedy-decode every prompt to `max_new` tokens, all batched together in slots 0..n-1."""
    outs = [[runner.add(i, p)] for i, p in enumerate(prompts)]
    decode(runner, outs, max_new, pipeline=pipeline)
    return [o[:max_new] for o in outs]


def decode(runner: FastRunner, outs: list[list[int]], max_new: int, *, pipeline: bool = True) -> None:
    """Extend each `outs[i]` (slot i, prefilled) to at least `max_new` tokens, releasing each slot when done.

    Pipelined: the next step is launched before this one's tokens are read, with the same slots, unless a
    slot could finish with the steps already in flight (that step would be wasted on it).
    """
    live = [i for i in range(len(outs)) if len(outs[i]) < max_new]
    while live:
        if not runner.inflight and not runner.launch(live):
            raise ValueError(f"a sequence would pass the cache length {runner.max_len}")
        if pipeline and all(len(outs[i]) + runner.reach() < max_new for i in live):
            runner.launch(live)  # may decline near the cache bound; then the next round launches
        got = runner.collect()
        for i in live:
            outs[i].extend(got[i])
            if len(outs[i]) >= max_new:
                runner.release(i)
        live = [i for i in live if len(outs[i]) < max_new]
    while runner.inflight:
        runner.collect()
    for i in range(len(outs)):
        runner.release(i)
