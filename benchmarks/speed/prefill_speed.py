"""Prefilling k prompts: one graph each (`EngineCore.add`) against one batched eager forward, and for k in
`scheduler.GRAPHED_ROWS` one graph of k rows (both `EngineCore.prefill_group`).

What `scheduler.GRAPHED_ROWS` and `PREFILL_TOKENS` are chosen from: per prompt length and k, the median ms
of each way (CUDA-synchronised, after a warm-up), on the target and drafter given (a DFlash prefill also
writes the drafter's context K/V).

    python -m benchmarks.speed.prefill_speed --model DIR [--draft DIR] --out prefill.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch


def timed(fn, sync, reps: int) -> float:
    fn()  # warm-up
    out = []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        out.append(1e3 * (time.perf_counter() - t))
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--lengths", default="128,320,1024")
    ap.add_argument("--rows", default="1,2,4,8,16,32")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-model-len", type=int, default=1536)
    ap.add_argument("--out")
    args = ap.parse_args()
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.build import build
    from dflash_bench.engine.fast.scheduling.scheduler import GRAPHED_ROWS

    rows = [int(k) for k in args.rows.split(",")]
    r = build(EngineConfig.from_options(args.model, args.draft, mode="dflash" if args.draft else "ar",
                          max_slots=max(rows), max_model_len=args.max_model_len, prefill="first", fast=True)).core
    sync = torch.cuda.synchronize if r.dev.type == "cuda" else (lambda: None)
    rng = random.Random(0)
    top = min(30000, r.probe.target.vocab_size)  # token ids of the model's vocabulary (the CPU kernels do not check them)
    res = []
    for n in [int(x) for x in args.lengths.split(",")]:
        for k in rows:
            if k * n > 4 * 8192:
                continue
            slots = list(range(k))
            prompts = [[rng.randrange(min(1000, top - 1), top) for _ in range(n)] for _ in slots]

            def one_by_one():
                for s, p in zip(slots, prompts):
                    r.add(s, p)

            def batched():
                r.prefill_group(slots, prompts, graphed=False)

            def grouped():  # one graph of k rows (scheduler.GRAPHED_ROWS)
                r.prefill_group(slots, prompts, graphed=True)

            row = {"prompt_tokens": n, "rows": k, "graphs_ms": timed(one_by_one, sync, args.reps),
                   "batched_ms": timed(batched, sync, args.reps) if k > 1 else None,
                   "grouped_graph_ms": timed(grouped, sync, args.reps) if k in GRAPHED_ROWS else None}
            for s in slots:
                r.release(s)
            print(json.dumps(row), flush=True)
            res.append(row)
    if args.out:
        dev = torch.cuda.get_device_name() if r.dev.type == "cuda" else "cpu"
        with open(args.out, "w") as f:
            json.dump({"device": dev, "model": args.model, "draft": args.draft, "rows": res}, f, indent=1)


if __name__ == "__main__":
    main()
