"""Where a closed-loop cell's time goes in process: prefill (per group size) against decode steps.

The workload of `closed_loop.py` (c clients, each sending its next GSM8K prompt when its last one ends, every
request exactly --new-tokens long): rows that start together finish together, so prompts come in waves. For
each concurrency and each bound on a prefill forward's padded tokens (`scheduler.PREFILL_TOKENS`) it runs the
cell and splits the wall time into prefill calls (`add_many`, synchronised after), decode steps (`step`) and the
rest, with the prompts' lengths. Prints one JSON line per cell.

    python -m benchmarks.speed.wave_anatomy --model DIR [--draft DIR] --data-dir .data
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks.speed.closed_loop import build, closed_loop, suite_prompts, workload_args


def timed(engine, sync):
    """Wrap the engine's `add_many` and `step` with timers; returns the dict they add to."""
    spent = {"prefill_s": 0.0, "step_s": 0.0, "steps": 0, "groups": 0, "prompts": 0}
    add_many, step = engine.add_many, engine.step

    def add(reqs):
        t = time.perf_counter()
        out = add_many(reqs)
        sync()
        spent["prefill_s"] += time.perf_counter() - t
        spent["groups"] += 1
        spent["prompts"] += len(reqs)
        return out

    def stepped(seqs):
        t = time.perf_counter()
        out = step(seqs)
        spent["step_s"] += time.perf_counter() - t
        spent["steps"] += 1
        return out
    engine.add_many, engine.step = add, stepped
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_args(ap, concurrency="8,32")
    ap.add_argument("--prefill-tokens", default="2048,4096,8192")
    args = ap.parse_args()
    import torch

    from dflash_bench.engine.fast.scheduling import scheduler

    engine, cs = build(args)
    sync = torch.cuda.synchronize if engine.core.dev.type == "cuda" else (lambda: None)
    for c in cs:
        prompts = suite_prompts(engine.tok, "gsm8k", args.prompts_per_slot * c, args.data_dir)
        lengths = sorted(len(p) for p in prompts)
        closed_loop(engine, prompts[:c], c, 16)  # warm-up
        for tokens in [int(t) for t in args.prefill_tokens.split(",")]:
            scheduler.PREFILL_TOKENS = tokens  # the admission cut and the prefill groups read it
            plain = engine.add_many, engine.step
            spent = timed(engine, sync)
            cell = closed_loop(engine, prompts, c, args.new_tokens)
            engine.add_many, engine.step = plain
            rest = cell["wall_s"] - spent["prefill_s"] - spent["step_s"]
            print(json.dumps({"concurrency": c, "prefill_tokens": tokens, "output_tok_s": round(cell["output_tok_s"], 1),
                              "wall_s": cell["wall_s"], **{k: round(v, 4) for k, v in spent.items()},
                              "step_ms": round(1e3 * spent["step_s"] / max(spent["steps"], 1), 3),
                              "rest_s": round(rest, 4), "prompt_len_p50": lengths[len(lengths) // 2],
                              "prompt_len_max": lengths[-1], "prompt_tokens": sum(lengths)}), flush=True)


if __name__ == "__main__":
    main()
