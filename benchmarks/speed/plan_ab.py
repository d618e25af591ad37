"""Matmul plans A/B on whole steps: AR and DFlash step times at batch 1, the engine's plans against overrides.

`plan_for`'s rules were measured this way: one process, one GPU, the same weights, every variant's graphs
captured afresh, AR and DFlash steps timed as `engine_speed.py` times them (128-token prompt, 512 new
tokens, synthetic tau 6.5), in rounds so drift shows. A variant overrides the plan of given matmul shapes:

    python -m benchmarks.speed.plan_ab \\
        --variant 'o split=1,4096,4096:bn=64,split=2,stages=3+16,4096,4096:bn=64,split=2,stages=3' \\
        --variant 'gate/up 256 deep=1,24576,4096:bk=256+16,24576,4096:bk=256'      # GPU only, ~3 min

Each override is `m,n,k:field=value,...` (fields of `triton_gemm.GemmPlan`, over the engine's plan for that
shape), joined by `+`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

from dflash_bench.engine.fast.kernels import triton_gemm
from dflash_bench.engine.fast.models.draft import FastDrafter
from dflash_bench.engine.fast.models.dense import DenseTarget
from dflash_bench.engine.config import StepConfig
from dflash_bench.engine.fast.core import EngineCore

from benchmarks.speed.engine_speed import SHAPES, build_pair, prompts, timed



def parse_variant(text: str) -> tuple[str, dict]:
    """'NAME=m,n,k:field=value,...+...' -> (NAME, {(m, n, k): {field: value}})."""
    name, _, spec = text.partition("=")
    if not name or not spec:
        raise SystemExit(f"--variant {text!r}: expected NAME=m,n,k:field=value,...")
    out = {}
    for part in spec.split("+"):
        shape, _, fields = part.partition(":")
        try:
            key = tuple(int(v) for v in shape.split(","))
            kv = dict(f.split("=") for f in fields.split(",") if f)
            out[key] = {k: v if k == "mode" else int(v) for k, v in kv.items()}
            assert len(key) == 3 and set(kv) <= set(triton_gemm.GemmPlan.__dataclass_fields__)
        except (ValueError, AssertionError):
            raise SystemExit(f"--variant {text!r}: {part!r} is not m,n,k:field=value,... over GemmPlan's fields") from None
        base = triton_gemm.plan_for(*key)
        plan = base and triton_gemm.GemmPlan(**{**base.__dict__, **out[key]})
        if plan is None or plan.mode not in triton_gemm.MODES or not plan.fits(*key):
            raise SystemExit(f"--variant {text!r}: {part!r} does not give a skinny-matmul plan for that shape "
                             f"(the engine's: {base})")
    return name.strip(), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", default=[], help="NAME=m,n,k:field=value,...+... (repeatable)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=4, help="DFlash generations per variant and round (AR: half)")
    ap.add_argument("--out")
    a = ap.parse_args()
    variants = [("engine", {})] + [parse_variant(v) for v in a.variant]
    if not torch.cuda.is_available():
        raise SystemExit("plan_ab times CUDA graphs: it needs a GPU")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    shape = SHAPES["qwen3-8b"]
    hf, drafter = build_pair(shape, dev, torch.bfloat16)
    target = DenseTarget(hf, max_slots=1, max_len=1024)
    fd = FastDrafter(drafter, target.embed, target.head, max_slots=1, max_len=1024)
    prompt = prompts(1, 128, shape["vocab"], 101)
    engine_plan, overrides = triton_gemm.plan_for, {}

    def plan_for(m, n, k, sms=132):
        base = engine_plan(m, n, k, sms)
        if (m, n, k) in overrides and base is not None:
            return triton_gemm.GemmPlan(**{**base.__dict__, **overrides[(m, n, k)]})
        return base
    triton_gemm.plan_for = plan_for

    def step_ms(drafter, reps):
        runner = EngineCore(target, drafter, StepConfig(verify_width="full", synthetic_acceptance=6.5 if drafter else None))
        ms = statistics.median(timed(runner, prompt, 512, dev)["step_ms"] for _ in range(reps))
        del runner
        torch.cuda.empty_cache()
        return ms

    res = {"device": torch.cuda.get_device_name(), "variants": {}}
    for rnd in range(a.rounds):
        for name, ov in variants:
            overrides.clear()
            overrides.update(ov)
            r = res["variants"].setdefault(name, {"overrides": {str(k): v for k, v in ov.items()}, "ar_ms": [],
                                                  "dflash_ms": []})
            r["ar_ms"].append(round(step_ms(None, max(1, a.reps // 2)), 4))
            r["dflash_ms"].append(round(step_ms(fd, a.reps), 4))
            print(f"round {rnd} {name:<24} AR {r['ar_ms'][-1]:.4f} ms  DFlash {r['dflash_ms'][-1]:.4f} ms  "
                  f"DFlash / AR {r['dflash_ms'][-1] / r['ar_ms'][-1]:.4f}", flush=True)
    print(f"\n{res['device']} | Qwen3-8B shape, batch 1 | median step ms per round")
    for name, r in res["variants"].items():
        ratios = [d / ar for d, ar in zip(r["dflash_ms"], r["ar_ms"])]
        print(f"{name:<24} AR {r['ar_ms']}  DFlash {r['dflash_ms']}  DFlash / AR {[round(x, 4) for x in ratios]}")
    if a.out:
        with open(a.out + ".tmp", "w") as f:
            json.dump(res, f, indent=2)
        os.replace(a.out + ".tmp", a.out)


if __name__ == "__main__":
    main()
