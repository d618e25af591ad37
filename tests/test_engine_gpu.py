"""The fast path as `serve --fast` runs it on a GPU (Triton kernels, CUDA graphs, steps run ahead) on the tiny
pair, against the reference engine: the same token ids, AR and DFlash, and the same acceptance.

Run on a GPU host, alone: `pytest -m gpu tests/test_engine_gpu.py`. Skipped without CUDA; the CPU suite runs
Triton's interpreter (tests/conftest.py), which these tests need off, so they skip under it too.
"""

from __future__ import annotations

import os
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.engine,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                       reason="Triton's interpreter is on: run `pytest -m gpu tests/test_engine_gpu.py` alone"),
]

B, N, SLOTS, MAX_LEN = 6, 48, 8, 512


def _prompts(tok, n: int) -> list[list[int]]:
    rng = random.Random(n)
    words = "the cat sat on a mat while seven dogs ran past quickly".split()
    return [tok(" ".join(rng.choice(words) for _ in range(rng.randint(1, 30)))).input_ids for _ in range(n)]


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def pair(request, tmp_path_factory):
    from dflash_bench.testing.tiny import make_tiny_pair

    return make_tiny_pair(tmp_path_factory.mktemp(request.param), arch=request.param, seed=1, block_size=B)


@pytest.mark.parametrize("prefill", ["graphs", "grouped", "batched"])
@pytest.mark.parametrize("mode", ["ar", "dflash"])
def test_graphed_step_ahead_fast_path_equals_the_reference(pair, mode, prefill, monkeypatch):
    """`prefill`: the prompts one graph each (a token budget of one prompt per group), in one captured graph of six
    rows (6 made one of GRAPHED_ROWS), or together in one eager forward (as a burst of prompts is: six short
    prompts are under PREFILL_TOKENS and more than GRAPHED_ROWS)."""
    from dflash_bench.engine.build import build
    from dflash_bench.engine.reference.decode import generate
    from dflash_bench.engine.fast.running import runner as runner_mod
    from dflash_bench.engine.fast.scheduling import scheduler as scheduler_mod
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.sampling_params import SamplingParams

    if prefill == "graphs":
        monkeypatch.setattr(scheduler_mod, "PREFILL_TOKENS", 1)
    if prefill == "grouped":
        for mod in (scheduler_mod, runner_mod):
            monkeypatch.setattr(mod, "GRAPHED_ROWS", (2, 3, 6))
    target, drafter = pair
    draft = str(drafter) if mode == "dflash" else None
    kw = dict(mode=mode, max_slots=SLOTS, dtype="float32", device="cuda")
    ref = build(EngineConfig(str(target), draft, max_model_len=MAX_LEN, **kw))
    fast = build(EngineConfig.from_options(str(target), draft, max_model_len=MAX_LEN, step_ahead=True, prefill="first",
                                                       **kw, fast=True))
    probe = fast.core.probe
    assert probe.graphed and probe.graphs and probe.target.kernels is not None  # captured at build, Triton kernels on

    depth = []  # steps in flight after each launch: 2 means one was launched before the last one's tokens were read
    batched = []  # the prompts of each prefill group run as one eager forward

    def watched(launch):
        if launch.plan is not None:
            depth.append(launch.inflight)
        elif launch.P is None:
            batched.append(len(launch.prefill))
    fast.core.watch(watched)

    ps = _prompts(ref.tok, 6)
    sp = SamplingParams(max_tokens=N, ignore_eos=True)
    want = [s.out for s in generate(ref, ps, sp)]
    got = [s.out for s in generate(fast, ps, sp)]
    assert got == want and all(len(o) == N for o in got)
    assert max(depth) == 2  # steps ran ahead
    assert batched == ([6] if prefill == "batched" else [])
    assert any(key[0] == "prefill" and key[2:] == (6,) for key in probe.graphs) == (prefill == "grouped")
    assert fast.stats.generation_tokens == ref.stats.generation_tokens
    if mode == "dflash":  # the same drafts accepted, step by step: the same tau
        assert (fast.stats.drafts, fast.stats.accepted) == (ref.stats.drafts, ref.stats.accepted)
        assert fast.stats.accepted_per_pos == ref.stats.accepted_per_pos


def test_prompts_that_ride_in_graphed_steps_get_what_they_get_alone(pair):
    """AR with `mixed` under CUDA graphs: prompts admitted while others decode are prefilled by the rows' next
    step (one captured graph per batch bucket, prompt bucket and prompt count; two of them together), every
    request gets the tokens the reference engine gives it alone."""
    from dflash_bench.engine.build import build
    from dflash_bench.engine.reference.decode import generate
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.sampling_params import SamplingParams

    target, _ = pair
    kw = dict(mode="ar", max_slots=SLOTS, dtype="float32", device="cuda")
    ref = build(EngineConfig(str(target), max_model_len=MAX_LEN, **kw))
    fast = build(EngineConfig.from_options(str(target), max_model_len=MAX_LEN, step_ahead=True, prefill="mixed", **kw,
                                                       fast=True))
    assert any(key[0] == "mixed" for key in fast.core.probe.graphs)  # captured at build
    ps = _prompts(ref.tok, 6)
    sp = SamplingParams(max_tokens=N, ignore_eos=True)
    want = [generate(ref, [p], sp)[0].out for p in ps]
    carried: list[int] = []
    fast.core.watch(lambda launch: carried.append(len(launch.plan.rides)) if launch.plan else None)
    out: dict[str, list[int]] = {}
    running = []
    for i, p in enumerate(ps):
        [(seq, delta)] = fast.add_many([(str(i), p, sp)])
        out[seq.req_id] = list(delta.token_ids) if delta is not None else []
        running.append(seq)
        for _ in range(0 if i == 2 else 1 + i % 2):  # 2 and 3 ride in one step
            for d in fast.step(running):
                out[d.req_id].extend(d.token_ids)
            for s in [s for s in running if s.finish]:
                fast.release(s)
                running.remove(s)
    while running:
        for d in fast.step(running):
            out[d.req_id].extend(d.token_ids)
        for s in [s for s in running if s.finish]:
            fast.release(s)
            running.remove(s)
    assert fast.core.rode == 5 and max(carried) == 2  # every prompt but the first rode in a step
    assert out == {str(i): want[i] for i in range(len(ps))}


@pytest.fixture(scope="module")
def gemma_pair(tmp_path_factory):
    from dflash_bench.testing.tiny import make_tiny_pair

    return make_tiny_pair(tmp_path_factory.mktemp("gemma4"), arch="gemma4", seed=1, block_size=B, layers=7)


@pytest.mark.parametrize("kernels", [True, False], ids=["fused-kernels", "torch-ops"])
@pytest.mark.parametrize("mode", ["ar", "dflash"])
def test_gemma4_fast_path_equals_the_reference(gemma_pair, mode, kernels):
    """Gemma 4 (sliding layers' ring shorter than the prompts, k_eq_v, partial rotary) under CUDA graphs and
    step-ahead: with the Triton kernels (the fused q/k/v norms + RoPE + cache write, GeGLU) and with torch ops, the
    greedy tokens and acceptance of the reference engine."""
    from dflash_bench.engine.build import build
    from dflash_bench.engine.reference.decode import generate
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.sampling_params import SamplingParams

    target, drafter = gemma_pair
    draft = str(drafter) if mode == "dflash" else None
    kw = dict(mode=mode, max_slots=SLOTS, dtype="float32", device="cuda")
    ref = build(EngineConfig(str(target), draft, max_model_len=MAX_LEN, **kw))
    fast = build(EngineConfig.from_options(str(target), draft, max_model_len=MAX_LEN, step_ahead=True, kernels=kernels,
                                                       prefill="first", **kw, fast=True))
    t = fast.core.probe.target
    assert fast.core.probe.graphed and fast.core.probe.graphs
    assert (t.fused is not None) == kernels and t.kinds[0].ring  # the sliding layers keep a ring
    ps = _prompts(ref.tok, 6)
    assert max(len(p) for p in ps) > t.kinds[0].window  # prompts longer than the window
    sp = SamplingParams(max_tokens=N, ignore_eos=True)
    want = [s.out for s in generate(ref, ps, sp)]
    assert [s.out for s in generate(fast, ps, sp)] == want
    if mode == "dflash":  # the same drafts accepted: the same tau
        assert (fast.stats.drafts, fast.stats.accepted) == (ref.stats.drafts, ref.stats.accepted)
    assert [generate(fast, [p], sp)[0].out for p in ps[:2]] == want[:2]  # batch 1
