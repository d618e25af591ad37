"""The served workload without the server: an engine driven in process, closed loop, as `dflash-bench run` drives it.

`real_engines.py shape --engines inprocess` uses it for the engine's own throughput on the same prompts, output
length and concurrency as its served rows, so the two differ only by the serving path (HTTP, SSE, the event
loop, the engine thread's hand-over): c clients, each sending its next prompt as soon as its last one ends.
The driver admits what waits into free slots (`add_many`, batched as the engine does), then steps everyone.

    python -m benchmarks.closed_loop --model DIR [--draft DIR] --data-dir .data
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque
from pathlib import Path

from dflash_bench.engine.sampling import SamplingParams


def suite_prompts(tokenizer, suite: str, n: int, data_dir: Path | None, seed: int = 0) -> list[list[int]]:
    """The first turns `dflash-bench run --suite S -n N --seed 0` sends, as the server tokenizes them (chat template
    with the generation prompt, no special tokens added: `engine.api.chat_prompt`)."""
    from dflash_bench.suites import load_prompts

    out = []
    for p in load_prompts(suite, data_dir=data_dir, num_prompts=n, seed=seed):
        text = tokenizer.apply_chat_template([{"role": "user", "content": p.turns[0]}], tokenize=False,
                                             add_generation_prompt=True)
        out.append(tokenizer(text, add_special_tokens=False).input_ids)
    return out


def closed_loop(engine, prompts: list[list[int]], concurrency: int, max_tokens: int) -> dict:
    """Run every prompt to exactly `max_tokens` (ignore_eos) with `concurrency` in flight; tok/s and TTFT."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    todo = deque(enumerate(prompts))
    running: list = []
    sent: dict[str, float] = {}
    ttft: list[float] = []
    tokens = steps = 0
    st0 = (engine.stats.drafts, engine.stats.accepted)
    t0 = time.perf_counter()
    while todo or running:
        batch = []
        while todo and len(running) + len(batch) < concurrency:
            i, p = todo.popleft()
            batch.append((str(i), p, params))
            sent[str(i)] = time.perf_counter()
        started = engine.add_many(batch) if batch else []
        running += [seq for seq, _ in started]
        first = [d for _, d in started if d is not None]  # None: rides in a later step, first token then
        now = time.perf_counter()
        stepped = engine.step(running)
        steps += 1
        later = time.perf_counter()
        for d, t in [(d, now) for d in first] + [(d, later) for d in stepped]:
            if d.req_id in sent:  # the request's first token
                ttft.append(t - sent.pop(d.req_id))
        tokens += sum(len(d.token_ids) for d in first + stepped)
        for s in [s for s in running if s.finish]:
            engine.release(s)
            running.remove(s)
    wall = time.perf_counter() - t0
    ttft.sort()
    drafts, accepted = engine.stats.drafts - st0[0], engine.stats.accepted - st0[1]
    return {"concurrency": concurrency, "requests": len(prompts), "output_tokens": tokens, "wall_s": round(wall, 4),
            "output_tok_s": tokens / wall, "decode_steps": steps, "ttft_ms_p50": 1e3 * ttft[len(ttft) // 2],
            "tau": 1 + accepted / drafts if drafts else None}


def workload_args(ap: argparse.ArgumentParser, concurrency: str = "1,8,32") -> None:
    """The workload's options (model, drafter, prompts, lengths), shared with `wave_anatomy.py`."""
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--data-dir", type=Path)
    ap.add_argument("--concurrency", default=concurrency)
    ap.add_argument("--prompts-per-slot", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=1536)
    ap.add_argument("--device", default="auto")


def build(args) -> tuple:
    """The fast engine of `workload_args`, with slots for the highest concurrency, and the concurrencies."""
    from dflash_bench.engine.fast.engine import build_fast_engine

    cs = [int(c) for c in args.concurrency.split(",")]
    engine = build_fast_engine(args.model, args.draft, mode="dflash" if args.draft else "ar", device=args.device,
                               max_slots=max(cs), max_len=args.max_model_len)
    return engine, cs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workload_args(ap)
    ap.add_argument("--suite", default="gsm8k")
    args = ap.parse_args()
    engine, cs = build(args)
    for c in cs:
        prompts = suite_prompts(engine.tok, args.suite, args.prompts_per_slot * c, args.data_dir)
        closed_loop(engine, prompts[:c], c, 16)  # a warm-up, as `dflash-bench run` sends one per client
        print(json.dumps(closed_loop(engine, prompts, c, args.new_tokens)), flush=True)


if __name__ == "__main__":
    main()
