"""Sandbox fidelity and cost: every HumanEval and MBPP task's reference solution, assembled the way a model's
answer is (fenced in a chat reply) and run against the task's tests in the sandbox. All should pass; a
failure is a bug in program assembly or a sandbox limit too tight for honest code.

    python -m benchmarks.harness.quality_sandbox --data-dir ../shared/datasets [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import time

from dflash_bench.quality import scoring
from dflash_bench.quality.sandbox import Limits, run_many
from dflash_bench.suites import load_prompts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=os.environ.get("DFLASH_BENCH_DATA"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--num-prompts", type=int, default=None, help="N of each suite, drawn in seed-0 order (default: all)")
    args = ap.parse_args()
    for suite in ("humaneval", "mbpp"):
        prompts = load_prompts(suite, data_dir=args.data_dir, num_prompts=args.num_prompts)
        programs = []
        for p in prompts:
            reply = f"Here is my solution.\n```python\n{(p.meta['prompt'] if suite == 'humaneval' else '') + p.reference}\n```\n"
            programs.append(scoring.humaneval_program(reply, p.meta["prompt"], p.meta["test"], p.meta["entry_point"])
                            if suite == "humaneval" else
                            scoring.mbpp_program(reply, p.meta["test_list"], p.meta.get("test_imports")))
        start = time.perf_counter()
        results = run_many(programs, Limits(), args.workers)
        wall = time.perf_counter() - start
        failed = [(p.id, r.reason, r.stderr.strip().splitlines()[-1:]) for p, r in zip(prompts, results) if not r.passed]
        per = sorted(r.duration_s for r in results)
        print(f"{suite}: {len(results) - len(failed)}/{len(results)} reference solutions pass; wall {wall:.1f}s with "
              f"{args.workers} workers; per program p50 {per[len(per) // 2] * 1000:.0f} ms, max {per[-1] * 1000:.0f} ms")
        slow = sorted(zip(results, prompts), key=lambda x: -x[0].duration_s)[:3]
        print("  slowest:", ", ".join(f"{p.id} {r.duration_s:.2f}s" for r, p in slow))
        for f in failed:
            print("  FAILED", *f)
    print("isolation:", results[0].isolation)


if __name__ == "__main__":
    main()
