"""What the width chooser learns in a demo-sized cell: AR and DFlash (`--cut-draft`, adaptive width) engines in one
process, one suite at one concurrency, the cell run round after round (AR then DFlash, seconds apart), and after
each DFlash round the chooser's measured step time per (batch bucket, width), the widths it chose, and the tokens
a row commits per step at each width (from the acceptance it measured).

Where DFlash can pay: a width w pays over the anchor-only step (w = 1, an AR step plus the drafter's context) when
E[tokens | w] / T(bucket, w) > 1 / T(bucket, 1).

    python -m benchmarks.speed.width_table --data-dir DATA --concurrency 8,32 --suites gsm8k,mt-bench \
        --out width_table.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.speed.closed_loop import closed_loop, suite_prompts

PAIR = "dflash_bench/assets/default_pair"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--pair", default=PAIR, help="a folder with target/ and drafter/")
    ap.add_argument("--suites", default="gsm8k,mt-bench")
    ap.add_argument("--concurrency", default="8,32")
    ap.add_argument("--new-tokens", type=int, default=32, help="the demo's")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch

    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.build import build

    rows = []
    for suite in args.suites.split(","):
        for c in [int(x) for x in args.concurrency.split(",")]:
            kw = dict(device=args.device, max_slots=c, max_model_len=1024, prefill="first")  # fresh engines: the chooser starts empty
            ar = build(EngineConfig.from_options(f"{args.pair}/target", None, mode="ar", **kw, fast=True))
            df = build(EngineConfig.from_options(f"{args.pair}/target", f"{args.pair}/drafter", mode="dflash", cut_draft=True, **kw, fast=True))
            prompts = suite_prompts(ar.tok, suite, c, args.data_dir)
            for e in (ar, df):
                closed_loop(e, prompts[:min(c, 8)], min(c, 8), 16)  # a warm-up, as a sweep's
            for rnd in range(args.rounds):
                cells = {name: closed_loop(e, prompts, c, args.new_tokens) for name, e in (("ar", ar), ("dflash", df))}
                ch = df.core.probe.chooser
                row = {"suite": suite, "concurrency": c, "round": rnd,
                       "ar_tok_s": round(cells["ar"]["output_tok_s"], 1),
                       "dflash_tok_s": round(cells["dflash"]["output_tok_s"], 1),
                       "step_ms": {f"{b},{w}": round(1e3 * t, 2) for (b, w), t in sorted(ch.times.items())},
                       "chosen": {str(w): n for w, n in sorted(ch.chosen.items())},
                       "tokens_per_row_step": {str(w): round(ch.expected(w), 2) for w in ch.widths}}
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": args.device, "torch": torch.__version__, "threads": torch.get_num_threads(),
                       "pair": args.pair, "command": "python -m benchmarks.speed.width_table --data-dir DATA "
                       f"--suites {args.suites} --concurrency {args.concurrency} --rounds {args.rounds}",
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
