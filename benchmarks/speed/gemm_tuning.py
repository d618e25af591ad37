"""Decode-step matmuls of the Qwen3-8B shape (1 and 16 rows; `--quick`: any): cuBLAS, cuBLASLt and the Triton
skinny kernel.

    python -m benchmarks.speed.gemm_tuning --out F      # GPU only, ~3 min
    python -m benchmarks.speed.gemm_tuning --quick --rows 16,32 --out F   # the engine's plans, ~1 min

Each weight shape is timed under a CUDA graph that cycles through enough copies (400 MB) that no call finds
its weight in L2, as in a real step where every layer's weights are distinct. Then the best plan per shape
and row count runs the whole step's chain of matmuls (36 distinct layers and lm_head; the drafter's 5 layers,
its context projections and the borrowed lm_head) against cuBLAS.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time

import torch
import torch.nn.functional as F

from dflash_bench.engine.fast.kernels.triton_attn import sm_count
from dflash_bench.engine.fast.kernels.triton_gemm import GemmPlan, linear, plan_for, skinny_linear

SHAPES = {  # name: (n, k)
    "qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
    "lm_head": (151936, 4096), "draft_fc": (4096, 5 * 4096), "draft_kv": (5 * 2048, 4096),
}


def graph_ms(body, reps: int = 3) -> float:
    body()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    g.replay()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e3


def per_call_us(call, weights, rounds: int = 4) -> float:
    def body():
        for _ in range(rounds):
            for w in weights:
                call(w)
    return graph_ms(body) / (rounds * len(weights)) * 1e3


def cublas(x, lt: bool):
    def call(w):
        return F.linear(x, w)
    if not lt:
        return call

    def lt_call(w):
        prev = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library("cublaslt")
        try:
            return F.linear(x, w)
        finally:
            torch.backends.cuda.preferred_blas_library(prev)
    return lt_call


def weight_copies(n: int, k: int, dev, dt) -> list[torch.Tensor]:
    """Enough distinct `[n, k]` weights (400 MB, at least 2) that cycling through them defeats L2."""
    return [torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(max(2, math.ceil(400e6 / (n * k * 2))))]


def plans(m: int):
    for mode in ("fma", "dot", "swap") if m == 1 else ("dot", "swap"):
        bns = (32, 64, 128) if mode == "swap" else (16, 32, 64)
        for bn, bk, split, warps in itertools.product(bns, (128, 256), (1, 2, 4), (4, 8)):
            yield GemmPlan(bn=bn, bk=bk, split=split, mode=mode, warps=warps, stages=3)


def tune(dev, dt, rows_list=(1, 16)) -> dict:
    out = {}
    for name, (n, k) in SHAPES.items():
        weights = weight_copies(n, k, dev, dt)
        for m in rows_list:
            x = torch.randn(m, k, device=dev, dtype=dt)
            ref = F.linear(x, weights[0]).float()
            tol = 0.01 * ref.abs().max().item()  # 1% of the output's scale: a bf16 rounding or two, not a bug
            res = {"cublas": per_call_us(cublas(x, False), weights), "cublaslt": per_call_us(cublas(x, True), weights)}
            best, every = None, {}
            cands = [p for p in plans(m) if p.fits(m, n, k)]
            for p in cands:
                try:
                    err = (skinny_linear(x, weights[0], plan=p).float() - ref).abs().max().item()
                    if err > tol:
                        print(f"  {name} m={m} {p}: wrong by {err}")
                        continue
                    us = per_call_us(lambda w: skinny_linear(x, w, plan=p), weights)
                except Exception as e:  # out of resources for this plan
                    print(f"  {name} m={m} {p}: {type(e).__name__}")
                    continue
                every[f"{p.mode} bn{p.bn} bk{p.bk} s{p.split} w{p.warps} st{p.stages}"] = round(us, 2)
                if best is None or us < best[0]:
                    best = (us, p)
            # refine pipelining depth around the best plan
            for st in (2, 4, 5):
                p = GemmPlan(**{**best[1].__dict__, "stages": st})
                try:
                    us = per_call_us(lambda w: skinny_linear(x, w, plan=p), weights)
                except Exception:
                    continue
                if us < best[0]:
                    best = (us, p)
            res["triton"], res["plan"], res["every"] = best[0], best[1].__dict__, every
            res["engine"] = per_call_us(lambda w: linear(x, w), weights)  # plan_for's choice, as the engine runs
            gb = n * k * 2 / 1e9
            print(f"{name:8} m={m:<2} cublas {res['cublas']:7.1f} us ({gb / res['cublas'] * 1e6:5.0f} GB/s)  "
                  f"cublaslt {res['cublaslt']:7.1f}  best triton {best[0]:7.1f} ({gb / best[0] * 1e6:5.0f} GB/s) "
                  f"{best[1]}  engine's plan {res['engine']:7.1f} {plan_for(m, n, k, sm_count(dev))}", flush=True)
            out[f"{name}/{m}"] = res
        del weights
        torch.cuda.empty_cache()
    return out


def quick(dev, dt, rows_list=(1, 16)) -> dict:
    """The engine's plan per shape against cuBLAS and a few variations of it (no sweep)."""
    out = {}
    for name, (n, k) in SHAPES.items():
        weights = weight_copies(n, k, dev, dt)
        for m in rows_list:
            x = torch.randn(m, k, device=dev, dtype=dt)
            base = plan_for(m, n, k, sm_count(dev))
            variants = {"engine": base, "stages4": GemmPlan(**{**base.__dict__, "stages": 4}),
                        "bk128": GemmPlan(**{**base.__dict__, "bk": 128})}
            res = {"cublas": per_call_us(cublas(x, False), weights)}
            for label, p in variants.items():
                try:
                    res[label] = per_call_us(lambda w: skinny_linear(x, w, plan=p), weights)
                except Exception as e:  # a setting this GPU cannot launch
                    print(f"  {label}: {type(e).__name__}: {str(e)[:100]}")
                    res[label] = float("nan")
            print(f"{name:8} m={m:<2} " + "  ".join(f"{k} {v:6.1f}" for k, v in res.items()), flush=True)
            out[f"{name}/{m}"] = res
        del weights
        torch.cuda.empty_cache()
    return out


def chains(dev, dt, best: dict) -> dict:
    """Whole-step matmul chains with distinct weights: cuBLAS vs the best Triton plan per shape."""
    def w(name):
        n, k = SHAPES[name]
        return torch.randn(n, k, device=dev, dtype=dt) * 0.02
    target = [{s: w(s) for s in ("qkv", "o", "gate_up", "down")} for _ in range(36)]
    drafter = [{s: w(s) for s in ("qkv", "o", "gate_up", "down")} for _ in range(5)]
    head, fc, kv = w("lm_head"), w("draft_fc"), w("draft_kv")

    def mm(x, wt, name, how):
        if how == "engine":
            return linear(x, wt)
        if how == "best":
            p = GemmPlan(**best[f"{name}/{16 if x.shape[0] > 1 else 1}"]["plan"])
            if p.fits(x.shape[0], wt.shape[0], wt.shape[1]):
                return skinny_linear(x, wt, plan=p)
        return F.linear(x, wt)

    def step(m, how, layers, extra):
        xs = {s: torch.randn(m, SHAPES[s][1], device=dev, dtype=dt) for s in SHAPES}

        def body():
            for ly in layers:
                for s, wt in ly.items():
                    mm(xs[s], wt, s, how)
            mm(xs["lm_head"][: 15 if extra else m], head, "lm_head", how)
            if extra:
                mm(xs["draft_fc"][:16], fc, "draft_fc", how)
                mm(xs["draft_kv"][:16], kv, "draft_kv", how)
        return graph_ms(body, reps=20)

    res = {}
    hows = ("cublas", "best", "engine")
    for label, m, layers, extra in (("ar", 1, target, False), ("verify", 16, target, False), ("draft", 16, drafter, True)):
        res[label] = {f"{h}_ms": step(m, h, layers, extra) for h in hows}
        print(f"chain {label:7} " + "  ".join(f"{h} {res[label][f'{h}_ms']:.3f} ms" for h in hows), flush=True)
    for h in hows:
        r = (res["verify"][f"{h}_ms"] + res["draft"][f"{h}_ms"]) / res["ar"][f"{h}_ms"]
        print(f"(verify + draft) / ar matmuls, {h}: {r:.3f}")
    return res


def target_chains(dev, dt, rows_list) -> dict:
    """An AR step's matmul chain (36 distinct layers and lm_head) at each row count: cuBLAS against the engine's
    `linear` (the skinny kernel where `plan_for` takes the shape)."""
    layers = [{s: torch.randn(*SHAPES[s], device=dev, dtype=dt) * 0.02 for s in ("qkv", "o", "gate_up", "down")}
              for _ in range(36)]
    head = torch.randn(*SHAPES["lm_head"], device=dev, dtype=dt) * 0.02
    res = {}
    for m in rows_list:
        xs = {s: torch.randn(m, SHAPES[s][1], device=dev, dtype=dt) for s in SHAPES}
        for how, mm in (("cublas", F.linear), ("engine", linear)):
            def body():
                for ly in layers:
                    for s, wt in ly.items():
                        mm(xs[s], wt)
                mm(xs["lm_head"], head)
            res[f"ar/{m}/{how}_ms"] = graph_ms(body, reps=20)
        print(f"chain ar m={m:<2} cublas {res[f'ar/{m}/cublas_ms']:.3f} ms  engine {res[f'ar/{m}/engine_ms']:.3f} ms",
              flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true", help="only the engine's plans and a few variations, and the AR "
                    "step's chain at each of --rows")
    ap.add_argument("--rows", default="1,16", help="row counts of --quick")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gemm_tuning times CUDA graphs: it needs a GPU")
    dev, dt = torch.device("cuda"), torch.bfloat16
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    if args.quick:
        rows = [int(r) for r in args.rows.split(",")]
        res = {"device": torch.cuda.get_device_name(), "quick": quick(dev, dt, rows), "chains": target_chains(dev, dt, rows)}
        if args.out:
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)
        return
    t = time.time()
    best = tune(dev, dt)
    print(f"tuned in {time.time() - t:.0f} s", flush=True)
    res = {"device": torch.cuda.get_device_name(), "shapes": best, "chains": chains(dev, dt, best)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
