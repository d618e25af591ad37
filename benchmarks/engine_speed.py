"""Builtin engine speed, offline (no HTTP): AR vs DFlash tokens/s at several batch sizes, plus a lossless check.

Builds a tiny (or bigger, random-weight) target/drafter pair, `predictable` so that the drafter is always
right (tau = B): the upper bound of what DFlash can gain on this machine for this model shape.

    python benchmarks/engine_speed.py --device cpu --batch 1,8
    python benchmarks/engine_speed.py --device cuda --dtype bfloat16 --hidden 1024 --layers 16 --batch 1,8,32
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from dflash_bench.engine.build import build_engine
from dflash_bench.engine.decode import generate
from dflash_bench.engine.sampling import SamplingParams
from dflash_bench.engine.tiny import make_tiny_pair


def run(engine, prompts, max_tokens):
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    generate(engine, prompts[:1], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    seqs = generate(engine, prompts, sp)
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t
    return [s.out for s in seqs], sum(len(s.out) for s in seqs) / dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--random", action="store_true", help="random drafter (tau ~ 1) instead of the predictable one")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        target, drafter = make_tiny_pair(tmp, hidden=a.hidden, layers=a.layers, block_size=a.block_size,
                                         predictable=not a.random, seed=1)
        kw = dict(device=a.device, dtype=a.dtype, max_slots=max(int(b) for b in a.batch.split(",")), max_len=2048)
        ar = build_engine(str(target), mode="ar", **kw)
        df = build_engine(str(target), str(drafter), mode="dflash", **kw)
        n_params = sum(p.numel() for p in ar.target.model.parameters()) / 1e6
        print(f"device={a.device} dtype={a.dtype} target={n_params:.1f}M params B={a.block_size} max_tokens={a.max_tokens}")
        for b in (int(x) for x in a.batch.split(",")):
            prompts = [ar.tok(f"prompt number {i} " * 8).input_ids for i in range(b)]
            ids_ar, tps_ar = run(ar, prompts, a.max_tokens)
            d0, a0 = df.stats.drafts, df.stats.accepted
            ids_df, tps_df = run(df, prompts, a.max_tokens)
            tau = 1 + (df.stats.accepted - a0) / max(df.stats.drafts - d0, 1)
            print(f"batch {b:3d}: AR {tps_ar:9.1f} tok/s  DFlash {tps_df:9.1f} tok/s  speedup {tps_df / tps_ar:5.2f}x  "
                  f"tau {tau:5.2f}  same ids: {ids_ar == ids_df}")


if __name__ == "__main__":
    main()
