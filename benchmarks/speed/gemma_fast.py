"""Gemma 4 31B's shape on the fast path (`serve --fast --load-format dummy`), in process on one GPU (or on N, a rank
each, with --tensor-parallel-size N, as `serve` runs them): a decode
step's time against the weight-read floor, AR and DFlash with synthetic acceptance; with --prefill, a prefill
group's time per shape (k prompts of P tokens: a graph for 1-3 prompts, else the eager forward a batch runs),
the share of the matmuls' FLOPs a second it reaches against --peak-tflops, and with --anatomy where its device time
goes: by kernel kind (`kernel_kinds`), with the idle time between kernels (the eager forward's launch gaps); with
--host where the host's time goes (cProfile: its own time, its wait on the device, the Python functions).

    python -m benchmarks.speed.gemma_fast --json OUT.json [--slots 8 --max-len 1024 --batches 1,8 --tau 6.5]
    python -m benchmarks.speed.gemma_fast --json OUT.json --modes ar --slots 32 --max-len 2048 --batches 32 \
        --prefill 1x64,7x96,13x112,18x112,31x112,18x64 [--anatomy] [--host] [--tensor-parallel-size 2]
    python -m benchmarks.speed.gemma_fast --json smoke.json --device cpu --shrink   # the script itself, on a CPU

The shape is `dflash_bench.model_shapes`' (written by benchmarks/fixtures/shape_folders.py, without weights); the engine creates
random weights of it on the GPU. The floor: the bytes one step must read (`GemmaTarget.weight_bytes`: every weight
but the embedding table; the tied head is read whole) over the GPU's copy bandwidth, measured here as a
device-to-device copy of 2 GiB (bytes read plus bytes written, a second). Steps run as `serve --fast` runs them:
CUDA graphs, the next step launched before this one's tokens are read. A phase that fails (out of memory) is
written with its error; each phase's result is written as soon as it is measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import shlex
import statistics
import sys
import tempfile
import time
from typing import Any
from pathlib import Path

import torch

from benchmarks.fixtures.gpus import DENSE_PEAK_TFLOPS
from benchmarks.speed.kernel_kinds import host_once, profile_once


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def copy_bandwidth(device: str, gib: int = 2, reps: int = 20) -> float:
    """Bytes a second a device-to-device copy moves (read + written)."""
    x = torch.empty(gib << 30 if device == "cuda" else 1 << 26, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        y.copy_(x)
    sync()
    rate = 2 * x.numel() * reps / (time.perf_counter() - t)
    del x, y
    if device == "cuda":
        torch.cuda.empty_cache()
    return rate


SMALL = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_global_key_value_heads": 2,
         "global_head_dim": 32, "sliding_window": 32}


def shrink(pair: str) -> None:
    """A small version of the pair's recorded shape (same layout), to run this script on a CPU."""
    from dflash_bench import model_shapes

    target, drafter = model_shapes.SHAPES[pair]
    t = {**target, **SMALL, "layer_types": (["sliding_attention"] * 2 + ["full_attention"]) * 2}
    d = {**drafter, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16, "vocab_size": 512, "num_target_layers": 6,
         "dflash_config": {**drafter["dflash_config"], "target_layer_ids": [0, 1, 2, 3, 4, 4]}}
    model_shapes.SHAPES[pair] = (t, d)


def decode_rate(runner, bs: int, prompt_len: int, steps: int) -> dict:
    """Prefill bs random prompts into slots 0..bs-1, then time `steps` pipelined steps (after 3 warm-up steps)."""
    rng = random.Random(bs)
    slots = list(range(bs))
    for s in slots:
        runner.add(s, [rng.randrange(10, min(30000, runner.probe.target.vocab_size)) for _ in range(prompt_len)])
    for _ in range(3):
        runner.step(slots)
    sync()
    tokens, t = 0, time.perf_counter()
    for i in range(steps + 1):
        if i < steps and not runner.launch(slots):
            raise ValueError(f"{prompt_len} prompt tokens + {steps} steps pass --max-len {runner.max_len}: "
                             "raise --max-len or lower --prompt-len")
        if i:
            tokens += sum(len(v) for v in runner.collect().values())
    sync()
    seconds = time.perf_counter() - t
    for s in slots:
        runner.release(s)
    return {"batch": bs, "steps": steps, "tokens": tokens, "ms_per_step": 1e3 * seconds / steps,
            "tok_s": tokens / seconds, "tokens_per_row_step": tokens / (steps * bs)}


def group_lengths(spec: str) -> list[int]:
    """`KxP`: k prompts of P tokens; `KxA-B`: k prompts from A to B tokens, evenly spread (a served group's mixed
    lengths, padded to the longest)."""
    k, _, span = spec.partition("x")
    lo, _, hi = span.partition("-")
    try:
        n, a, b = int(k), int(lo), int(hi or lo)
    except ValueError:
        n = a = b = 0
    if n < 1 or not 0 < a <= b:
        raise SystemExit(f"--prefill {spec}: give KxP or KxA-B, k >= 1 and 0 < A <= B")
    return [a + round(i * (b - a) / (n - 1)) if n > 1 else b for i in range(n)]


def prefill_rate(core, lengths: list[int], reps: int, peak_tflops: float, anatomy: bool = False,
                 host: bool = False) -> dict:
    """Prefill k random prompts of these lengths into slots 0..k-1 as one group (the graph of its rows where the
    scheduler runs one, `Scheduler.runs_graph`, else one eager forward), `reps` times after a warm-up; the median,
    and the layers' matmul FLOPs a second over the prompts' own tokens (2 x the layers' parameters x the tokens; the
    attention's own and the head's, one row a prompt, left out: a group padded to its longest spends more). With
    `anatomy`, one more run of the group under torch's profiler: its device time by kernel kind, its idle time
    between kernels and its longest kernels (`kernel_kinds.Anatomy`). With `host`, one more run under cProfile: the
    host's own time and the device wait, and the Python functions that take the host's (`kernel_kinds.HostTime`)."""
    k, P, tokens = len(lengths), max(lengths), sum(lengths)
    rng = random.Random(k * P)
    t: Any = core.probe.target
    top = min(30000, t.vocab_size)
    slots = list(range(k))
    prompts = [[rng.randrange(10, top) for _ in range(m)] for m in lengths]
    times = []

    graphed = core.probe.runs_graph(k)  # as the scheduler runs a group of k

    def run() -> None:
        core.prefill_group(slots, prompts, graphed=graphed)
        sync()

    for i in range(reps + 1):
        sync()
        t0 = time.perf_counter()
        run()
        if i:  # the first is the warm-up
            times.append(time.perf_counter() - t0)
        for s in slots:
            core.release(s)
    ms = 1e3 * statistics.median(times)
    head = t.lm_head.numel() * t.lm_head.element_size()
    flops = 2 * (t.weight_bytes() - head) / t.dtype.itemsize * tokens
    padded = k * (core.probe.padded(P) if graphed else P)  # a graph runs its bucket, an eager forward the longest
    out = {"prompts": k, "prompt_len": P, "shortest": min(lengths), "tokens": tokens, "padded_tokens": padded,
           "graphed": graphed, "ms": ms, "ms_per_token": ms / tokens,
           "matmul_tflops": flops / (ms / 1e3) / 1e12, "peak_share": flops / (ms / 1e3) / 1e12 / peak_tflops}
    if anatomy:
        out["anatomy"] = profile_once(run, cuda=t.lm_head.is_cuda).model_dump()
        for s in slots:
            core.release(s)
    if host:
        sync()
        out["host"] = host_once(run).model_dump()
        for s in slots:
            core.release(s)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--pair", default="gemma-4-31B-it")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--tau", type=float, default=6.5)
    ap.add_argument("--modes", default="ar,dflash")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shrink", action="store_true", help="a small version of the shape (a CPU check of the script)")
    ap.add_argument("--prefill", default="", help="prefill groups to time, KxP,... (k prompts of P tokens each; "
                                                  "KxA-B: of A to B tokens, evenly spread)")
    ap.add_argument("--reps", type=int, default=5, help="timed repeats of each prefill group")
    ap.add_argument("--anatomy", action="store_true",
                    help="profile one more run of each prefill group: device time by kernel kind, idle time, top kernels")
    ap.add_argument("--host", action="store_true",
                    help="profile one more run of each prefill group with cProfile: the host's own time, the device "
                         "wait, the Python functions that take most (rank 0's)")
    ap.add_argument("--tensor-parallel-size", type=int, default=1,
                    help="ranks, a GPU each (gloo ranks on a CPU), as `serve --fast --tensor-parallel-size N`: the times "
                         "are rank 0's, the anatomy its kernels (the collectives among them)")
    ap.add_argument("--peak-tflops", type=float, default=DENSE_PEAK_TFLOPS["NVIDIA H200"],
                    help="the GPU's dense bf16 peak (H100/H200: %(default)s)")
    a = ap.parse_args()
    if (a.anatomy or a.host) and not a.prefill:
        ap.error(f"--{'anatomy' if a.anatomy else 'host'} profiles the prefill groups: name them with --prefill KxP,...")
    from benchmarks.fixtures.shape_folders import write_shape
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.build import build

    dev = a.device
    if a.shrink:
        shrink(a.pair)
    out: dict = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", "torch": torch.__version__,
                 "command": shlex.join(["python", "-m", "benchmarks.speed.gemma_fast",  # OUT: no path of this machine
                                        *(f"OUT/{a.json.name}" if x == str(a.json) else x for x in sys.argv[1:])]),
                 "pair": a.pair, "slots": a.slots, "max_len": a.max_len,
                 "tensor_parallel_size": a.tensor_parallel_size, "phases": []}
    out["copy_bandwidth_GBps"] = copy_bandwidth(dev) / 1e9

    def save() -> None:
        a.json.write_text(json.dumps(out, indent=1))
        print(json.dumps(out["phases"][-1] if out["phases"] else out), flush=True)

    save()
    with tempfile.TemporaryDirectory(prefix="gemma-shape-") as work:  # the configs, removed however the run ends
        folders = write_shape(a.pair, Path(work))
        for mode in a.modes.split(","):
            phase: dict = {"mode": mode}
            out["phases"].append(phase)
            t0 = time.perf_counter()
            engine: Any = None
            try:
                engine = build(EngineConfig.from_options(
                    folders["target"], folders["drafter"] if mode == "dflash" else None, mode=mode,
                    dtype="bfloat16" if dev == "cuda" else "float32", device=dev, max_slots=a.slots,
                    max_model_len=a.max_len, load_format="dummy", synthetic_acceptance=a.tau if mode == "dflash" else None,
                    benchmark_only=True, prefill="first", fast=True, tensor_parallel_size=a.tensor_parallel_size))
                r = engine.core
                t: Any = r.probe.target  # a GemmaTarget
                phase.update(build_s=time.perf_counter() - t0, graphs=len(r.probe.graphs), weight_bytes=t.weight_bytes(),
                             fused_kernels=t.fused is not None,  # triton_gemma's q/k/v + RoPE + cache write, GeGLU
                             kv_bytes=t.kv_bytes(), gpu_allocated_GiB=torch.cuda.memory_allocated() / 2**30
                             if dev == "cuda" else None)
                phase["floor_ms"] = 1e3 * phase["weight_bytes"] / (out["copy_bandwidth_GBps"] * 1e9)
                save()
                phase["prefills"] = []
                for group in [g for g in a.prefill.split(",") if g]:
                    phase["prefills"].append(prefill_rate(r, group_lengths(group), a.reps, a.peak_tflops,
                                                          a.anatomy, a.host))
                    save()
                phase["rates"] = []
                for bs in [int(b) for b in a.batches.split(",") if int(b) <= a.slots]:
                    steps = 40 if mode == "dflash" else 200
                    phase["rates"].append(decode_rate(r, bs, a.prompt_len, steps))
                    phase["rates"][-1]["floor_share"] = phase["floor_ms"] / phase["rates"][-1]["ms_per_step"]
                    save()
                phase["peak_GiB"] = torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else None
            except Exception as err:  # noqa: BLE001 - the phase's failure is the measurement
                phase["error"] = f"{type(err).__name__}: {str(err)[:500]}"
            save()
            if engine is not None:
                engine.close()  # the other ranks, if any
            engine = r = None
            gc.collect()
            if dev == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()


if __name__ == "__main__":
    main()
