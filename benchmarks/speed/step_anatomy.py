"""Where one fast-path step's time goes on the GPU: the kernels of replayed CUDA graphs, by kind.

For a batch-1 AR step and a DFlash step (draft graph + verify graph), at one KV-length bucket, it profiles
`--steps` replayed steps and prints, per kind of kernel (weight matmul, attention, norm, ...), the device
time per step and the number of launches, plus the idle time between kernels (the graphs' launch gaps). The
kernels DFlash runs that AR does not are listed by name, so a DFlash-only cost can be found.

    python -m benchmarks.speed.step_anatomy --out anatomy.json   # GPU only, about 40 s

It also times the DFlash step with the drafter's context K/V run after the target's layers instead of
beside them (EngineCore(overlap=False)): the span shows what the second stream saves.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from dflash_bench.engine.fast.models.draft import FastDrafter
from dflash_bench.engine.fast.models.dense import DenseTarget
from dflash_bench.engine.config import StepConfig
from dflash_bench.engine.fast.core import EngineCore

from benchmarks.speed.engine_speed import SHAPES, build_pair, prompts
from benchmarks.speed.kernel_kinds import kernels_of, tally


def anatomy(runner: EngineCore, steps: int, dev) -> dict:
    """Profile `steps` replayed steps of slot 0; per kind: device us per step and launches per step."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):  # capture (first step of each graph) and warm
        runner.step([0])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        runner.launch([0])
        for _ in range(steps - 1):  # pipelined, as generation runs: the next step is queued before a read
            runner.launch([0])
            runner.collect()
        runner.collect()
        torch.cuda.synchronize()
    ks = kernels_of(prof)
    if not ks:
        raise SystemExit("the profiler saw no kernels inside the CUDA graphs (CUPTI too old?)")
    busy = sum(d for _, _, d in ks) / steps
    span = (ks[-1][1] + ks[-1][2] - ks[0][1]) / steps
    return dict(kinds=per_step(tally(ks), steps), names=per_step(tally(ks, key=lambda n: n[:90]), steps),
                busy_us=round(busy, 1), span_us=round(span, 1), launches=round(len(ks) / steps, 1))


def per_step(by: dict[str, list[float]], steps: int) -> dict[str, dict[str, float]]:
    return {k: dict(us=round(us / steps, 1), launches=round(n / steps, 1)) for k, (us, n) in sorted(by.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--context", type=int, default=384, help="prompt length: the KV length the steps attend to")
    ap.add_argument("--tau", type=float, default=6.5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out")
    a = ap.parse_args()
    dev = torch.device(a.device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise SystemExit("step_anatomy profiles CUDA graphs: it needs a GPU (--device cuda)")
    torch.manual_seed(0)
    shape = SHAPES[a.shape]
    hf, drafter = build_pair(shape, dev, torch.bfloat16)
    max_len = a.context + 16 * (a.steps + 8) + 256
    target = DenseTarget(hf, max_slots=1, max_len=max_len)
    fd = FastDrafter(drafter, target.embed, target.head, max_slots=1, max_len=max_len)
    res = {"device": torch.cuda.get_device_name(), "shape": a.shape, "context": a.context}
    p = prompts(1, a.context, shape["vocab"], 3)[0]
    runners = (("ar", EngineCore(target, None, StepConfig(verify_width="full"))), ("dflash", EngineCore(target, fd, StepConfig(verify_width="full", synthetic_acceptance=a.tau))),
               ("dflash_serial", EngineCore(target, fd, StepConfig(verify_width="full", synthetic_acceptance=a.tau), overlap=False)))
    for mode, r in runners:
        r.capture_all()  # every bucket now: no capture inside the profiled steps
        r.add(0, p)
        res[mode] = anatomy(r, a.steps, dev)
        r.release(0)
    print_table(res)
    if a.out:
        with open(a.out + ".tmp", "w") as f:
            json.dump(res, f, indent=2)
        os.replace(a.out + ".tmp", a.out)


def print_table(res: dict) -> None:
    ar, df = res["ar"], res["dflash"]
    print(f"{res['device']} | {res['shape']} | batch 1, context {res['context']} | device us per step")
    print(f"{'kind':<22} | {'AR us':>8} | {'AR n':>6} | {'DFlash us':>9} | {'DF n':>6} | {'DF - 1.25 AR':>12}")
    for k in sorted(set(ar["kinds"]) | set(df["kinds"])):
        a_, d_ = ar["kinds"].get(k, dict(us=0.0, launches=0)), df["kinds"].get(k, dict(us=0.0, launches=0))
        print(f"{k:<22} | {a_['us']:>8.1f} | {a_['launches']:>6.1f} | {d_['us']:>9.1f} | {d_['launches']:>6.1f} | "
              f"{d_['us'] - 1.25 * a_['us']:>12.1f}")
    for name, key in (("busy", "busy_us"), ("span (first start to last end)", "span_us")):
        print(f"{name:<22} | {ar[key]:>8.1f} | {ar['launches']:>6.1f} | {df[key]:>9.1f} | {df['launches']:>6.1f} | "
              f"{df[key] - 1.25 * ar[key]:>12.1f}")
    print(f"gaps: AR {ar['span_us'] - ar['busy_us']:.1f} us, DFlash {df['span_us'] - df['busy_us']:.1f} us per step")
    if "dflash_serial" in res:
        se = res["dflash_serial"]
        print(f"DFlash with the drafter's context K/V after the target's layers, not beside them: span "
              f"{se['span_us']:.1f} us, busy {se['busy_us']:.1f} us per step")
    print("kernels by name (DFlash step; AR's count alongside):")
    for n, v in sorted(df["names"].items(), key=lambda kv: -kv[1]["us"]):
        a_ = ar["names"].get(n, dict(us=0.0, launches=0))
        print(f"  {v['us']:>8.1f} us {v['launches']:>5.1f}x | AR {a_['us']:>8.1f} us {a_['launches']:>5.1f}x | {n}")


if __name__ == "__main__":
    main()
