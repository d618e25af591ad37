"""Helpers of the fast path's tests (test_engine_fast*.py): tiny real pairs built once per module, the fast
runner over them, the CPU's two ways of running a step, a decode loop like the server's."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("transformers")

from dflash_bench.engine.build import build  # noqa: E402
from dflash_bench.engine.config import EngineConfig  # noqa: E402
from dflash_bench.engine.config import StepConfig  # noqa: E402
from dflash_bench.engine.fast.models.draft import FastDrafter  # noqa: E402
from dflash_bench.engine.fast.models.dense import DenseTarget  # noqa: E402
from dflash_bench.engine.fast.core import EngineCore  # noqa: E402
from dflash_bench.engine.fast.running.timer import StepTimer  # noqa: E402
from dflash_bench.engine.sampling_params import SamplingParams  # noqa: E402
from dflash_bench.testing.tiny import make_tiny_pair  # noqa: E402

B, N, SLOTS, MAX_LEN = 6, 40, 8, 256


def tiny_prompts(tok, n):
    rng = random.Random(n)
    words = "the cat sat on a mat while seven dogs ran past quickly".split()
    return [tok(" ".join(rng.choice(words) for _ in range(rng.randint(1, 30)))).input_ids for _ in range(n)]


ARCHS = ["qwen3", "llama"]  # the architectures of the `setup` fixture each test module makes from tiny_engines


def tiny_engines(arch: str, tmp_path_factory):
    """A tiny real pair of `arch` and the reference engines over it, AR and DFlash."""
    target, drafter = make_tiny_pair(tmp_path_factory.mktemp(arch), arch=arch, seed=1, block_size=B)
    ar = build(EngineConfig(str(target), mode="ar", max_slots=SLOTS, max_model_len=MAX_LEN, dtype="float64", device="cpu"))
    df = build(EngineConfig(str(target), str(drafter), mode="dflash", max_slots=SLOTS, max_model_len=MAX_LEN, dtype="float64", device="cpu"))
    return ar, df


def fast_runner(df, *, drafter=True, kernels=None, keep_logits=False, **step):
    """kernels None: the CPU kernels where a C compiler builds them (else the torch path); False: the torch path.
    `step`: `StepConfig`'s fields (default: the whole block verified every step)."""
    t = DenseTarget(df.target.model, max_slots=SLOTS, max_len=MAX_LEN, kernels=kernels)
    d = FastDrafter(df.proposer.drafter, t.embed, t.head, max_slots=SLOTS, max_len=MAX_LEN,
                    kernels=kernels) if drafter else None
    runner = EngineCore(t, d, StepConfig(**{"verify_width": "full", "kv_block": 16, **step}), keep_logits=keep_logits)
    StepTimer().attach(runner)  # its counts: tau, drafts verified, row-steps
    return runner


# the two ways a CPU runs a step: the C kernels (engine/fast/kernels/cpu_kernels.c) and plain torch ops
PATHS = [pytest.param("cpu", id="cpu-kernels"), pytest.param(False, id="torch-ops")]


def usable_path(kernels):
    if kernels == "cpu":
        from dflash_bench.engine.fast.kernels import cpu_kernels

        if cpu_kernels.load() is None:
            pytest.skip("no C compiler builds the CPU kernels")
    return kernels


def serve_requests(engine, reqs: list[tuple[int, list[int], SamplingParams]]) -> tuple[dict, list[int]]:
    """A decode loop like the server's: request i arrives at step `at` (when a slot is free), finished
    requests give their slot back at once. Returns (tokens and logprobs per request, steps in flight after
    each step() call)."""
    pending = sorted(enumerate(reqs), key=lambda r: r[1][0])
    running, seqs, lps, inflight, t = [], {}, {}, [], 0
    while pending or running:
        while pending and pending[0][1][0] <= t and engine.free_slots:
            i, (_, prompt, sp) = pending.pop(0)
            seq, d = engine.add(str(i), prompt, sp)  # d None: its first token comes from a step
            seqs[i], lps[i] = seq, list(d.logprobs or []) if d else []
            running.append(seq)
        for d in engine.step(running) if running else []:
            lps[int(d.req_id)] += d.logprobs or []
        inflight.append(engine.core.inflight)
        for seq in [q for q in running if q.finish]:
            engine.release(seq)
            running.remove(seq)
        t += 1
    return {i: (seqs[i].out, lps[i]) for i in seqs}, inflight
