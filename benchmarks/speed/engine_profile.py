"""Where a decode step's time goes: cProfile (host side, syncs included) over AR and DFlash generation.

    python -m benchmarks.speed.engine_profile --device cuda --dtype bfloat16 --hidden 1024 --layers 16
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time

import torch

from dflash_bench.engine.build import build
from dflash_bench.engine.config import EngineConfig
from dflash_bench.engine.reference.decode import generate
from dflash_bench.engine.sampling_params import SamplingParams
from dflash_bench.testing.tiny import make_tiny_pair


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--slots", type=int, default=0, help="KV slots (default: --batch)")
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--torch", action="store_true", help="torch.profiler (device kernels) instead of cProfile")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        target, drafter = make_tiny_pair(tmp, hidden=a.hidden, layers=a.layers, block_size=16, predictable=True)
        for mode in ("ar", "dflash"):
            eng = build(EngineConfig(str(target), str(drafter), mode=mode, device=a.device, dtype=a.dtype, max_slots=a.slots or a.batch, max_model_len=a.max_len))
            prompts = [eng.tok(f"prompt {i} " * 8).input_ids for i in range(a.batch)]
            sp = SamplingParams(max_tokens=a.max_tokens, ignore_eos=True)
            generate(eng, prompts, sp)
            if a.torch:
                from torch.profiler import ProfilerActivity, profile

                acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if eng.device.type == "cuda" else [])
                with profile(activities=acts) as tp:
                    t = time.perf_counter()
                    seqs = generate(eng, prompts, sp)
                    if eng.device.type == "cuda":
                        torch.cuda.synchronize()
                    dt = time.perf_counter() - t
                key = "cuda_time_total" if eng.device.type == "cuda" else "cpu_time_total"
                table = tp.key_averages().table(sort_by=key, row_limit=a.top)
            else:
                prof = cProfile.Profile()
                t = time.perf_counter()
                prof.enable()
                seqs = generate(eng, prompts, sp)
                if eng.device.type == "cuda":
                    torch.cuda.synchronize()
                prof.disable()
                dt = time.perf_counter() - t
                table = None
            tokens = sum(len(s.out) for s in seqs)  # Seq.steps counts drafting steps only (none in AR): not a step count
            print(f"== {mode}: {dt * 1000:.1f} ms for {tokens} tokens, {tokens / dt:.1f} tok/s")
            if table is not None:
                print(table)
            else:
                pstats.Stats(prof).sort_stats("tottime").print_stats(a.top)


if __name__ == "__main__":
    main()
