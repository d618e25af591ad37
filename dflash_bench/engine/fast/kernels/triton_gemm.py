"""Skinny matmuls for decode steps (Triton): `y = x @ w.T` for `x` `[m, k]` with m <= 32, `w` `[n, k]`.

A decode step's matmuls read every weight once for 1 (AR) to 32 (a batch of 32, two DFlash blocks) rows: they
are bound by memory bandwidth, and the rows cost nothing as long as the weights stream at full speed. A program
owns `BN` output columns and `k / SPLIT` of the reduction and streams its slice of `w` once. It multiplies on CUDA
cores ("fma", one row), on tensor cores with the rows padded to 16, or to 32 past 16 (`tile_rows`; "dot"), or
with the operands swapped so the weight tile is the tensor cores' large side ("swap", what `plan_for` picks). With
`SPLIT` > 1 the partial sums go to a float32 workspace and the last program of a column block (an atomic counter
it resets) adds them up, so one launch does the whole matmul and it is safe to capture in a CUDA graph.

`benchmarks/speed/gemm_tuning.py` times every `GemmPlan` against cuBLAS on the GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from dflash_bench.engine.fast.kernels.triton_attn import sm_count

MAX_ROWS = 32  # more rows (prefill, big batches of blocks): cuBLAS
MODES = {"fma": 0, "dot": 1, "swap": 2}
# Triton's interpreter multiplies bfloat16 tiles as raw bits in tl.dot: there (the CPU tests) widen first
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class GemmPlan:
    bn: int = 64
    bk: int = 256
    split: int = 1
    mode: str = "swap"  # "fma": CUDA cores, m == 1 only; "dot": x @ w.T on tensor cores; "swap": (w @ x.T).T
    warps: int = 4
    stages: int = 3

    def fits(self, m: int, n: int, k: int) -> bool:
        return (m <= MAX_ROWS and (self.mode != "fma" or m == 1) and n % self.bn == 0
                and k % (self.split * self.bk) == 0)


def tile_rows(m: int) -> int:
    """Rows of a tensor-core tile for m rows: 16, or 32 past 16 (the dot's smallest shapes that hold them)."""
    return 16 if m <= 16 else 32


@triton.jit
def _skinny_kernel(x_ptr, w_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, sxm, sym,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr,
                   MODE: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr,
                   ARGMAX: tl.constexpr = False):
    pn = tl.program_id(0)
    ps = tl.program_id(1)
    rm = tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    span = K // SPLIT
    lo = ps * span
    x_ptrs = x_ptr + rm[:, None] * sxm + (lo + rk)[None, :]
    w_ptrs = w_ptr + rn[:, None] * K + (lo + rk)[None, :]
    if MODE == 2:
        acc_t = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, span // BK):
        x = tl.load(x_ptrs, mask=rm[:, None] < M, other=0.0)
        w = tl.load(w_ptrs)
        if WIDEN:
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        if MODE == 0:
            acc += tl.sum(x.to(tl.float32) * w.to(tl.float32), axis=1)[None, :]
        elif MODE == 1:
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
        else:
            acc_t = tl.dot(w, tl.trans(x), acc_t, input_precision=PRECISION)
        x_ptrs += BK
        w_ptrs += BK
    if MODE == 2:
        acc = tl.trans(acc_t)
    out = y_ptr + rm[:, None] * sym + rn[None, :]
    keep = rm[:, None] < M
    if ARGMAX:  # no output: each row's max over this column block (rounded as stored) and its first column
        a = acc.to(x_ptr.dtype.element_ty).to(tl.float32)
        best = tl.max(a, 1)
        first = tl.min(tl.where(a == best[:, None], rn[None, :], N), 1)
        chunks = N // BN
        tl.store(y_ptr + rm * chunks + pn, best, mask=rm < M)  # y: float32 [M, chunks]
        tl.store(ws_ptr + rm * chunks + pn, first, mask=rm < M)  # ws: int32 [M, chunks]
    elif SPLIT == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn).to(tl.float32)[None, :]
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=keep)
    else:
        part = ws_ptr + (ps * BM + rm[:, None]) * N + rn[None, :]
        tl.store(part, acc, mask=keep)
        tl.debug_barrier()  # every thread's partial is stored before the release below
        arrived = tl.atomic_add(cnt_ptr + pn, 1, sem="acq_rel")
        if arrived == SPLIT - 1:
            tot = tl.zeros((BM, BN), dtype=tl.float32)
            for s in range(SPLIT):
                tot += tl.load(ws_ptr + (s * BM + rm[:, None]) * N + rn[None, :], mask=keep, other=0.0,
                               cache_modifier=".cg")
            if HAS_BIAS:
                tot += tl.load(b_ptr + rn).to(tl.float32)[None, :]
            tl.store(out, tot.to(y_ptr.dtype.element_ty), mask=keep)
            tl.atomic_xchg(cnt_ptr + pn, 0)


WORKSPACE_FLOATS = 1 << 22  # split-K partials: plans keep split * tile_rows(m) * n within this
COUNTERS = 1 << 16
_scratch: dict[tuple[torch.device, int], tuple[torch.Tensor, torch.Tensor]] = {}


def _workspace(device: torch.device, lane: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-K partials and zeroed column-block counters, allocated once per device and lane: a CUDA graph
    keeps the addresses it was captured with, so they must never move. Matmuls that may run at the same time
    (on two streams) must use different lanes, or they would mix their partials."""
    if (device, lane) not in _scratch:
        _scratch[device, lane] = (torch.empty(WORKSPACE_FLOATS, dtype=torch.float32, device=device),
                                  torch.zeros(COUNTERS, dtype=torch.int32, device=device))
    return _scratch[device, lane]


def plan_for(m: int, n: int, k: int, sms: int = 132) -> GemmPlan | None:
    """The launch setting for an `[m, k] x [n, k]^T` matmul, or None where cuBLAS should do it.

    Swapped tensor-core tiles 256 deep. A wide matmul (two waves of 64-column blocks or more) takes 64
    columns a program; a narrower one takes the block width and k-split whose grid comes closest to one
    program per SM without passing it (a second, partial wave leaves SMs idle at the tail); for k <= 4096 a
    split-free grid goes first, and 32-column tiles take a 4th stage (o_proj, 4096 x 4096: 128 blocks of 32
    columns rather than 64 blocks split in two, whose merge costs a short stream more; H100, a whole step:
    AR 14 us faster, DFlash 40 us, the drafter's 5 layers included). A wide grid of at most three programs
    per SM (gate/up: 384 blocks on 132 SMs) takes tiles 128 deep: at half the shared memory three programs
    fit on an SM, so the whole grid is resident at once, with no tail wave (H100: a DFlash step, 36 + 5
    layers at 16 rows, 24-29 us faster than with 256-deep tiles; AR 2-3 us). Both: benchmarks/speed/plan_ab.py.
    On an H100 (benchmarks/speed/gemm_tuning.py) that beats cuBLAS on all 14 decode shapes of the Qwen3-8B pair (7
    at 1 and 16 rows) by 1-9%, and is at most 2.6% slower than the best of the ~100 settings swept per shape.
    A GPU with less shared memory than a 128-column plan needs runs that matmul on cuBLAS (`linear`).
    """
    bk = next((b for b in (256, 128, 64, 32, 16) if k % b == 0), None)
    widths = [b for b in (64, 128, 32, 16) if n % b == 0]  # in order of preference
    if m > MAX_ROWS or bk is None or not widths:
        return None
    if n // widths[0] >= 2 * sms:
        shallow = n // widths[0] <= 3 * sms and bk == 256
        return GemmPlan(bn=widths[0], bk=128 if shallow else bk)
    fits = [(n // bn * split, bn, split) for bn in widths for split in (1, 2, 4)
            if k % (split * bk) == 0 and split * tile_rows(m) * n <= WORKSPACE_FLOATS and n // bn * split <= sms]
    if not fits:
        return GemmPlan(bn=widths[0], bk=bk)
    short = k <= 4096  # a short reduction is not split where a split-free grid fills the GPU as well
    _, bn, split = max(fits, key=lambda f: (f[0], short and f[2] == 1, -widths.index(f[1]), -f[2]))
    return GemmPlan(bn=bn, bk=bk, split=split, stages=4 if bn == 32 else 3)


# (plan, tile rows) this GPU cannot launch (too little shared memory: a 32-row tile needs more than a 16-row
# one of the same plan): cuBLAS instead
_refused: set[tuple[GemmPlan, int]] = set()


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, lane: int = 0) -> torch.Tensor:
    """`F.linear(x, w, bias)`: the skinny kernel for a 2-D x of at most MAX_ROWS rows, cuBLAS otherwise. `lane`:
    which split-K workspace (see `_workspace`)."""
    plan = None
    if x.dim() == 2 and x.stride(1) == 1 and w.is_contiguous() and x.dtype == w.dtype:
        plan = plan_for(x.shape[0], w.shape[0], x.shape[1], sm_count(x.device))
    if plan is None or (plan, tile_rows(x.shape[0])) in _refused:
        return F.linear(x, w, bias)
    try:
        return skinny_linear(x, w, bias, plan, lane=lane)
    except triton.runtime.errors.OutOfResources:  # raised at the first launch, before any graph capture
        _refused.add((plan, tile_rows(x.shape[0])))
        return F.linear(x, w, bias)


def skinny_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, plan: GemmPlan = GemmPlan(), *,
                  lane: int = 0) -> torch.Tensor:
    """`F.linear(x, w, bias)` for a contiguous `[m, k]` x with m <= MAX_ROWS that `plan` fits."""
    m, k = x.shape
    n = w.shape[0]
    assert plan.fits(m, n, k) and x.stride(1) == 1 and w.is_contiguous(), (m, n, k, plan)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    bm = 1 if plan.mode == "fma" else tile_rows(m)
    ws, cnt = _workspace(x.device, lane)
    if plan.split > 1 and (plan.split * bm * n > ws.numel() or n // plan.bn > cnt.numel()):
        raise ValueError(f"split-K workspace too small for {plan} on [{m}, {k}] x [{n}, {k}]")
    _skinny_kernel[(n // plan.bn, plan.split)](
        x, w, bias if bias is not None else y, y, ws, cnt, m, n, k, x.stride(0), y.stride(0),
        BM=bm, BN=plan.bn, BK=plan.bk, SPLIT=plan.split, MODE=MODES[plan.mode], HAS_BIAS=bias is not None,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", WIDEN=_INTERPRET and x.dtype != torch.float32,
        num_warps=plan.warps, num_stages=plan.stages)
    return y


def linear_argmax(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """`argmax(x @ w.T, -1)` (the first column of the row's max, over the values rounded to x's dtype, as
    torch's argmax over stored logits) for a greedy step: the lm_head's programs keep each row's best column
    of their block instead of writing the logits, and one program a row picks among the blocks. `out`: an
    int64 `[m]`, or any `[bs, n]` view with bs * n = m, written in place. Falls back to `linear` then
    `triton_ops.argmax` where the skinny kernel does not run the whole matmul in one program per column block.
    """
    from dflash_bench.engine.fast.kernels import triton_ops

    m, k = x.shape
    n = w.shape[0]
    plan = None
    if x.stride(1) == 1 and w.is_contiguous() and x.dtype == w.dtype:
        plan = plan_for(m, n, k, sm_count(x.device))
    if plan is None or plan.split > 1 or plan.mode == "fma" or (plan, tile_rows(m)) in _refused:
        return triton_ops.argmax(linear(x, w), out)
    chunks = n // plan.bn
    val, idx = triton_ops.chunk_maxima(m, chunks, x.device)
    try:
        _skinny_kernel[(chunks, 1)](
            x, w, val, val, idx, idx, m, n, k, x.stride(0), 0, BM=tile_rows(m), BN=plan.bn, BK=plan.bk, SPLIT=1,
            MODE=MODES[plan.mode], HAS_BIAS=False, PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
            WIDEN=_INTERPRET and x.dtype != torch.float32, ARGMAX=True, num_warps=plan.warps, num_stages=plan.stages)
    except triton.runtime.errors.OutOfResources:  # raised at the first launch, before any graph capture
        _refused.add((plan, tile_rows(m)))
        return triton_ops.argmax(linear(x, w), out)
    if out is None:
        out = torch.empty(m, dtype=torch.int64, device=x.device)
    return triton_ops.pick_chunk(val, idx, n, out)
