"""Tensor parallelism as `serve --fast --tensor-parallel-size 2` runs it on two GPUs (NCCL, Triton kernels, CUDA
graphs with the all-reduces captured in them, steps run ahead, the adaptive width): the single-GPU engine's tokens.

Run on a host with two GPUs, alone: `pytest -m gpu tests/test_engine_tp_gpu.py`. Skipped with fewer than two.

Each case decodes in a process of its own (rank 0 there, rank 1 its child), its output in a log: a hang the engine's
watchdog catches (`ranks.Watch`, STALL_S below) ends that process with one sentence naming the rank and the step,
and one it does not ends at CASE_S; either way the case fails with the log's last lines and the next case runs.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import sys

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
STALL_S, CASE_S = 60.0, 300.0  # a call of a rank without progress; a whole case (two engines built, decoded)
FAVOURED = range(97, 100)  # embedding rows made larger: drafts and targets agree now and then (ragged acceptance)


@pytest.fixture(scope="module", params=["qwen3", "gemma4"])
def pair(request, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from dflash_bench.testing.tiny import make_tiny_pair

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


# AR has no width to adapt, and the eager case (serve --enforce-eager) runs the fixed width only
CASES = [pytest.param(mode, adaptive, graphs, id=f"{mode}-{'adaptive' if adaptive else 'fixed'}-{'graphs' if graphs else 'eager'}")
         for mode, adaptive, graphs in [("ar", False, True), ("ar", False, False), ("dflash", False, True),
                                        ("dflash", False, False), ("dflash", True, True)]]


@pytest.mark.parametrize("mode, adaptive, graphs", CASES)
def test_two_gpus_decode_what_one_decodes(pair, mode, adaptive, graphs, tmp_path):
    """Fixed width: the same tokens step for step (the same accepted drafts); the adaptive width (chosen from each
    engine's own step times): the same tokens. `eager` (serve --enforce-eager): the collectives outside graphs,
    to tell a captured collective's fault from the step's."""
    target, drafter = pair
    log, out = tmp_path / "case.log", tmp_path / "case.json"
    proc = mp.get_context("spawn").Process(target=_case, args=(target, drafter if mode == "dflash" else None, mode,
                                                                adaptive, graphs, str(log), str(out), "cuda"))
    proc.start()
    proc.join(CASE_S)
    if proc.is_alive():
        proc.kill()  # its rank 1 dies with it (the parent-death signal)
        proc.join()
        pytest.fail(f"no verdict in {CASE_S:.0f} s; the case's log ends:\n{_tail(log)}")
    if proc.exitcode != 0:
        pytest.fail(f"the case's process exited with code {proc.exitcode}; its log ends:\n{_tail(log)}")
    r = json.loads(out.read_text())
    assert r["graphs"] == graphs and r["kernels"] and r["size"] == 2
    assert not r["alive"]  # rank 1 ended with the engine
    assert r["got"] == r["want"] and all(len(o) == N for o in r["got"])
    assert r["depth"] == 2  # steps ran ahead
    if mode == "dflash" and not adaptive:
        assert r["two_stats"] == r["one_stats"]


def _tail(log, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"


def _case(target: str, draft: str | None, mode: str, adaptive: bool, graphs: bool, log: str, out: str,
          device: str) -> None:
    """One case, in a process of its own: the one-GPU engine's tokens, then the two-GPU engine's, written to `out`."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = sys.stderr = open(fd, "w", buffering=1)
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.reference.decode import generate
    from dflash_bench.engine.fast.parallel import ranks
    from dflash_bench.engine.build import build
    from dflash_bench.engine.sampling_params import SamplingParams

    ranks.STALL_S = STALL_S
    kw = dict(mode=mode, max_slots=SLOTS, max_model_len=MAX_LEN, dtype="float32", device=device, prefill="first",
              verify_width="auto" if adaptive else "full")
    one = build(EngineConfig.from_options(target, draft, **kw, fast=True))
    ps = _prompts(one.tok, 6)
    sp = SamplingParams(max_tokens=N, ignore_eos=True)
    want = [s.out for s in generate(one, ps, sp)]
    print("one GPU decoded", flush=True)
    two = build(EngineConfig.from_options(target, draft, tensor_parallel_size=2, enforce_eager=not graphs,
                                                      **kw, fast=True))
    print("two GPUs built", flush=True)
    probe = two.core.probe
    captured = len(probe.graphs)  # before close drops them
    try:
        depth: list[int] = []  # steps in flight after each step launched
        two.core.watch(lambda launch: depth.append(launch.inflight) if launch.plan else None)
        got = [s.out for s in generate(two, ps, sp)]
        print("two GPUs decoded", flush=True)
    finally:
        two.close()
    print("two GPUs closed", flush=True)

    def stats(e) -> list:
        return [e.stats.drafts, e.stats.accepted, e.stats.accepted_per_pos]
    with open(out, "w") as f:
        json.dump(dict(want=want, got=got, depth=max(depth), graphs=probe.graphed and captured > 0,
                       kernels=probe.target.kernels is not None,
                       size=probe.target.shard.size, alive=any(p.is_alive() for p in two.followers.procs),
                       one_stats=stats(one), two_stats=stats(two)), f)
