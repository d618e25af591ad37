"""The served workload without the server: an engine driven in process, closed loop, as `dflash-bench run` drives it.

`real_engines.py shape --engines inprocess` uses it for the engine's own throughput on the same prompts, output
length and concurrency as its served rows, so the two differ only by the serving path (HTTP, SSE, the event
loop, the engine thread's hand-over): c clients, each sending its next prompt as soon as its last one ends.
The engine runs in the `EngineLoop` that `serve` runs it in (admission into free slots, prefill groups, steps).

    python -m benchmarks.speed.closed_loop --model DIR [--draft DIR] --data-dir .data
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import deque
from pathlib import Path

from dflash_bench.engine.sampling_params import SamplingParams


def suite_prompts(tokenizer, suite: str, n: int, data_dir: Path | None, seed: int = 0) -> list[list[int]]:
    """The first turns `dflash-bench run --suite S -n N --seed 0` sends, as the server tokenizes them: each a chat
    request of one user message, rendered by the server's own `engine.api.chat_prompt`."""
    from dflash_bench.engine.serving.api import ChatRequest, chat_prompt
    from dflash_bench.suites import load_prompts

    return [chat_prompt(tokenizer, ChatRequest(messages=[{"role": "user", "content": p.turns[0]}]))
            for p in load_prompts(suite, data_dir=data_dir, num_prompts=n, seed=seed)]


def closed_loop(engine, prompts: list[list[int]], concurrency: int, max_tokens: int) -> dict:
    """Run every prompt to exactly `max_tokens` (ignore_eos) with `concurrency` in flight; tok/s and TTFT.

    The engine runs in an `EngineLoop`, as `serve` runs it (its admission into free slots, prefill groups and
    steps); each finished request submits the next prompt from the loop's thread, as a client would."""
    from dflash_bench.engine.serving.loop import EngineLoop

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    todo = deque(enumerate(prompts))
    sent: dict[str, float] = {}
    ttft: list[float] = []
    errors: list[Exception] = []
    tokens = in_flight = 0
    lock, done = threading.Lock(), threading.Event()
    loop = EngineLoop(engine).start()

    def submit_next() -> None:  # with `lock` held
        nonlocal in_flight
        i, p = todo.popleft()
        sent[str(i)] = time.perf_counter()
        in_flight += 1
        loop.submit(str(i), p, params, sink)

    def sink(d) -> None:  # on the loop's thread
        nonlocal tokens, in_flight
        t = time.perf_counter()
        with lock:
            if isinstance(d, Exception):
                errors.append(d)
            else:
                if d.req_id in sent:  # the request's first token
                    ttft.append(t - sent.pop(d.req_id))
                tokens += len(d.token_ids)
                if not d.finish:
                    return
            in_flight -= 1
            if todo:
                submit_next()
            elif not in_flight:
                done.set()

    st0 = (engine.stats.drafts, engine.stats.accepted)
    t0 = time.perf_counter()
    try:
        with lock:
            while todo and in_flight < concurrency:
                submit_next()
            if not in_flight:
                done.set()
        done.wait()
    finally:
        loop.stop()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    ttft.sort()
    drafts, accepted = engine.stats.drafts - st0[0], engine.stats.accepted - st0[1]
    return {"concurrency": concurrency, "requests": len(prompts), "output_tokens": tokens, "wall_s": round(wall, 4),
            "output_tok_s": tokens / wall, "decode_steps": loop.steps, "prefill_groups": loop.groups,
            "ttft_ms_p50": 1e3 * ttft[len(ttft) // 2] if ttft else None,
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
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.build import build

    cs = [int(c) for c in args.concurrency.split(",")]
    engine = build(EngineConfig.from_options(args.model, args.draft, mode="dflash" if args.draft else "ar", device=args.device,
                               max_slots=max(cs), max_model_len=args.max_model_len, prefill="first", fast=True))
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
