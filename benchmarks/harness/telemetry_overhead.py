"""Telemetry on a real GPU: the sampler's own CPU cost, and whether its energy numbers hold.

    python -m benchmarks.harness.telemetry_overhead --out results/ [--idle-s 20] [--load-s 20]

1. Overhead: the sampler runs at 10 Hz (and --rates) on an idle GPU for --idle-s seconds; reported is
   the CPU time of its thread (time.thread_time) per second of wall time and per tick, and the CPU
   cost of each NVML field read.
2. Energy check: one window like a cell's (the load starts after the window does): bf16 matrix
   products on GPU 0 for --load-s seconds. Reported: idle vs load power, energy from the counter vs
   power integrated over time (both power readings NVML gives), and the summary the harness would store.

Needs NVML and (for part 2) PyTorch with CUDA; without NVML it says so and exits 1. Writes
overhead.json, energy.json and telemetry_load.csv under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from dflash_bench.telemetry import TelemetrySampler, gpu_inventory, summarize, trapezoid
from dflash_bench.telemetry import nvml


def overhead(seconds: float, rate_hz: float) -> dict:
    sampler = TelemetrySampler([0], interval_s=1.0 / rate_hz)
    with sampler.window():
        time.sleep(seconds)
    ticks = len(sampler.samples)
    return {
        "rate_hz": rate_hz,
        "wall_s": sampler.window_s,
        "samples": ticks,
        "achieved_hz": ticks / sampler.window_s,
        "thread_cpu_s": sampler.cpu_s,
        "cpu_pct_of_one_core": 100 * sampler.cpu_s / sampler.window_s,
        "cpu_ms_per_sample": 1000 * sampler.cpu_s / max(ticks - 2, 1),
    }


def load_window(seconds: float, out: Path) -> dict:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    idle = TelemetrySampler([0], interval_s=0.1)
    with idle.window():
        time.sleep(3.0)
    sampler = TelemetrySampler([0], interval_s=0.1)
    flops = 0
    with sampler.window():
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            for _ in range(20):
                a @ b
            flops += 20 * 2 * 8192**3
            torch.cuda.synchronize()
    sampler.write_csv(out / "telemetry_load.csv")
    ss = sampler.samples
    ts = [s.t_s for s in ss]
    e = summarize(ss, output_tokens=1_000_000, interval_s=0.1, window_s=sampler.window_s)
    counter_j = (ss[-1].energy_mj - ss[0].energy_mj) / 1000 if ss[0].energy_mj is not None else None
    avg_j = trapezoid(ts, [s.power_w for s in ss])
    inst = [s.power_instant_w for s in ss]
    inst_j = trapezoid(ts, inst) if all(p is not None for p in inst) else None
    idle_p = [s.power_w for s in idle.samples]
    return {
        "window_s": sampler.window_s,
        "samples": len(ss),
        "tflops": flops / sampler.window_s / 1e12,
        "idle_power_w_mean": sum(idle_p) / len(idle_p),
        "load_power_w_mean": (counter_j or avg_j) / sampler.window_s,
        "counter_j": counter_j,
        "integrated_power_usage_j": avg_j,
        "integrated_power_instant_j": inst_j,
        "diff_pct_power_usage": 100 * (avg_j - counter_j) / counter_j if counter_j else None,
        "diff_pct_power_instant": 100 * (inst_j - counter_j) / counter_j if counter_j and inst_j else None,
        "summary": e.summary_fields() | e.extra_fields(),
        "sampler_cpu_pct_under_load": 100 * sampler.cpu_s / sampler.window_s,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("telemetry-bench"))
    ap.add_argument("--idle-s", type=float, default=20.0)
    ap.add_argument("--load-s", type=float, default=20.0)
    ap.add_argument("--rates", default="10,50", help="sampling rates in Hz for the overhead part")
    args = ap.parse_args()
    probe = TelemetrySampler([0])
    if not probe.enabled:
        print(probe.status.message)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    inv = gpu_inventory([0])
    print(json.dumps(inv, indent=1))
    rates = [float(r) for r in args.rates.split(",")]
    rows = [overhead(args.idle_s if r == 10 else args.idle_s / 4, r) for r in rates]
    for r in rows:
        print(f"{r['rate_hz']:5.0f} Hz: {r['achieved_hz']:.1f} Hz achieved, sampler thread "
              f"{r['cpu_pct_of_one_core']:.3f}% of one core, {r['cpu_ms_per_sample']:.3f} ms CPU per sample")
    nvml.init()
    try:
        costs = nvml.Reader([0]).field_cost_ms()
    finally:
        nvml.shutdown()
    print("CPU ms per read:", ", ".join(f"{k} {v:.3f}" for k, v in costs.items()))
    (args.out / "overhead.json").write_text(json.dumps({"gpu": inv, "rows": rows, "field_cost_ms": costs}, indent=1))
    if args.load_s > 0:
        res = load_window(args.load_s, args.out)
        (args.out / "energy.json").write_text(json.dumps(res, indent=1))
        print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
