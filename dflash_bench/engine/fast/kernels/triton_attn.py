"""Split-K (flash-decoding) attention over the fast path's static slot KV cache, in Triton.

What: `decode_attention` computes the same thing as `decoder.attention` with a `decoder.step_mask` mask (a
step of `n` query tokens per row, GQA, causal or the non-causal DFlash block, optional sliding window),
reading the cache tensors `[S, max_len, Hkv, hd]` in place.

Why: at batch 1, SDPA over the masked cache views runs a grid of only bs * Hkv blocks, builds a mask
tensor and copies the permuted heads, and it reads every key up to the bucket length L. Here:
- one program serves up to ROWS = 16 query rows that share a KV head (all rep * n of them for a decode
  token, one of rep * n / 16 row blocks for a DFlash block), so each KV byte is read once per row block
  and step, and a 16-token block still spreads its rows over several programs per KV head;
- each row's valid key range is split over `n_splits` programs (chosen from the static L, so the grid is
  fixed under a CUDA graph) to fill the GPU, and a program reads only keys that some query can see
  (never past `starts[b] + n`, nor before the window), not all of [0, L);
- in the same launch, the split program of a (row, KV head, row block) that finishes last (counted on a
  persistent int32 counter, which it then resets to 0) merges its rows' per-split partial softmaxes
  (log-sum-exp) into `[bs * n, H * hd]`: no second kernel, and no memset per call.
Everything stays on the device (no host syncs), so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

BLOCK_N = 128  # keys per tile; 64 for grids past one wave, or without the shared memory (decode_attention)
ROWS = 16  # query rows per program at most: the smallest tl.dot size, and a merge of few rows x splits
WARPS = 4
STAGES = 3
# The split partials' dtype by q's (float32 otherwise). bfloat16 halves what the merging program reads (on
# an H100, 16 queries over 400 keys: 6.8 us against 7.8 a layer) and rounds the partial sums as the output
# is rounded anyway; float16 keeps float32, as an unnormalised sum could pass its range.
PARTIALS = {torch.bfloat16: torch.bfloat16}
LOG2E = 1.4426950408889634
# Triton 3.7's interpreter multiplies bfloat16 tiles as their raw integer bit patterns in tl.dot, so there
# (and only there: the CPU tests) bf16 dot operands are widened to float32 first.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# Arrival counters of the split programs, one per (row, KV head, row block), per device. Allocated zeroed
# once and never replaced: a captured CUDA graph keeps the address it saw, and every call leaves them at 0.
_MAX_COUNTERS = 1 << 16
_COUNTERS: dict[torch.device, torch.Tensor] = {}


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    if WIDEN:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        c = tl.dot(a, b, input_precision=PRECISION)
    return c


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, starts_ptr, out_ptr, part_ptr, m_ptr, l_ptr, cnt_ptr,
                  row0, scale_log2,
                  sq_b, sq_n, sq_h, sk_s, sk_t, sk_h, sv_s, sv_t, sv_h,
                  N: tl.constexpr, H: tl.constexpr, HKV: tl.constexpr, REP: tl.constexpr, HD: tl.constexpr,
                  M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                  DIRECT: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr, n_splits: tl.constexpr,
                  RING: tl.constexpr = 0):
    """Program (b * HKV + kv_head, row block, split): the online softmax of the row block's M query rows over
    one split; the last split of a (b, kv_head, row block) to finish also merges all splits of those rows."""
    b = tl.program_id(0) // HKV
    kvh = tl.program_id(0) % HKV
    split = tl.program_id(2)
    start = tl.load(starts_ptr + b).to(tl.int32)

    # Global row r (of the REP * N sharing the KV head) is query token j = r % N of query head
    # kvh * REP + r // N (as model.attention stacks them); row block rb holds rows rb * M .. rb * M + M - 1
    # (M == ROWS whenever there are several blocks). Rows >= REP * N only pad M up to a tl.dot size and are
    # never stored.
    r = tl.program_id(1) * M + tl.arange(0, M)
    j = r % N
    head = kvh * REP + r // N
    row_ok = r < REP * N
    qpos = start + j
    d = tl.arange(0, HD)
    q_off = b * sq_b + j[:, None] * sq_n + head[:, None] * sq_h + d[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None], other=0.0)

    # Keys any row of this program may see: [klo, khi). The split takes its share of that range, in
    # whole tiles, so a short context leaves trailing splits empty rather than reading masked keys.
    khi = start + N
    if WINDOW > 0:
        klo = tl.maximum(start - WINDOW + 1, 0)  # the earliest query (j = 0) sees back to qpos - WINDOW + 1
    else:
        klo = start * 0  # a zero of start's type, so both branches agree
    chunk = tl.cdiv(tl.cdiv(khi - klo, n_splits), BLOCK_N) * BLOCK_N
    lo = klo + split * chunk
    hi = tl.minimum(lo + chunk, khi)

    m_i = tl.full([M], float("-inf"), tl.float32)  # running max of the (log2-scaled) scores
    l_i = tl.zeros([M], tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([M, HD], tl.float32)  # running sum of exp2(score - m_i) * v
    slot = (row0 + b).to(tl.int64)
    k_base = k_ptr + slot * sk_s + kvh * sk_h
    v_base = v_ptr + slot * sv_s + kvh * sv_h
    for k0 in range(lo, hi, BLOCK_N):
        kpos = k0 + tl.arange(0, BLOCK_N)
        in_split = kpos < hi
        krow = kpos % RING if RING > 0 else kpos  # a sliding layer's ring holds key k at row k % RING
        k = tl.load(k_base + krow[:, None] * sk_t + d[None, :], mask=in_split[:, None], other=0.0)
        v = tl.load(v_base + krow[:, None] * sv_t + d[None, :], mask=in_split[:, None], other=0.0)  # with k
        s = _dot(q, tl.trans(k), PRECISION, WIDEN) * scale_log2  # [M, BLOCK_N]
        if CAUSAL:
            valid = kpos[None, :] <= qpos[:, None]
        else:
            valid = kpos[None, :] < khi  # the whole block, for every row (broadcast by tl.where)
        if WINDOW > 0:
            dist = qpos[:, None] - kpos[None, :]
            valid = valid & (dist < WINDOW) & (dist > -WINDOW)
        valid = valid & in_split[None, :]
        s = tl.where(valid, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet: no -inf - -inf
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION, WIDEN)
        m_i = m_new

    # out / partials are laid out like q made contiguous: [bs, N, H, HD] -> row (b * N + j) * H + head
    o_row = (b * N + j) * H + head
    o_off = o_row[:, None] * HD + d[None, :]
    if DIRECT:  # one split saw every key: normalise and write the output
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        tl.store(out_ptr + o_off, (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:  # an empty split stores the neutral partial (m = -inf, l = 0, acc = 0)
        rows = tl.num_programs(0) // HKV * N * H
        tl.store(part_ptr + split * rows * HD + o_off, acc.to(part_ptr.dtype.element_ty), mask=row_ok[:, None])
        tl.store(m_ptr + split * rows + o_row, m_i, mask=row_ok)
        tl.store(l_ptr + split * rows + o_row, l_i, mask=row_ok)
        # Every thread's stores are issued before the (single-thread) release below publishes them, and the
        # program that sees all other splits arrived acquires them; it then reads them from L2, not L1.
        tl.debug_barrier()
        cnt = cnt_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        if tl.atomic_add(cnt, 1, sem="acq_rel") == n_splits - 1:
            out = _merge_splits(part_ptr, m_ptr, l_ptr, rows, o_row, o_off, row_ok, n_splits, M, HD)
            tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
            tl.atomic_xchg(cnt, 0)  # all splits have arrived: the next call (or graph replay) counts from 0


@triton.jit
def _merge_splits(part_ptr, m_ptr, l_ptr, rows, o_row, o_off, row_ok, n_splits: tl.constexpr, M: tl.constexpr,
                  HD: tl.constexpr):
    """The log-sum-exp merge of the n_splits partial softmaxes of the program's rows -> [M, HD]."""
    # Padding rows read a neutral m = 0, l = 1 so their (never stored) result stays finite.
    m_max = tl.full([M], float("-inf"), tl.float32)
    for sp in tl.static_range(n_splits):  # unrolled: every split's loads are issued together
        m = tl.load(m_ptr + sp * rows + o_row, mask=row_ok, other=0.0, cache_modifier=".cg")
        m_max = tl.maximum(m_max, m)
    # Every query sees at least its own position, so some split has a finite max; empty splits weigh 0.
    num = tl.zeros([M, HD], tl.float32)
    den = tl.zeros([M], tl.float32)
    for sp in tl.static_range(n_splits):
        w = tl.exp2(tl.load(m_ptr + sp * rows + o_row, mask=row_ok, other=0.0, cache_modifier=".cg") - m_max)
        den += tl.load(l_ptr + sp * rows + o_row, mask=row_ok, other=1.0, cache_modifier=".cg") * w
        part = tl.load(part_ptr + sp * rows * HD + o_off, mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
        num += part.to(tl.float32) * w[:, None]
    return num / den[:, None]


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # the interpreter: pretend an H100 so the tests exercise the GPU's split choice


def _counters(device: torch.device, programs: int) -> torch.Tensor:
    """The device's zeroed arrival counters, one per (row, KV head, row block) of the split grid. Created on
    first use (the runner's warm-up call, outside any graph capture) and never re-allocated."""
    if programs > _MAX_COUNTERS:
        raise ValueError(f"decode_attention needs bs * Hkv * row blocks <= {_MAX_COUNTERS} split counters, "
                         f"got {programs}")
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(_MAX_COUNTERS, dtype=torch.int32, device=device)
    return _COUNTERS[device]


MAX_SPLITS = 8  # the last split program's merge is unrolled over the splits, and holds them all in flight


def num_splits(L: int, programs: int, sms: int = 132) -> int:
    """Splits per (row, KV head, row block) for `programs` = bs * Hkv * row blocks: none up to 256 keys,
    then about one program per SM in all, at least 128 keys of the bucket length L a split, at most MAX_SPLITS.

    On an H100 (benchmarks/speed/kernel_tuning.py, Qwen3-8B heads, 200-4000 keys) this is the fastest split count
    or within 1 µs of it for batch 1 and 8 at 1 and 16 query tokens, except 4000 keys with 16 tokens at
    batch 1 (22.3 µs against 19.7 at 8 splits). At 200 keys two 128-key tiles in one program beat two
    programs and a merge: 5.4 µs a layer against 6.8 for 16 tokens, 5.2 against 5.7 for one. Aiming at two
    waves, as before, split a batch of 16-token blocks in two, which doubled its time.
    """
    if L <= 256:
        return 1
    return max(1, min(MAX_SPLITS, L // 128, sms // programs))


HEAD_DIMS = "Triton kernels take power-of-two head dims of 16 or more"  # `fits`, said by the load's refusal


def fits(hd: int, dtype: torch.dtype | None = None) -> bool:
    """Whether these kernels (this attention, triton_ops' q/k RoPE over hd / 2) take head dim `hd`: tl.arange
    spans a power of two, and tl.dot needs 16."""
    return hd >= 16 and hd & (hd - 1) == 0


def decode_attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, starts: torch.Tensor, row0: int,
                     L: int, scale: float, *, causal: bool, window: int | None = None, ring: int = 0) -> torch.Tensor:
    """q `[bs, n, H, hd]` over cache slots `row0..row0+bs-1` of kc/vc `[S, max_len, Hkv, hd]` -> `[bs * n, H * hd]`.
    `ring` > 0: the cache holds key k at row k % ring (a sliding layer that keeps only its window; the caller
    guarantees that every key a query sees lies within `ring` positions of the newest).

    Query j of row b (at `starts[b] + j`) sees key k in [0, L) iff k <= its position (causal) or
    k < starts[b] + n (non-causal), and, with a window, |position - k| < window. The caller guarantees
    starts[b] + n <= L. L is only used to choose the number of splits (keep it static under a graph).
    """
    bs, n, H, hd = q.shape
    hkv = kc.shape[2]
    if q.dtype not in (torch.float32, torch.bfloat16, torch.float16) or kc.dtype != q.dtype or vc.dtype != q.dtype:
        raise ValueError(f"decode_attention supports float32/bfloat16/float16 q, kc, vc of one dtype, got "
                         f"{q.dtype}/{kc.dtype}/{vc.dtype}")
    if not fits(hd) or H % hkv or kc.shape != vc.shape or kc.shape[3] != hd:
        raise ValueError(f"need a power-of-two head dim >= 16 and H % Hkv == 0: q {tuple(q.shape)}, "
                         f"kc {tuple(kc.shape)}, vc {tuple(vc.shape)}")
    if q.stride(3) != 1 or kc.stride(3) != 1 or vc.stride(3) != 1:
        raise ValueError("q, kc, vc need a contiguous last (head-dim) axis")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    rep = H // hkv
    M = max(16, triton.next_power_of_2(min(rep * n, ROWS)))  # query rows per program, padded for tl.dot
    row_blocks = triton.cdiv(rep * n, ROWS)
    programs = bs * hkv * row_blocks
    splits = num_splits(L, programs, sm_count(q.device))
    out = torch.empty(bs * n, H * hd, dtype=q.dtype, device=q.device)
    if splits == 1:
        part = m = l = cnt = out  # unused (DIRECT)
    else:
        part = torch.empty(splits, bs * n * H, hd, dtype=PARTIALS.get(q.dtype, torch.float32), device=q.device)
        m = torch.empty(splits, bs * n * H, dtype=torch.float32, device=q.device)
        l = torch.empty(splits, bs * n * H, dtype=torch.float32, device=q.device)
        cnt = _counters(q.device, programs)
    def launch(block_n, stages):
        _split_kernel[(bs * hkv, row_blocks, splits)](
            q, kc, vc, starts, out, part, m, l, cnt, row0, scale * LOG2E,
            q.stride(0), q.stride(1), q.stride(2), kc.stride(0), kc.stride(1), kc.stride(2),
            vc.stride(0), vc.stride(1), vc.stride(2),
            N=n, H=H, HKV=hkv, REP=rep, HD=hd, M=M, BLOCK_N=block_n, CAUSAL=causal, WINDOW=window or 0,
            DIRECT=splits == 1, n_splits=splits, RING=ring, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
            WIDEN=_INTERPRET and q.dtype == torch.bfloat16, num_warps=WARPS, num_stages=stages)
    # 128-key tiles for a grid of at most one wave; more programs than SMs take 64-key tiles, whose smaller
    # shared memory lets two programs share an SM (H100: AR at batch 32 took 7.70 ms a step with 128-key
    # tiles against 7.14 with 64)
    # tiles; wider heads (Gemma 4's 256 and 512) take proportionally fewer keys a tile, and past 128 two stages
    small = (q.device, hd) in _SMALL_TILES or programs * splits > sm_count(q.device)
    block_n = max(16, min(64 if small else BLOCK_N, BLOCK_N * 128 // hd))
    stages = STAGES if hd <= 128 else 2
    while True:
        try:
            launch(block_n, stages)
            return out
        except triton.runtime.errors.OutOfResources:  # at the first launch, before any graph capture
            if block_n <= 16:
                raise
            _SMALL_TILES.add((q.device, hd))
            block_n //= 2


_SMALL_TILES: set[tuple] = set()  # (GPU, head dim) whose shared memory does not hold the first choice of tiles
