"""Where a decode step's time goes on a CPU, per kernel: the AR step against DFlash steps of each width.

    python -m benchmarks.speed.cpu_anatomy --out cpu_anatomy.json     # ~2 min on 2 shared cores

The fast path as `serve --fast --cut-draft --device cpu` runs it (one torch thread, float32, the C kernels), on
the embedded pair (`dflash_bench/assets/default_pair`: its target and its drafter, real weights), `--batches`
rows each holding a random prompt of `--prompt-len` tokens. Per batch and per verify width w (`--widths`; 0: the
AR step; 1: DFlash's anchor alone, no draft), `--steps` steps after 2 warm-up ones, acceptance synthetic
(`--tau`) so that every width's KV grows alike. Each C kernel is timed by a wrapper around its Python entry
point (`cpu_kernels.linear`, `decode_attention`, ...); "other" is the step's wall time less the kernels' (the
host's Python and torch ops). Rounds alternate the configurations, so that a shared machine's drift reaches all;
the result is the median over `--rounds` of each round's per-step means.

What it answers: whether a DFlash step of w tokens a row costs less than w AR steps, and which part is shared.
`step_over_ar` is a step's wall time in AR steps of the same round; `best_case` = w / step_over_ar, what DFlash
would gain over AR if every draft were accepted (no drafter can do better at that width).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.speed.cpu_step import PAIR, random_prompts

from dflash_bench.engine.reference.drafter import load_drafter
from dflash_bench.engine.fast.kernels import cpu_kernels
from dflash_bench.engine.fast.models.draft import FastDrafter
from dflash_bench.engine.fast.models.dense import DenseTarget
from dflash_bench.engine.config import StepConfig
from dflash_bench.engine.fast.core import EngineCore

ROOT = Path(__file__).resolve().parents[2]

KERNELS = ("linear", "decode_attention", "qk_rope_store", "add_rms_norm", "rms_norm", "silu_mul", "embed_norm",
           "argmax", "commit")
SPENT: collections.Counter = collections.Counter()  # kernel -> seconds, since the last clear


def time_kernels() -> None:
    """Wrap each C kernel's Python entry point so that its calls add their wall time to SPENT."""
    for name in KERNELS:
        fn = getattr(cpu_kernels, name)

        def timed(*args, _fn=fn, _name=name, **kwargs):
            t = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                SPENT[_name] += time.perf_counter() - t
        setattr(cpu_kernels, name, timed)


def cpu_name() -> str:
    try:
        line = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name"))
        return line.split(":", 1)[1].strip()
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def load_pair(max_slots: int, max_len: int) -> tuple[DenseTarget, FastDrafter]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(PAIR / "target"), dtype=torch.float32).eval()
    target = DenseTarget(hf, max_slots=max_slots, max_len=max_len, kernels="cpu")
    d = load_drafter(PAIR / "drafter", target_hidden=hf.config.hidden_size, target_layers=hf.config.num_hidden_layers,
                     target_vocab=target.vocab_size, dtype=torch.float32, device=torch.device("cpu")).eval()
    return target, FastDrafter(d, target.embed, target.head, max_slots=max_slots, max_len=max_len, kernels="cpu")


def one(target: DenseTarget, drafter: FastDrafter, w: int, prompts: list[list[int]], steps: int, tau: float,
        seed: int) -> dict:
    """Mean ms per step of each kernel, "other" and the wall time, over `steps` steps of width w (0: AR)."""
    r = EngineCore(target, None, StepConfig(verify_width="full")) if w == 0 else EngineCore(target, drafter, StepConfig(verify_width=w, cut_draft=True, synthetic_acceptance=tau, seed=seed))
    slots = list(range(len(prompts)))
    r.add_many(slots, prompts)
    for _ in range(2):
        r.step(slots)
    SPENT.clear()
    t = time.perf_counter()
    for _ in range(steps):
        r.step(slots)
    wall = (time.perf_counter() - t) / steps * 1e3
    for s in slots:
        r.release(s)
    out = {k: v / steps * 1e3 for k, v in SPENT.items()}
    out["other"] = wall - sum(out.values())
    out["step"] = wall
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--widths", default="0,1,2,3,4,8,16", help="0: the AR step; 1: DFlash's anchor alone")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tau", type=float, default=4.0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(1)  # as `serve --device cpu`
    batches = [int(x) for x in a.batches.split(",")]
    widths = [int(x) for x in a.widths.split(",")]
    if 0 not in widths:
        widths = [0] + widths
    if not cpu_kernels.load(required=False):
        sys.exit("the C kernels did not build here (no C compiler?): nothing to time")
    target, drafter = load_pair(max(batches), a.prompt_len + 16 * (a.steps + 4) + 64)
    time_kernels()
    samples: dict[tuple[int, int], list[dict]] = collections.defaultdict(list)
    for rnd in range(a.rounds):
        for bs in batches:
            prompts = random_prompts(bs, a.prompt_len, target.vocab_size, 1000 * rnd + bs)
            for w in widths:
                samples[(bs, w)].append(one(target, drafter, w, prompts, a.steps, a.tau, rnd))
        print(f"round {rnd + 1}/{a.rounds} done", flush=True)
    rows = []
    for bs in batches:
        for w in widths:
            got = samples[(bs, w)]
            ms = {k: round(statistics.median(g.get(k, 0.0) for g in got), 3) for k in {k for g in got for k in g}}
            ratio = statistics.median(g["step"] / ar["step"] for g, ar in zip(got, samples[(bs, 0)]))
            row = dict(batch=bs, width=w, kind="ar" if w == 0 else "dflash", ms=ms, step_over_ar=round(ratio, 3))
            if w:
                row["best_case"] = round(w / ratio, 3)
            rows.append(row)
            parts = " ".join(f"{k} {v:.2f}" for k, v in sorted(ms.items(), key=lambda kv: -kv[1]) if k != "step")
            print(f"{bs:>3} rows {'AR' if w == 0 else f'w={w}':>5}: step {ms['step']:.2f} ms = {ratio:.2f} AR steps"
                  f"{f', at most {w / ratio:.2f}x AR' if w else ''} | {parts}", flush=True)
    if a.out:
        a.out.write_text(json.dumps(dict(
            device=f"cpu ({os.cpu_count()}-core {cpu_name()}, {platform.machine()}; {torch.get_num_threads()} torch thread)",
            pair="embedded default",
            command=" ".join(["python -m benchmarks.speed.cpu_anatomy"] + sys.argv[1:]), prompt_len=a.prompt_len,
            tau=a.tau, steps=a.steps, rounds=a.rounds, rows=rows), indent=1) + "\n")


if __name__ == "__main__":
    main()
