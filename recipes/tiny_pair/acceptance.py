"""Tau of one or more drafters on the prompts `dflash-bench demo` sends (held out of the pair's training).

    python -m recipes.tiny_pair.acceptance --pair OUT --drafters OUT/drafters/a,OUT/drafters/b --data-dir DATA \
        --device cuda --json tau.json

Per suite, the first turns of the first `--num-prompts` prompts of the seed-0 order (the demo sends the first
4, 8 and 32 of them), decoded greedily to each `--max-tokens` by the builtin reference engine in float32 (the
demo's dtype on a CPU), all prompts of a suite in one batch. tau = 1 + accepted / drafts (vLLM's formula);
`identical` counts DFlash outputs equal to AR's token for token. Prints one JSON line per (drafter, suite, length).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITES = "gsm8k,math500,humaneval,mbpp,mt-bench,spec-bench"


def encode(tok, prompts) -> list[list[int]]:
    return [tok(tok.apply_chat_template([{"role": "user", "content": p.turns[0]}], tokenize=False,
                                        add_generation_prompt=True), add_special_tokens=False).input_ids for p in prompts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default=str(ROOT / "dflash_bench" / "assets" / "default_pair"))
    ap.add_argument("--drafters", default=None, help="comma-separated drafter folders (default: PAIR/drafter)")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--suites", default=SUITES)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-tokens", default="32,128")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from dflash_bench.engine.build import build
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.reference.decode import generate
    from dflash_bench.engine.sampling_params import SamplingParams
    from dflash_bench.suites import load_prompts

    pair = Path(a.pair)
    drafters = a.drafters.split(",") if a.drafters else [str(pair / "drafter")]
    lengths = [int(x) for x in a.max_tokens.split(",")]
    kw = dict(dtype="float32", device=a.device, max_slots=a.num_prompts, max_model_len=2048 + max(lengths) + 32)
    ar = build(EngineConfig(str(pair / "target"), mode="ar", **kw))
    prompts = {s: encode(ar.tok, load_prompts(s, data_dir=Path(a.data_dir), num_prompts=a.num_prompts, seed=0))
               for s in a.suites.split(",")}
    prompts = {s: [p[-2048:] for p in ps] for s, ps in prompts.items()}
    want = {(s, n): [x.out for x in generate(ar, ps, SamplingParams(max_tokens=n))] for s, ps in prompts.items()
            for n in lengths}
    rows = []
    for d in drafters:
        df = build(EngineConfig(str(pair / "target"), d, mode="dflash", **kw))
        for (s, n), ref in want.items():
            before = (df.stats.drafts, df.stats.accepted)
            got = [x.out for x in generate(df, prompts[s], SamplingParams(max_tokens=n))]
            drafts, accepted = df.stats.drafts - before[0], df.stats.accepted - before[1]
            rows.append({"drafter": d, "suite": s, "max_tokens": n, "prompts": len(got),
                         "tau": round(1 + accepted / max(drafts, 1), 3), "output_tokens": sum(map(len, got)),
                         "identical": sum(x == y for x, y in zip(got, ref))})
            print(json.dumps(rows[-1]), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"device": a.device, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
