"""What prompts that ride in a decode step cost (`serve --fast --prefill mixed`, AR): per number of running rows,
prompt length and prompts k, the median ms of the rows' step alone, of the k prompts' prefill alone (their graph),
and of the step that carries them (`EngineCore.launch(slots, rides)`), each launched and read back
(CUDA-synchronised, after a warm-up). Riding pays where mixed < step + prefill.

    python -m benchmarks.speed.mixed_step --shape qwen3-8b --out mixed_step.json
    python -m benchmarks.speed.mixed_step --model DIR --device cpu   # any target
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
from benchmarks.speed.prefill_speed import timed  # median ms after a warm-up, synchronised


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a target folder (else --shape's random one, written under --work)")
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--work", default="/tmp/real_engines")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--lengths", default="128,320,640")
    ap.add_argument("--rows", default="8,16,31")
    ap.add_argument("--prompts", default="1,2,3", help="k: prompts a step carries")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--max-model-len", type=int, default=1536)
    ap.add_argument("--out")
    args = ap.parse_args()
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.build import build

    model = args.model
    if model is None:
        from benchmarks.fixtures.shapes import ensure_shape_pair

        model = str(ensure_shape_pair(Path(args.work), args.device, args.shape)[0])
    rows = [int(k) for k in args.rows.split(",")]
    t = time.monotonic()
    ks = [int(k) for k in args.prompts.split(",")]
    r = build(EngineConfig.from_options(model, mode="ar", max_slots=max(rows) + max(ks), max_model_len=args.max_model_len,
                          device=args.device, prefill="mixed", fast=True)).core
    print(f"engine built, graphs captured: {time.monotonic() - t:.0f} s", flush=True)
    sync = torch.cuda.synchronize if r.dev.type == "cuda" else (lambda: None)
    rng = random.Random(0)
    top = min(30000, r.probe.target.vocab_size)
    prompt = lambda n: [rng.randrange(min(1000, top - 1), top) for _ in range(n)]  # noqa: E731
    res = []
    for bs in rows:
        slots = list(range(bs))
        for s in slots:
            r.add(s, prompt(64))
        for n, k in [(int(x), k) for x in args.lengths.split(",") for k in ks]:
            free = list(range(bs, bs + k))  # the slots prompts ride into: padding of the rows' bucket, or past it
            ps = [prompt(n) for _ in free]
            if not r.probe.can_ride(ps):
                continue

            def step():
                r.launch(slots)
                r.collect()

            def alone():
                r.add_many(free, ps)  # k <= 3: one graph
                for s in free:
                    r.release(s)

            def mixed():
                r.launch(slots, list(zip(free, ps)))
                r.collect()
                for s in free:
                    r.release(s)
            row = {"rows": bs, "prompt_tokens": n, "prompts": k, "step_ms": timed(step, sync, args.reps),
                   "prefill_ms": timed(alone, sync, args.reps), "mixed_ms": timed(mixed, sync, args.reps)}
            row["saved_ms"] = round(row["step_ms"] + row["prefill_ms"] - row["mixed_ms"], 3)
            print(json.dumps(row), flush=True)
            res.append(row)
        for s in slots:
            r.release(s)
    if args.out:
        dev = torch.cuda.get_device_name() if r.dev.type == "cuda" else "cpu"
        with open(args.out, "w") as f:
            json.dump({"device": dev, "torch": torch.__version__, "model": args.model or args.shape,
                       "command": "python -m benchmarks.speed.mixed_step " + (f"--model {args.model}" if args.model else
                                                                        f"--shape {args.shape}"),
                       "rows": res}, f, indent=1)


if __name__ == "__main__":
    main()
