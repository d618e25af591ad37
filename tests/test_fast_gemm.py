"""The skinny decode matmul (engine/fast/kernels/triton_gemm) equals F.linear, in Triton's interpreter on the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

pytestmark = pytest.mark.engine


def _gemm():
    from dflash_bench.engine.fast.kernels import triton_gemm

    return triton_gemm


def _inputs(m, n, k, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=g).to(dtype), torch.randn(n, k, generator=g).to(dtype),
            torch.randn(n, generator=g).to(dtype))


@pytest.mark.parametrize("mode", ["fma", "dot", "swap"])
@pytest.mark.parametrize("split", [1, 2, 4])
@pytest.mark.parametrize("m", [1, 5, 16, 17, 32])
def test_every_plan_matches_linear(mode, split, m):
    tg = _gemm()
    plan = tg.GemmPlan(bn=64 if mode == "swap" else 16, bk=32, split=split, mode=mode)
    if not plan.fits(m, 128, 256):
        assert mode == "fma" and m > 1  # the CUDA-core plan is for one row only
        return
    x, w, b = _inputs(m, 128, 256)
    assert torch.allclose(tg.skinny_linear(x, w, b, plan), F.linear(x, w, b), atol=1e-4, rtol=1e-4)
    assert torch.allclose(tg.skinny_linear(x, w, None, plan), F.linear(x, w), atol=1e-4, rtol=1e-4)


def test_split_counters_are_reset_for_the_next_call():
    """The last program of each column block sums the partials and zeroes its counter; a counter left
    behind would make the next call (or CUDA-graph replay) sum the wrong partials or none."""
    tg = _gemm()
    plan = tg.GemmPlan(bn=16, bk=32, split=4, mode="swap")
    for seed in range(3):
        x, w, b = _inputs(3, 96, 256, seed=seed)
        assert torch.allclose(tg.skinny_linear(x, w, b, plan), F.linear(x, w, b), atol=1e-4, rtol=1e-4)
        _, counters = tg._workspace(x.device)
        assert int(counters.abs().sum()) == 0


def test_bfloat16_within_rounding():
    tg = _gemm()
    x, w, _ = _inputs(16, 128, 512, dtype=torch.bfloat16)
    got = tg.linear(x, w).float()
    want = F.linear(x.float(), w.float())
    assert (got - want).abs().max() <= 0.02 * want.abs().max()


def test_plan_for_takes_decode_shapes_and_leaves_the_rest_to_cublas():
    tg = _gemm()
    # Qwen3-8B's decode shapes on 132 SMs: the grid closest to one program per SM without passing it
    # o_proj: a short reduction takes 128 blocks of 32 columns, with a 4th stage, over 64 blocks split in two
    assert tg.plan_for(1, 4096, 4096) == tg.GemmPlan(bn=32, stages=4) == tg.plan_for(16, 4096, 4096)
    assert tg.plan_for(16, 4096, 12288) == tg.GemmPlan(bn=64, split=2)  # down: a long reduction is split
    assert tg.plan_for(16, 6144, 4096) == tg.GemmPlan(bn=64, split=1)  # q/k/v: 96 blocks; 192 would be 2 waves
    assert tg.plan_for(16, 10240, 4096) == tg.GemmPlan(bn=128)  # drafter k/v: 80 programs, not 160
    # gate/up: 384 blocks, three a SM at once with 128-deep tiles; lm_head's 2374 blocks take 256
    assert tg.plan_for(1, 24576, 4096) == tg.GemmPlan(bn=64, bk=128) == tg.plan_for(16, 24576, 4096)
    assert tg.plan_for(16, 151936, 4096) == tg.GemmPlan(bn=64, split=1)
    assert tg.plan_for(16, 24576, 4096, sms=100) == tg.GemmPlan(bn=64)  # past three a SM: 256 deep
    assert tg.plan_for(1, 4096, 4096, sms=64) == tg.GemmPlan(bn=64, split=1)  # a smaller GPU: 64 blocks fill it
    # 17-32 rows (a batch of 32, two DFlash blocks) take tiles of 32, whose split-K partials are twice as big
    assert tg.plan_for(32, 4096, 12288) == tg.GemmPlan(bn=64, split=2) and tg.tile_rows(32) == 32 == tg.tile_rows(17)
    assert tg.plan_for(32, 24576, 4096) == tg.GemmPlan(bn=64, bk=128)
    # a huge GPU: 4 x 16 x 65536 partials fit the workspace, 4 x 32 x 65536 do not (the same grid, split in two)
    assert tg.plan_for(16, 65536, 8192, sms=4096) == tg.GemmPlan(bn=64, split=4)
    assert tg.plan_for(32, 65536, 8192, sms=4096) == tg.GemmPlan(bn=32, split=2, stages=4)
    assert tg.plan_for(33, 4096, 4096) is None  # prefill and big batches: cuBLAS
    assert tg.plan_for(1, 4100, 4096) is None  # no column block divides n
    assert tg.plan_for(1, 4096, 4104) is None  # no depth divides k
    x, w, _ = _inputs(40, 48, 64)
    assert torch.equal(tg.linear(x, w), F.linear(x, w))  # 40 rows: cuBLAS itself
    x, w, _ = _inputs(2, 48, 64)
    assert torch.allclose(tg.linear(x.t().contiguous().t(), w), F.linear(x, w), atol=1e-5)  # strided x: cuBLAS


def test_a_plan_the_gpu_cannot_launch_falls_back_to_cublas(monkeypatch):
    tg = _gemm()
    calls = []

    def refuse(x, w, bias, plan, lane=0):
        calls.append(plan)
        raise tg.triton.runtime.errors.OutOfResources(300000, 232448, "shared memory")

    monkeypatch.setattr(tg, "skinny_linear", refuse)
    monkeypatch.setattr(tg, "_refused", set())
    x, w, b = _inputs(4, 64, 128)
    for _ in range(2):
        assert torch.equal(tg.linear(x, w, b), F.linear(x, w, b))
    assert len(calls) == 1  # refused once, then straight to cuBLAS


def test_a_plan_refused_for_32_rows_still_runs_16(monkeypatch):
    """A 32-row tile of a plan needs more shared memory than its 16-row tile: refused past 16 rows (an H100,
    the drafter's k/v projection), the same plan keeps the skinny kernel up to 16."""
    tg = _gemm()
    real, calls = tg.skinny_linear, []

    def small_only(x, w, bias, plan, lane=0):
        calls.append(x.shape[0])
        if x.shape[0] > 16:
            raise tg.triton.runtime.errors.OutOfResources(245760, 232448, "shared memory")
        return real(x, w, bias, plan, lane=lane)

    monkeypatch.setattr(tg, "skinny_linear", small_only)
    monkeypatch.setattr(tg, "_refused", set())
    _, w, b = _inputs(1, 64, 128)
    for m in (32, 16, 32, 16):
        x, _, _ = _inputs(m, 64, 128, seed=m)
        assert torch.allclose(tg.linear(x, w, b), F.linear(x, w, b), atol=1e-4, rtol=1e-4)
    assert calls == [32, 16, 16]  # 32 rows refused once, then cuBLAS; 16 rows on the skinny kernel each time


@pytest.mark.parametrize("m", [1, 5, 16, 32])
def test_linear_argmax_is_the_argmax_of_the_logits(m):
    """The lm_head's greedy tokens without its logits: each column block's best, then the first of the best."""
    tg = _gemm()
    x, w, _ = _inputs(m, 512, 256, seed=m)
    assert tg.plan_for(m, 512, 256).split == 1  # the fused path, not the fallback
    # row 0: a tie across column blocks (the first wins), between columns at the same place in their blocks of
    # 16 (bit-identical sums: Triton 3.9's interpreter rounds a dot's columns differently by place) ...
    w[296] = w[40] = 10 * x[0]
    w[41] = w[40]  # ... and inside one
    got = tg.linear_argmax(x, w)
    assert got.dtype == torch.int64 and torch.equal(got, F.linear(x, w).argmax(-1))
    assert got[0] == 40


def test_linear_argmax_writes_into_a_view_and_falls_back_where_it_cannot_fuse(monkeypatch):
    tg = _gemm()
    x, w, _ = _inputs(15, 512, 256, seed=3)
    tokens = torch.full((1, 16), -5, dtype=torch.int64)  # the runner's row: anchor, then 15 drafts
    tg.linear_argmax(x, w, tokens[:, 1:])
    assert torch.equal(tokens[0, 1:], F.linear(x, w).argmax(-1)) and tokens[0, 0] == -5
    monkeypatch.setattr(tg, "plan_for", lambda *a, **k: tg.GemmPlan(bn=64, bk=128, split=2))  # split-K: no fusing
    assert torch.equal(tg.linear_argmax(x, w), F.linear(x, w).argmax(-1))
    # bf16: the argmax of the logits as the matmul stores them, rounded (the interpreter rounds bf16 its own
    # way, so the reference is the skinny kernel's stored logits, not torch's)
    bf = x.to(torch.bfloat16), w.to(torch.bfloat16)
    monkeypatch.undo()
    assert torch.equal(tg.linear_argmax(*bf), tg.linear(*bf).argmax(-1))
