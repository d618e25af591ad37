"""Builtin engine speed on one GPU: the fast path's AR vs DFlash, transformers `generate`, memory.

One run prints one table: per concurrency AR, DFlash verifying the whole block every step (fixed 16), and
DFlash choosing its verify width by load (adaptive, the server's default), with the widths it chose. Setup: a Qwen3-8B-shaped target (36 layers, hidden 4096, bf16) and a
Qwen3-8B-DFlash-b16-shaped drafter (5 layers, B = 16), random weights built on the GPU (nothing is
downloaded). Random weights accept nothing, so DFlash rows use synthetic acceptance (mean tau, labelled).
Greedy losslessness (AR == DFlash token ids, real acceptance) is checked on the same device first.

    python -m benchmarks.speed.engine_speed --out engine_speed.json --torch-path  # GPU, ~2.5 minutes
    python -m benchmarks.speed.engine_speed --shape tiny --device cpu --new-tokens 32 --concurrency 1,4 --soak 20
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch

from dflash_bench.engine.fast.models.draft import FastDrafter
from dflash_bench.engine.fast.models.dense import DenseTarget
from dflash_bench.engine.fast.drive import decode, generate
from dflash_bench.engine.config import StepConfig
from dflash_bench.engine.fast.core import EngineCore
from dflash_bench.engine.fast.running.timer import StepTimer

from benchmarks.fixtures.shapes import SHAPES, build_pair
from benchmarks.speed.engine_diagnostics import (copy_bandwidth, divergence_gaps, kernels_agree, lossless_tiny,
                                           matmul_chain_ms, profile_step, same_fraction, sync)


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1000, vocab - 1000) for _ in range(length)] for _ in range(n)]


def timed(runner: EngineCore, ps: list[list[int]], new: int, dev, *, pipeline: bool = True) -> dict:
    """Warm-up (captures every graph the run needs), then the measured run: prefill, then decode to `new`.

    pipeline: the runner launches step k+1 before reading step k's tokens (as `generate` does); False is one
    host round trip per step (the server's loop when a request wants logprobs).
    """
    generate(runner, ps, new, pipeline=pipeline)
    runner.probe.restart_draws()  # every DFlash runner draws the same synthetic acceptances in its measured run
    chosen0 = runner.widths_chosen()
    sync(dev)
    t0 = time.perf_counter()
    outs = [[runner.add(i, p)] for i, p in enumerate(ps)]
    sync(dev)
    t1 = time.perf_counter()
    timer = StepTimer().attach(runner)  # the decode's steps: their times and acceptance
    first: dict = {}  # when the first request finished, and the tokens decoded by then (every row still running)

    def done(slot: int) -> None:
        if not first:
            first.update(t=time.perf_counter(), tokens=sum(min(len(o), new) - 1 for o in outs))

    try:
        decode(runner, outs, new, pipeline=pipeline, on_done=done)
    finally:
        timer.detach()
    sync(dev)
    t2 = time.perf_counter()
    draft_ms, verify_ms = timer.step_times_ms()
    decoded = sum(min(len(o), new) - 1 for o in outs)
    out = dict(tok_s=decoded / (t2 - t1), e2e_tok_s=len(ps) * new / (t2 - t0), prefill_s=t1 - t0,
               steps=timer.steps, step_ms=(t2 - t1) / timer.steps * 1e3, draft_ms=draft_ms, verify_ms=verify_ms,
               tau=timer.tau if runner.B > 1 else 1.0,
               full_batch_tok_s=first["tokens"] / (first["t"] - t1) if first.get("t", t1) > t1 else None)
    if runner.B > 1:  # tokens verified per row and step, and (adaptive) the widths chosen in the measured run
        out["verify_width"] = timer.verify_width
        if runner.config.adaptive:
            out["widths"] = {w: n - chosen0.get(w, 0) for w, n in sorted(runner.widths_chosen().items())
                             if n > chosen0.get(w, 0)}
    return out


def hf_generate(hf, p: list[int], new: int, dev) -> float:
    ids = torch.tensor([p], device=dev)
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    hf.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)
    sync(dev)
    t = time.perf_counter()
    out = hf.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
    sync(dev)
    return (out.shape[1] - ids.shape[1]) / (time.perf_counter() - t)


def soak(target, drafter, args, dev, vocab) -> dict:
    """`--soak` requests through continuous batching at the largest concurrency: memory before/after."""
    S = max(args.concurrency)
    r = EngineCore(target, drafter, StepConfig(verify_width="full", kv_block=args.kv_block, synthetic_acceptance=args.tau, seed=7))
    rng = random.Random(11)

    def run(n):
        free, live, done, sent = list(range(S)), {}, 0, 0
        while done < n:
            while free and sent < n:
                slot = min(free)
                free.remove(slot)
                live[slot] = [r.add(slot, prompts(1, rng.randint(16, args.prompt_len), vocab, sent)[0])]
                sent += 1
            got = r.step(sorted(live))
            for s in list(live):
                live[s].extend(got[s])
                if len(live[s]) >= args.soak_tokens:
                    r.release(s)
                    free.append(s)
                    del live[s]
                    done += 1
    run(2 * S)  # warm-up: graphs for every bucket this mix reaches
    sync(dev)
    m0 = torch.cuda.memory_allocated() if dev.type == "cuda" else 0
    t = time.perf_counter()
    run(args.soak)
    sync(dev)
    m1 = torch.cuda.memory_allocated() if dev.type == "cuda" else 0
    return dict(requests=args.soak, seconds=round(time.perf_counter() - t, 1), allocated_before=m0,
                allocated_after=m1, growth=m1 - m0, graphs=len(r.probe.graphs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64])
    ap.add_argument("--tau", type=float, default=6.5, help="synthetic acceptance length of the DFlash rows")
    ap.add_argument("--hf-tokens", type=int, default=64, help="new tokens for the transformers generate row")
    ap.add_argument("--soak", type=int, default=1000, help="requests in the memory soak (0: skip)")
    ap.add_argument("--soak-tokens", type=int, default=32)
    ap.add_argument("--kv-block", type=int, default=256)
    ap.add_argument("--out", help="also write the results as JSON here")
    ap.add_argument("--torch-path", action="store_true", help="after the table: AR batch 1 again with the "
                    "Triton kernels off (plain torch ops and SDPA, still under CUDA graphs)")
    ap.add_argument("--profile", help="print the kernels of one eager AR step and one DFlash draft and verify; "
                    "write the AR step's Chrome trace here")
    ap.add_argument("--profile-only", action="store_true", help="stop after the profile")
    a = ap.parse_args()
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    torch.manual_seed(0)
    if dev.type == "cpu":
        torch.set_num_threads(1)
    shape = SHAPES[a.shape]
    res: dict = dict(device=torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", torch=torch.__version__,
                     shape=a.shape, dtype=str(dtype), prompt_len=a.prompt_len, new_tokens=a.new_tokens, tau=a.tau)
    t = time.perf_counter()
    res["lossless_tiny"] = lossless_tiny(dev)
    print("lossless (tiny pair, float32):", res["lossless_tiny"], f"{time.perf_counter() - t:.0f}s", flush=True)
    res["kernel_error"] = kernels_agree(dev)
    print("kernels vs torch at Qwen3-8B shapes, worst error / max |ref| (graphs replayed):", res["kernel_error"],
          flush=True)
    hf, drafter = build_pair(shape, dev, dtype)
    res["copy_bw"] = bw = copy_bandwidth(dev)
    S = max(a.concurrency)
    max_len = -(-(a.prompt_len + a.new_tokens + 2 * shape["block"] + 8) // a.kv_block) * a.kv_block
    target = DenseTarget(hf, max_slots=S, max_len=max_len)
    fd = FastDrafter(drafter, target.embed, target.head, max_slots=S, max_len=max_len)
    res["target_gb"], res["drafter_gb"] = target.weight_bytes() / 1e9, fd.weight_bytes() / 1e9
    res["kernels"] = "triton" if target.kernels else "torch"
    floor_ms = target.weight_bytes() / bw * 1e3
    res["floor_ms"] = floor_ms
    res["matmul_chain_ms"] = matmul_chain_ms(target, dev)
    print(f"{res['device']}: copy {bw / 1e12:.2f} TB/s, target reads {res['target_gb']:.2f} GB/step "
          f"-> floor {floor_ms:.2f} ms/token ({1e3 / floor_ms:.0f} tok/s); weight matmuls alone "
          f"{res['matmul_chain_ms']:.2f} ms", flush=True)

    ar = EngineCore(target, None, StepConfig(verify_width="full", kv_block=a.kv_block))
    real = EngineCore(target, fd, StepConfig(verify_width="full", kv_block=a.kv_block))
    if a.profile:
        print(profile_step(ar, dev, a.profile), flush=True)
        print(profile_step(real, dev, rows=28), flush=True)
        if a.profile_only:
            return
    ps = prompts(min(S, 8), a.prompt_len, shape["vocab"], 1)
    n = min(64, a.new_tokens)
    real_timer = StepTimer().attach(real)
    x, y = generate(ar, ps, n), generate(real, ps, n)
    g = divergence_gaps(hf, ps, x, y)
    res["lossless_big"] = dict(identical_prefix=same_fraction(x, y), all_equal=x == y, tau=round(real_timer.tau, 3),
                               max_gap_at_divergence=max(g[0::2], default=0.0), logit_std=max(g[1::2], default=0.0))
    print("lossless (big, bf16, real acceptance):", res["lossless_big"], flush=True)
    auto_real = EngineCore(target, fd, StepConfig(kv_block=a.kv_block, verify_width="auto"))
    res["lossless_big"]["adaptive_equal_fixed"] = generate(auto_real, ps, n) == y
    del real, auto_real

    res["hf_generate_tok_s"] = hf_generate(hf, ps[0], a.hf_tokens, dev)
    print(f"transformers generate: {res['hf_generate_tok_s']:.1f} tok/s", flush=True)

    df = EngineCore(target, fd, StepConfig(verify_width="full", kv_block=a.kv_block, synthetic_acceptance=a.tau))
    auto = EngineCore(target, fd, StepConfig(kv_block=a.kv_block, synthetic_acceptance=a.tau, verify_width="auto"))
    if dev.type == "cuda":  # as the server does: no capture inside a measured run (adaptive widths vary per step)
        for name, r in (("fixed", df), ("adaptive", auto)):
            t = time.perf_counter()
            res[f"capture_all_{name}"] = dict(graphs=r.capture_all(), seconds=round(time.perf_counter() - t, 1))
        print("graphs captured before the rows:", res["capture_all_fixed"], res["capture_all_adaptive"], flush=True)
    rows = []
    for c in a.concurrency:
        p = prompts(c, a.prompt_len, shape["vocab"], 100 + c)
        r_ar = timed(ar, p, a.new_tokens, dev)
        r_df = timed(df, p, a.new_tokens, dev)
        r_auto = timed(auto, p, a.new_tokens, dev)
        rows.append(dict(concurrency=c, ar=r_ar, dflash=r_df, adaptive=r_auto))
        print(f"c={c}: AR {r_ar['tok_s']:.1f} tok/s, DFlash fixed-{shape['block']} {r_df['tok_s']:.1f} tok/s, "
              f"adaptive {r_auto['tok_s']:.1f} tok/s (widths {r_auto.get('widths')})", flush=True)
    res["rows"] = rows
    p1 = prompts(1, a.prompt_len, shape["vocab"], 101)
    res["unpipelined_c1"] = dict(ar=timed(ar, p1, a.new_tokens, dev, pipeline=False),
                                 dflash=timed(df, p1, a.new_tokens, dev, pipeline=False))
    if dev.type == "cuda":  # what a server pays at start-up to never capture mid-serving (FastEngine does this)
        t = time.perf_counter()
        cap = EngineCore(target, fd, StepConfig(verify_width="full", kv_block=a.kv_block))
        n_graphs = cap.capture_all()
        secs = round(time.perf_counter() - t, 1)
        same = generate(cap, ps, n) == y  # capturing left no trace: the same tokens as lazily captured graphs
        res["capture_all"] = dict(graphs=n_graphs, seconds=secs, max_len=max_len, slots=S, same_tokens_after=same)
        print(f"capture_all: {n_graphs} graphs in {secs} s (max_len {max_len}, {S} slots); same tokens after: {same}",
              flush=True)
        del cap
    if a.soak:
        res["soak"] = soak(target, fd, a, dev, shape["vocab"])
    if dev.type == "cuda":
        res["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
    print_table(res)
    save(res, a.out)
    if a.torch_path:
        del ar, df
        plain = DenseTarget(hf, max_slots=1, max_len=max_len, kernels=False)
        res["torch_path_ar_c1"] = c = timed(EngineCore(plain, None, StepConfig(verify_width="full", kv_block=a.kv_block)),
                                            prompts(1, a.prompt_len, shape["vocab"], 101), a.new_tokens, dev)
        print(f"without the Triton kernels: AR batch 1 {c['tok_s']:.1f} tok/s ({c['step_ms']:.2f} ms/step, "
              f"{100 * res['floor_ms'] / c['step_ms']:.0f}% of floor)")
        save(res, a.out)


def save(res: dict, path: str | None) -> None:
    if path:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(res, f, indent=2)
        os.replace(tmp, path)


def print_table(res: dict) -> None:
    floor_ms, bw = res["floor_ms"], res["copy_bw"]
    iter_floor = (res["target_gb"] + res["drafter_gb"]) * 1e9 / bw * 1e3
    print(f"\n{res['device']} | torch {res['torch']} | {res['shape']} {res['dtype']} | prompt {res['prompt_len']}, "
          f"{res['new_tokens']} new tokens | DFlash with synthetic acceptance tau={res['tau']} | "
          f"{res.get('kernels', 'torch')} kernels")
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; floor {floor_ms:.2f} ms per AR step ({1e3 / floor_ms:.0f} tok/s); "
          f"transformers generate (bs 1, eager): {res['hf_generate_tok_s']:.1f} tok/s; batch-1 weight matmuls alone "
          f"{res['matmul_chain_ms']:.2f} ms")
    hdr = (f"{'conc':>4} | {'AR tok/s':>9} | {'AR ms/step':>10} | {'AR %floor':>9} | {'DFlash tok/s':>12} | "
           f"{'speedup':>7} | {'tau':>5} | {'draft ms':>8} | {'verify ms':>9} | {'DF %floor':>9} | {'speedup/tau':>11} | "
           f"{'DF/AR step':>10}")
    print(hdr)
    print("-" * len(hdr))
    for row in res["rows"]:
        r_ar = row["ar"]
        for name in ("dflash", "adaptive"):
            if name not in row:
                continue
            r_df = row[name]
            sp = r_df["tok_s"] / r_ar["tok_s"]
            lead = (f"{row['concurrency']:>4} | {r_ar['tok_s']:>9.1f} | {r_ar['step_ms']:>10.2f} | "
                    f"{100 * floor_ms / r_ar['step_ms']:>8.0f}% |" if name == "dflash" else f"{'':>4} | {'adaptive':>9} | "
                    f"{'width ' + format(r_df.get('verify_width', 0), '.1f'):>10} | {'':>9} |")
            print(f"{lead} {r_df['tok_s']:>12.1f} | {sp:>6.2f}x | {r_df['tau']:>5.2f} | "
                  f"{r_df['draft_ms']:>8.2f} | {r_df['verify_ms']:>9.2f} | {100 * iter_floor / r_df['step_ms']:>8.0f}% | "
                  f"{sp / r_df['tau']:>11.2f} | {r_df['step_ms'] / r_ar['step_ms']:>10.3f}")
    print("Steps pipelined: step k+1 is launched before step k's tokens are read. "
          "tok/s: decode tokens after prefill / decode wall time, summed over the concurrent requests. ms per "
          "draft/verify: CUDA-event medians. %floor: weight bytes per step / copy bandwidth over the measured step "
          "(DFlash: target + drafter + borrowed lm_head). DF/AR step: a draft plus verify step in AR steps "
          "(speedup/tau is its inverse, less the tokens the last step accepts past the end). First DFlash row of each "
          "concurrency: the whole block verified every step (fixed); second: the width chosen by load (adaptive; "
          "width = tokens verified per row and step, mean), the same synthetic per-position curve.")
    for row in res["rows"]:
        if "adaptive" in row:
            print(f"c={row['concurrency']}: adaptive chose widths {row['adaptive'].get('widths')} (steps per width)")
    print("Until the first request finishes (every row running; the rest is the closed batch's tail, where DFlash "
          "rows finish at different steps and AR rows all at once), tok/s and speedup over AR's whole run:")
    for row in res["rows"]:
        r_ar = row["ar"]
        parts = [f"{n} {row[n]['full_batch_tok_s']:.1f} ({row[n]['full_batch_tok_s'] / r_ar['tok_s']:.2f}x)"
                 for n in ("dflash", "adaptive") if (row.get(n) or {}).get("full_batch_tok_s")]
        print(f"c={row['concurrency']}: " + ", ".join(parts))
    lt, lb = res["lossless_tiny"], res["lossless_big"]
    print(f"lossless: tiny float32 pair {lt}; big bf16 pair AR vs DFlash (real acceptance, tau {lb['tau']}): "
          f"identical {100 * lb['identical_prefix']:.1f}% of tokens; at each first difference the two tokens' "
          f"logits differ by at most {lb['max_gap_at_divergence']:.4f} (logit std {lb['logit_std']:.3f})")
    if "unpipelined_c1" in res:
        u = res["unpipelined_c1"]
        print(f"one host round trip per step (no step ahead), batch 1: AR {u['ar']['tok_s']:.1f} tok/s "
              f"({u['ar']['step_ms']:.2f} ms/step), DFlash {u['dflash']['tok_s']:.1f} tok/s (tau {u['dflash']['tau']:.2f}, "
              f"{u['dflash']['step_ms']:.2f} ms/step)")
    if "soak" in res:
        s = res["soak"]
        print(f"soak: {s['requests']} requests in {s['seconds']} s, allocated {s['allocated_before'] / 1e9:.3f} -> "
              f"{s['allocated_after'] / 1e9:.3f} GB (growth {s['growth']} B), {s['graphs']} graphs")
    if "peak_gb" in res:
        print(f"peak GPU memory allocated: {res['peak_gb']:.1f} GB")


if __name__ == "__main__":
    main()
