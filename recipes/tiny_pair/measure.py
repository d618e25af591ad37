"""Measure the tiny pair with the builtin engine: tau per suite, AR and DFlash throughput, greedy parity.

    python -m recipes.tiny_pair.measure --data-dir ../shared/datasets               # suites, CPU
    python -m recipes.tiny_pair.measure --prompts-file prompts.jsonl --device cuda  # pre-rendered prompts

Each suite's first-turn prompts are sent one at a time (concurrency 1, greedy, chat template) to an AR engine
and a DFlash engine over the same target (one warm-up request each, not counted). Throughput = output
tokens / wall time of the requests (prefill included); tau = 1 + accepted / drafts (vLLM's formula, bonus token included); parity =
how many DFlash outputs equal the AR outputs token for token. Prints a markdown table; --json writes it.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITES = ["gsm8k", "math500", "humaneval", "mbpp", "mt-bench", "spec-bench"]


def load(args) -> dict[str, list[str]]:
    if args.prompts_file:
        out: dict[str, list[str]] = {}
        for line in Path(args.prompts_file).read_text().splitlines():
            rec = json.loads(line)
            out.setdefault(rec["suite"], []).append(rec["prompt"])
        return {k: v[: args.num_prompts] for k, v in out.items()}
    from dflash_bench.suites import load_prompts

    data_dir = Path(args.data_dir) if args.data_dir else None
    out = {}
    for s in args.suites.split(","):
        out[s] = [p.turns[0] for p in load_prompts(s, data_dir=data_dir, num_prompts=args.num_prompts, seed=0)]
    return out


def run(engine, tok, prompts: list[str], max_tokens: int) -> tuple[list[list[int]], float, int]:
    from dflash_bench.engine.reference.decode import generate
    from dflash_bench.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    ids = [tok(tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True),
               add_special_tokens=False).input_ids[-1024:] for p in prompts]
    generate(engine, ids[:1], params)  # warm-up
    st0 = (engine.stats.drafts, engine.stats.accepted)
    outs, seconds = [], 0.0
    for x in ids:
        _sync(engine)
        t = time.perf_counter()
        outs.append(generate(engine, [x], params)[0].out)
        _sync(engine)
        seconds += time.perf_counter() - t
    return outs, seconds, (engine.stats.drafts - st0[0], engine.stats.accepted - st0[1])


def _sync(engine) -> None:
    import torch

    if engine.device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default=str(ROOT / "dflash_bench" / "assets" / "default_pair"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--prompts-file", default=None, help="jsonl of {suite, prompt} (rendered first turns)")
    ap.add_argument("--suites", default=",".join(SUITES))
    ap.add_argument("--num-prompts", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--json", default=None)
    ap.add_argument("--dump-prompts", default=None, help="write the prompts as jsonl and exit")
    a = ap.parse_args()
    import torch

    from dflash_bench.engine.build import build
    from dflash_bench.engine.config import EngineConfig

    prompts = load(a)
    if a.dump_prompts:
        Path(a.dump_prompts).write_text("".join(json.dumps({"suite": s, "prompt": p}) + "\n" for s, ps in prompts.items() for p in ps))
        return
    pair = Path(a.pair)
    kw = dict(dtype=a.dtype, device=a.device, max_slots=2, max_model_len=1024 + a.max_tokens + 32)
    ar = build(EngineConfig(str(pair / "target"), mode="ar", **kw))
    df = build(EngineConfig(str(pair / "target"), str(pair / "drafter"), mode="dflash", **kw))
    rows = []
    for suite, ps in prompts.items():
        ar_out, ar_s, _ = run(ar, ar.tok, ps, a.max_tokens)
        df_out, df_s, (drafts, accepted) = run(df, df.tok, ps, a.max_tokens)
        n_ar, n_df = sum(map(len, ar_out)), sum(map(len, df_out))
        rows.append({"suite": suite, "prompts": len(ps), "tau": round(1 + accepted / max(drafts, 1), 2),
                     "ar_tok_s": round(n_ar / ar_s, 1), "dflash_tok_s": round(n_df / df_s, 1),
                     "speedup": round((n_df / df_s) / (n_ar / ar_s), 2), "output_tokens": n_df,
                     "identical": sum(x == y for x, y in zip(ar_out, df_out))})
        print(json.dumps(rows[-1]), flush=True)
    device = torch.cuda.get_device_name() if a.device.startswith("cuda") else f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    print(f"\n{device}, torch {torch.__version__}, dtype {a.dtype}, greedy, concurrency 1, max_tokens {a.max_tokens}\n")
    print("| suite | prompts | tau | AR tok/s | DFlash tok/s | speedup | identical to AR |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['suite']} | {r['prompts']} | {r['tau']} | {r['ar_tok_s']} | {r['dflash_tok_s']} | {r['speedup']}x | {r['identical']}/{r['prompts']} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": device, "torch": torch.__version__, "max_tokens": a.max_tokens, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
