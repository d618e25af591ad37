"""A burst of chat second turns, prefilled resumed (the fast path's prefix cache) against whole.

k conversations each send a first turn of `context` tokens (one token out), then their second turns at once: the
first turn, its answer and `new` tokens more. Timed is `FastEngine.add_many` of the k second turns (the prefill
forwards a served burst runs, CUDA-synchronised, the median of --reps): with each slot's kept tokens, only the
answer and the new tokens are prefilled (`Scheduler.resume_groups`, eager); after `reset_prefix_cache`, whole
conversations (`prefill_groups`, graphed where a group is one prompt or 2-3). What the first token of a second
turn waits for at c = k, before any decode step.

    python -m benchmarks.speed.resume_speed --model DIR [--load-format dummy] --rows 1,8,32 --context 1024 --new 64 \
        --out resume.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", help="a drafter folder: DFlash (its context is written too); default AR")
    ap.add_argument("--load-format", default="auto", help="auto, or dummy: random weights of the config's shape")
    ap.add_argument("--rows", default="1,8,32", help="conversations whose second turns arrive together")
    ap.add_argument("--context", type=int, default=1024, help="tokens of each first turn")
    ap.add_argument("--new", type=int, default=64, help="tokens each second turn adds")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    from dflash_bench.engine.build import build
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.sampling_params import SamplingParams

    rows = [int(k) for k in args.rows.split(",")]
    engine = build(EngineConfig.from_options(
        args.model, args.draft, mode="dflash" if args.draft else "ar", max_slots=max(rows),
        max_model_len=args.context + args.new + 64, load_format=args.load_format, fast=True))
    dev = engine.core.dev
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    rng = random.Random(0)
    top = min(30000, engine.vocab_size)
    one = SamplingParams(max_tokens=1, ignore_eos=True)

    def burst(k: int, resumed: bool) -> float:
        """One burst's ms: first turns served (untimed), then the k second turns' prefill."""
        engine.reset_prefix_cache()
        firsts = [[rng.randrange(min(1000, top - 1), top) for _ in range(args.context)] for _ in range(k)]
        seconds = []
        for s, _ in engine.add_many([(f"a{i}", p, one) for i, p in enumerate(firsts)]):
            seconds.append(s.prompt + s.out + [rng.randrange(min(1000, top - 1), top) for _ in range(args.new)])
            engine.release(s)
        if not resumed:
            engine.reset_prefix_cache()
        sync()
        t = time.perf_counter()
        got = engine.add_many([(f"b{i}", p, one) for i, p in enumerate(seconds)])
        sync()
        ms = 1e3 * (time.perf_counter() - t)
        assert all(s.cached == (args.context if resumed else 0) for s, _ in got), [s.cached for s, _ in got]
        for s, _ in got:
            engine.release(s)
        return ms

    res = []
    for k in rows:
        row = {"rows": k, "context": args.context, "new": args.new}
        for resumed in (False, True):
            burst(k, resumed)  # warm-up: the eager forward's first run of its shapes
            row["resumed_ms" if resumed else "whole_ms"] = statistics.median(burst(k, resumed) for _ in range(args.reps))
        row["tokens_whole"] = k * (args.context + 1 + args.new)
        row["tokens_resumed"] = k * (1 + args.new)
        print(json.dumps(row))
        res.append(row)
    device = torch.cuda.get_device_name(dev) if dev.type == "cuda" else \
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    out = {"device": device, "torch": torch.__version__, "model": args.model, "mode": "dflash" if args.draft else "ar",
           "load_format": args.load_format, "reps": args.reps, "rows": res}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
