"""The demo's cells one after another on one engine, in process, on a CPU: what carries from one suite to the next.

`dflash-bench demo` serves every suite's cells (concurrency 1, 8, 32) from one DFlash server, so the width
chooser's acceptance counts from one suite meet the next one's first cell. This runs the same order in process
(`closed_loop.py`'s driver, 32 tokens, the demo's prompts): the `--before` suite's cells, then `--suite` at
concurrency 1, for each `--decay` of the chooser's counts, beside a fresh engine's `--suite` cell and AR's.

    python -m benchmarks.speed.suite_sequence --data-dir ../shared/datasets --out F
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from benchmarks.speed.closed_loop import closed_loop, suite_prompts

PAIR = Path(__file__).resolve().parents[2] / "dflash_bench" / "assets" / "default_pair"


def engine(mode: str, slots: int = 32):
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.build import build

    return build(EngineConfig.from_options(str(PAIR / "target"), str(PAIR / "drafter") if mode == "dflash" else None, mode=mode,
                             device="cpu", max_slots=slots, max_model_len=2048, cut_draft=True, fast=True))


def cell(e, prompts, c: int, tokens: int) -> dict:
    widths = e.core.widths_chosen()
    got = closed_loop(e, prompts, c, tokens)
    if e.core.config.adaptive:  # the widths this cell's steps took
        now = e.core.widths_chosen()
        got["widths"] = {w: n - widths.get(w, 0) for w, n in sorted(now.items()) if n > widths.get(w, 0)}
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--before", default="gsm8k")
    ap.add_argument("--suite", default="humaneval")
    ap.add_argument("--decay", default="0.99,0.999", help="the chooser's per row-step decay, comma-separated")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--concurrency", default="1,8,32", help="the cells of --before, in this order (the demo's)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args()
    from dflash_bench.engine.build import load_tokenizer

    tok = load_tokenizer(str(PAIR / "target"))  # the prompts once, before any engine is built
    cs = [int(c) for c in a.concurrency.split(",")]
    before = {c: suite_prompts(tok, a.before, c if c > 1 else 4, a.data_dir) for c in cs}
    target = suite_prompts(tok, a.suite, 4, a.data_dir)
    rows = []
    for r in range(a.rounds):
        ar = engine("ar", max(cs))
        rows.append({"round": r, "engine": "ar", **cell(ar, target, 1, a.tokens)})
        rows.append({"round": r, "engine": "dflash fresh", **cell(engine("dflash", max(cs)), target, 1, a.tokens)})
        for d in (float(x) for x in a.decay.split(",")):
            e = engine("dflash", max(cs))
            e.core.probe.chooser.decay = d
            for c, ps in before.items():
                cell(e, ps, c, a.tokens)
            rows.append({"round": r, "engine": f"dflash after {a.before}, decay {d}", **cell(e, target, 1, a.tokens)})
        for row in rows[-2 - len(a.decay.split(",")):]:
            print(f"round {r} {row['engine']:>32}: {row['output_tok_s']:7.1f} tok/s, TTFT p50 "
                  f"{row['ttft_ms_p50']:.1f} ms, tau {row['tau']}, widths {row.get('widths', '-')}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"cpus": os.cpu_count(), "suite": a.suite, "before": a.before,
                                           "tokens": a.tokens, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
