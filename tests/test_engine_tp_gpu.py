"""Tensor parallelism as `serve --fast --tensor-parallel-size 2` runs it on two GPUs (NCCL, Triton kernels, CUDA
graphs with the all-reduces captured in them, steps run ahead, the adaptive width): the single-GPU engine's tokens.

Run on a host with two GPUs, alone: `pytest -m gpu tests/test_engine_tp_gpu.py`. Skipped with fewer than two.
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
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                       reason="Triton's interpreter is on: run `pytest -m gpu tests/test_engine_tp_gpu.py` alone"),
]

B, N, SLOTS, MAX_LEN = 6, 48, 8, 512
FAVOURED = range(97, 100)  # embedding rows made larger: drafts and targets agree now and then (ragged acceptance)


@pytest.fixture(scope="module", params=["qwen3", "gemma4"])
def pair(request, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from dflash_bench.engine.tiny import make_tiny_pair

    arch = request.param
    target, drafter = make_tiny_pair(tmp_path_factory.mktemp(arch), arch=arch, seed=1, block_size=B, layers=5,
                                     kv_heads=(4, 2) if arch == "gemma4" else (2, 2))
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    with torch.no_grad():
        scale = 3.0 if model.config.tie_word_embeddings else 6.0
        model.get_input_embeddings().weight[FAVOURED] *= scale
        if not model.config.tie_word_embeddings:
            model.get_output_embeddings().weight[FAVOURED] *= scale
    model.save_pretrained(target)
    return str(target), str(drafter)


def _prompts(tok, n: int) -> list[list[int]]:
    rng = random.Random(n)
    words = "the cat sat on a mat while seven dogs ran past quickly".split()
    return [tok(" ".join(rng.choice(words) for _ in range(rng.randint(1, 30)))).input_ids for _ in range(n)]


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("mode", ["ar", "dflash"])
def test_two_gpus_decode_what_one_decodes(pair, mode, adaptive, graphs):
    """Fixed width: the same tokens step for step (the same accepted drafts); the adaptive width (chosen from each
    engine's own step times): the same tokens. `eager` (serve --enforce-eager): the collectives outside graphs,
    to tell a captured collective's fault from the step's."""
    from dflash_bench.engine.decode import generate
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.fast.engine import build_fast_engine
    from dflash_bench.engine.sampling import SamplingParams

    if mode == "ar" and adaptive:
        pytest.skip("AR has no width")
    if not graphs and adaptive:
        pytest.skip("the eager case runs the fixed width only")
    target, drafter = pair
    draft = drafter if mode == "dflash" else None
    kw = dict(mode=mode, max_slots=SLOTS, max_model_len=MAX_LEN, dtype="float32", device="cuda", prefill="first",
              verify_width="auto" if adaptive else "full")
    one = build_fast_engine(EngineConfig.from_options(target, draft, **kw, fast=True))
    ps = _prompts(one.tok, 6)
    sp = SamplingParams(max_tokens=N, ignore_eos=True)
    want = [s.out for s in generate(one, ps, sp)]
    two = build_fast_engine(EngineConfig.from_options(target, draft, tensor_parallel_size=2, enforce_eager=not graphs, **kw, fast=True))
    try:
        r = two.core.runner
        assert r.graphs_on == bool(r.graphs) == graphs and r.t.kernels is not None and r.t.tp.size == 2
        depth = []
        run = r.run

        def counted(plan):
            run(plan)
            depth.append(len(r.inflight))
        r.run = counted
        got = [s.out for s in generate(two, ps, sp)]
    finally:
        two.close()
    assert all(not p.is_alive() for p in two.followers.procs)
    assert got == want and all(len(o) == N for o in got)
    assert max(depth) == 2  # steps ran ahead
    if mode == "dflash" and not adaptive:
        assert (two.stats.drafts, two.stats.accepted) == (one.stats.drafts, one.stats.accepted)
        assert two.stats.accepted_per_pos == one.stats.accepted_per_pos
