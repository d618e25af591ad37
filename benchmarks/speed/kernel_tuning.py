"""Launch settings of the fast path's small Triton kernels on this GPU: microseconds per call under a CUDA graph.

    python -m benchmarks.speed.kernel_tuning          # GPU only, ~30 s
    python -m benchmarks.speed.kernel_tuning --rope --attention-shapes   # only these sweeps, ~80 s
    python -m benchmarks.speed.kernel_tuning --no-attention   # norms and silu_mul only

Rows: add_rms_norm over hidden 4096 at 1 and 16 tokens, silu_mul over 2 x 12288, for several num_warps; the
decode attention (Qwen3-8B heads, batch 1 and 8) at 1 and 16 queries per row and 200-4000 keys for each forced
number of splits, cycling through 36 layers' caches as a step does.
"""

from __future__ import annotations

import sys
import time

import torch
import triton

from dflash_bench.engine.fast.kernels import triton_ops as ops


def per_call_us(fn, reps: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / (5 * reps) * 1e6


def attention_splits(dev, dt) -> None:
    from dflash_bench.engine.fast.kernels import triton_attn as ta

    H, hkv, hd, layers = 32, 8, 128, 36
    caches = [(torch.randn(8, 4096, hkv, hd, device=dev, dtype=dt), torch.randn(8, 4096, hkv, hd, device=dev, dtype=dt))
              for _ in range(layers)]
    chosen = ta.num_splits
    try:
        for bs, n in ((1, 1), (1, 16), (8, 1), (8, 16)):
            q = torch.randn(bs, n, H, hd, device=dev, dtype=dt)
            for L, valid in ((256, 200), (512, 400), (768, 700), (2048, 1900), (4096, 4000)):
                starts = torch.full((bs,), valid - n, device=dev)
                row = []
                for s in (0, 1, 2, 4, 8, 16, 32):  # 0: the kernel's own choice
                    ta.num_splits = chosen if s == 0 else (lambda *a, s=s, **k: s)
                    it = iter(range(10 ** 9))

                    def call():
                        kc, vc = caches[next(it) % layers]
                        ta.decode_attention(q, kc, vc, starts, 0, L, hd ** -0.5, causal=True)
                    us = per_call_us(call, reps=layers * 4)
                    row.append(f"{'auto' if s == 0 else s}: {us:5.2f}")
                print(f"attention bs={bs} n={n:<2} L={L:<4} keys {valid}: us per layer by splits  " + "  ".join(row),
                      flush=True)
    finally:
        ta.num_splits = chosen


def attention_shapes(dev, dt) -> None:
    """Batch 1, the DFlash step's attention (16 queries, causal verify and non-causal draft) and AR's (1 query):
    us per layer by query rows per program, keys per tile, warps and splits."""
    from dflash_bench.engine.fast.kernels import triton_attn as ta

    H, hkv, hd, layers = 32, 8, 128, 36
    caches = [(torch.randn(1, 1024, hkv, hd, device=dev, dtype=dt), torch.randn(1, 1024, hkv, hd, device=dev, dtype=dt))
              for _ in range(layers)]
    saved = ta.num_splits, ta.ROWS, ta.BLOCK_N, ta.WARPS
    try:
        for n, causal in ((16, True), (16, False), (1, True)):
            q = torch.randn(1, n, H, hd, device=dev, dtype=dt)
            for L, valid in ((256, 200), (512, 400), (768, 700)):
                starts = torch.full((1,), valid - n, device=dev)
                best = []
                for rows in ((16, 32, 64) if n > 1 else (16,)):
                    for bn in (32, 64, 128):
                        for w in (4, 8):
                            for s in (1, 2, 4, 8):
                                ta.num_splits = lambda *a, s=s, **k: s
                                ta.ROWS, ta.BLOCK_N, ta.WARPS = rows, bn, w
                                it = iter(range(10 ** 9))

                                def call():
                                    kc, vc = caches[next(it) % layers]
                                    ta.decode_attention(q, kc, vc, starts, 0, L, hd ** -0.5, causal=causal)
                                best.append((per_call_us(call, reps=layers * 2), f"rows {rows} bn {bn} w {w} s {s}"))
                ta.num_splits, ta.ROWS, ta.BLOCK_N, ta.WARPS = saved
                it = iter(range(10 ** 9))

                def auto():
                    kc, vc = caches[next(it) % layers]
                    ta.decode_attention(q, kc, vc, starts, 0, L, hd ** -0.5, causal=causal)
                now = per_call_us(auto, reps=layers * 2)
                best.sort()
                print(f"attention n={n:<2} causal={causal!s:<5} keys {valid}: now {now:5.2f} us; best "
                      + ", ".join(f"{us:5.2f} ({c})" for us, c in best[:5]), flush=True)
    finally:
        ta.num_splits, ta.ROWS, ta.BLOCK_N, ta.WARPS = saved


def rope_groups(dev, dt) -> None:
    """qk_rope_store at Qwen3-8B heads (32 q, 8 k, 8 v) for 1 and 16 tokens, and the drafter's context (k, v
    only), by heads per program."""
    H, hkv, hd = 32, 8, 128
    kc, vc = (torch.zeros(1, 1024, hkv, hd, device=dev, dtype=dt) for _ in range(2))
    cos, sin = (torch.randn(1024, hd // 2, device=dev) for _ in range(2))
    chosen = ops.ROPE_HEADS, ops.ROPE_WARPS
    try:
        for t, nq in ((1, H), (16, H), (16, 0)):
            qkv = torch.randn(t, (nq + 2 * hkv) * hd, device=dev, dtype=dt)
            w = torch.randn(nq + hkv, hd, device=dev, dtype=dt)
            rows = torch.zeros(t, dtype=torch.long, device=dev)
            pos = torch.arange(400, 400 + t, device=dev)
            for warps in (1, 2, 4):
                row = []
                for g in (1, 2, 4, 8, 16, 32, 64):
                    ops.ROPE_HEADS, ops.ROPE_WARPS = g, warps
                    us = per_call_us(lambda: ops.qk_rope_store(qkv, nq, hkv, hd, cos, sin, rows, pos, kc, vc, w, 1e-6))
                    row.append(f"{g}: {us:5.2f}")
                print(f"qk_rope_store t={t:<2} q heads {nq:<2} {warps} warps: us by heads per program  "
                      + "  ".join(row), flush=True)
    finally:
        ops.ROPE_HEADS, ops.ROPE_WARPS = chosen


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("kernel_tuning times CUDA graphs: it needs a GPU")
    dev, dt = "cuda", torch.bfloat16
    print(torch.cuda.get_device_name())
    if "--attention-shapes" in sys.argv or "--rope" in sys.argv:
        if "--rope" in sys.argv:
            rope_groups(dev, dt)
        if "--attention-shapes" in sys.argv:
            attention_shapes(dev, dt)
        return
    for t in (1, 16, 512):
        h, a = torch.randn(t, 4096, device=dev, dtype=dt), torch.randn(t, 4096, device=dev, dtype=dt)
        w = torch.randn(4096, device=dev, dtype=dt)
        s, out = torch.empty_like(h), torch.empty_like(h)
        for nw in (2, 4, 8, 16):
            us = per_call_us(lambda: ops._add_rms_norm_kernel[(t,)](h, a, w, s, out, 4096, 1e-6, BLOCK=4096, ADD=True, num_warps=nw))
            print(f"add_rms_norm t={t:<3} num_warps={nw:<2} {us:6.2f} us")
        gu = torch.randn(t, 2 * 12288, device=dev, dtype=dt)
        o = torch.empty(t, 12288, device=dev, dtype=dt)
        for block in (512, 1024, 2048, 4096):
            for nw in (4, 8):
                us = per_call_us(lambda: ops._act_mul_kernel[(t, triton.cdiv(12288, block))](gu, o, gu.stride(0), 12288, BLOCK=block, GELU=False, num_warps=nw))
                print(f"silu_mul     t={t:<3} BLOCK={block:<4} num_warps={nw} {us:6.2f} us")
    if "--no-attention" not in sys.argv:
        attention_splits(dev, dt)
    x = torch.randn(1, 4096, device=dev, dtype=dt)
    print(f"an empty-ish torch kernel (x.add_(0)) under a graph: {per_call_us(lambda: x.add_(0)):.2f} us")


if __name__ == "__main__":
    main()
