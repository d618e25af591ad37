"""Diagnostics for benchmarks/speed/engine_speed.py: bandwidth ceiling, matmul-only step, kernel profiles, and the
losslessness checks it runs on the GPU (tiny float32 pair vs the reference engine; where AR and DFlash part on
the big bf16 model, and by how much).
"""

from __future__ import annotations

import os
import tempfile
import time

import torch

from dflash_bench.engine.fast.models.draft import FastDrafter
from dflash_bench.engine.fast.models.dense import DenseTarget
from dflash_bench.engine.fast.models.decoder import matmul
from dflash_bench.engine.fast.drive import generate
from dflash_bench.engine.config import StepConfig
from dflash_bench.engine.fast.core import EngineCore
from dflash_bench.engine.fast.running.timer import StepTimer


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(dev) -> float:
    """Device-to-device copy, bytes read + written per second (the bandwidth ceiling we hold the step to)."""
    if dev.type != "cuda":
        return float("nan")
    x = torch.empty(1 << 30, dtype=torch.bfloat16, device=dev)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    sync(dev)
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    sync(dev)
    bw = 10 * 2 * x.numel() * 2 / (time.perf_counter() - t)
    del x, y
    return bw


def matmul_chain_ms(target: DenseTarget, dev) -> float:
    """Diagnostic: one batch-1 step's weight matmuls alone (graph replay), with the matmul the target runs
    (the skinny Triton kernel with kernels on, cuBLAS without)."""
    if dev.type != "cuda":
        return float("nan")
    ly0 = target.layers[0]
    x = torch.randn(1, target.hidden_size, dtype=target.dtype, device=dev)
    xa = torch.randn(1, ly0.wo.shape[1], dtype=target.dtype, device=dev)
    xi = torch.randn(1, ly0.w2.shape[1], dtype=target.dtype, device=dev)

    mm = matmul(target.kernels)

    def chain():
        for ly in target.layers:
            mm(x, ly.wqkv)
            mm(xa, ly.wo)
            mm(x, ly.w13)
            mm(xi, ly.w2)
        mm(x, target.head)

    chain()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        chain()
    g.replay()
    sync(dev)
    t = time.perf_counter()
    for _ in range(20):
        g.replay()
    sync(dev)
    return (time.perf_counter() - t) / 20 * 1e3


def profile_step(runner: EngineCore, dev, path: str | None = None, rows: int = 18) -> str:
    """Diagnostic: kernels of one eager batch-1 step (what the graphs replay), by device time; DFlash runners
    give one table for the draft and one for the verify."""
    from torch.profiler import ProfilerActivity, profile

    runner.add(0, list(range(1000, 1128)))
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    L, B, probe = runner.config.kv_block, runner.B, runner.probe
    bodies = {"AR step": probe.body("ar", 1, L)} if B == 1 else \
        {"draft": probe.body("draft", 1, L, B), "verify": probe.body("verify", 1, L, B)}
    key = "self_device_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    tables = []
    with torch.inference_mode():
        for name, body in bodies.items():
            body()
            sync(dev)
            with profile(activities=acts) as prof:
                body()
                sync(dev)
            tables.append(f"{name}:\n" + prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60))
            if path and runner.B == 1:
                prof.export_chrome_trace(path)
    runner.release(0)
    return "\n".join(tables)


def lossless_tiny(dev) -> dict:
    """Real tiny Qwen3 pair (float32) on this device: reference engine AR vs fast AR vs fast DFlash token ids
    (the whole block verified every step, and the width chosen by load)."""
    from dflash_bench.engine.build import build
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.reference.decode import generate as ref_generate
    from dflash_bench.engine.sampling_params import SamplingParams
    from dflash_bench.testing.tiny import make_tiny_pair

    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, pred in (("random", False), ("predictable", True)):
            t, d = make_tiny_pair(os.path.join(tmp, name), seed=1, block_size=8, predictable=pred)
            kw = dict(max_slots=8, max_model_len=512, dtype="float32", device=dev.type)
            ar = build(EngineConfig(str(t), mode="ar", **kw))
            df = build(EngineConfig(str(t), str(d), mode="dflash", **kw))
            ps = [ar.tok(f"prompt {i} " + "the cat sat " * (i + 1)).input_ids for i in range(8)]
            ref = [s.out for s in ref_generate(ar, ps, SamplingParams(max_tokens=64, ignore_eos=True))]
            ft = DenseTarget(df.target.model, max_slots=8, max_len=512)
            fd = FastDrafter(df.proposer.drafter, ft.embed, ft.head, max_slots=8, max_len=512)
            fast_ar = generate(EngineCore(ft, None, StepConfig(verify_width="full", kv_block=64)), ps, 64)
            r, auto = EngineCore(ft, fd, StepConfig(verify_width="full", kv_block=64)), EngineCore(ft, fd, StepConfig(kv_block=64, verify_width="auto"))
            timers = StepTimer().attach(r), StepTimer().attach(auto)
            fast_df, fast_auto = generate(r, ps, 64), generate(auto, ps, 64)
            res[name] = dict(ar_equal_reference=fast_ar == ref, dflash_equal_ar=fast_df == fast_ar, tau=round(timers[0].tau, 3),
                             adaptive_equal_ar=fast_auto == fast_ar, adaptive_tau=round(timers[1].tau, 3))
    return res


def kernels_agree(dev) -> dict:
    """Max error of the Triton attention and matmul against torch on this GPU at Qwen3-8B's shapes: several
    query row blocks and key splits running concurrently, each call replayed from a CUDA graph (the CPU tests
    run the kernels in Triton's interpreter, one program at a time, which cannot show a race)."""
    if dev.type != "cuda":
        return {}
    from dflash_bench.engine.fast.kernels import triton_attn, triton_gemm, triton_ops
    from dflash_bench.engine.fast.models.decoder import attention, step_mask

    g = torch.Generator(device=dev).manual_seed(0)
    worst = {"attention": 0.0, "matmul": 0.0}
    H, hkv, hd = 32, 8, 128
    kc, vc = (torch.randn(4, 1024, hkv, hd, device=dev, generator=g, dtype=torch.bfloat16) for _ in range(2))
    # a decode token over 3 splits; 16-token blocks in 4 row blocks, over 4 splits and unsplit
    for n, causal, L, starts in ((1, True, 384, [5, 100, 370]), (16, True, 768, [700]),
                                 (16, False, 512, [40, 200, 480]), (16, True, 256, [30, 230])):
        bs = len(starts)
        q = torch.randn(bs, n, H, hd, device=dev, generator=g, dtype=torch.bfloat16)
        st = torch.tensor(starts, device=dev)
        mask = step_mask(st, n, L, H // hkv, torch.float32, causal=causal, window=None)
        ref = attention(q.float(), kc[1:1 + bs, :L].float(), vc[1:1 + bs, :L].float(), mask, hd ** -0.5)
        worst["attention"] = max(worst["attention"], _graph_error(
            lambda: triton_attn.decode_attention(q, kc, vc, st, 1, L, hd ** -0.5, causal=causal), ref))
    for m, n, k in ((1, 4096, 4096), (16, 4096, 12288), (16, 6144, 4096), (15, 151936, 4096)):
        x = torch.randn(m, k, device=dev, generator=g, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, generator=g, dtype=torch.bfloat16) * 0.02
        worst["matmul"] = max(worst["matmul"], _graph_error(lambda: triton_gemm.linear(x, w), x.float() @ w.float().T))
    # the greedy lm_head without logits picks what the argmax of the stored logits picks, under graph replays
    ok = True
    for m in (1, 16):
        x = torch.randn(m, 4096, device=dev, generator=g, dtype=torch.bfloat16)
        w = torch.randn(151936, 4096, device=dev, generator=g, dtype=torch.bfloat16) * 0.02
        want = triton_ops.argmax(triton_gemm.linear(x, w))
        ok &= bool(torch.equal(triton_gemm.linear_argmax(x, w), want))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = triton_gemm.linear_argmax(x, w)
        for _ in range(10):
            got.fill_(-1)
            graph.replay()
            ok &= bool(torch.equal(got, want))
    worst["lm_head_argmax_equal"] = ok
    return worst


def _graph_error(fn, ref: torch.Tensor, replays: int = 50) -> float:
    """Worst |fn() - ref| / max |ref| over eager calls and graph replays (outputs cleared to NaN between)."""
    out = fn()
    err = float((out.float() - ref).abs().max() / ref.abs().max())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    for _ in range(replays):
        out.fill_(float("nan"))
        graph.replay()
        err = max(err, float((out.float() - ref).abs().max() / ref.abs().max()))
    return err


def same_fraction(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of tokens that lie in the identical prefix of each pair of outputs."""
    total = same = 0
    for x, y in zip(a, b):
        total += len(x)
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k]:
            k += 1
        same += k
    return same / max(total, 1)


@torch.inference_mode()
def divergence_gaps(hf, ps, x, y) -> list[float]:
    """At each pair's first differing token: |logit(AR's) - logit(DFlash's)| from a plain HF forward.

    Random bf16 weights give nearly flat logits, so a [bs, 1] and a [bs, 16] matmul can round a near-tie
    either way; a gap at bf16 rounding size (vs the logits' spread) says the difference is such a tie.
    """
    gaps = []
    for p, a, b in zip(ps, x, y):
        k = next((i for i, (u, v) in enumerate(zip(a, b)) if u != v), None)
        if k is None:
            continue
        logits = hf(torch.tensor([p + a[:k]], device=hf.device)).logits[0, -1].float()
        gaps.append(float((logits[a[k]] - logits[b[k]]).abs()))
        gaps.append(float(logits.std()))
    return gaps
