"""Does a rerun of the same code pass its own gate, and does a real regression still fail?

    DFLASH_BENCH_DATA=DATA python -m benchmarks.harness.gate_reruns --pairs 5 --tries 5 \
        --out benchmarks/results/gate_reruns_cpu.json

Two machines' worth of sweeps, all on this one:

- the demo's sweep (what `dflash-bench demo` runs: the builtin engine on the embedded pair, `serve --fast
  --cut-draft` on the CPU, both servers up together, concurrency 1 interleaved), made small (`--suites`, `-n`,
  `--max-tokens`, `--repeats` say how small): 2 x PAIRS runs of the same code, then TRIES runs whose DFlash
  server verifies one token a step (`--verify-width 1`: no draft is ever checked, a real regression);
- the emulator (an instrument with known step times): 3 runs to measure its noise, TRIES reruns, and TRIES runs
  of a server 30% slower (its time to first token and inter-token time x 1.3).

Each run's baseline is exported with `gate --export-baseline --noise-from`, the noise measured over other runs of
the same code (never the run it then gates). Pair i is gated both ways: run B against run A's baseline (its
noise from every other demo run but A and B) and A against B's. Each width-1 run is gated against pair i's A,
each emulator run against the first calibration run's baseline (noise from the other two). The file keeps every
gate's checks and failures; `python -m benchmarks.tables` renders it (docs/results/harness.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.demo_repeats import cpu_name
from dflash_bench import gate
from dflash_bench.gate.noise import export_with_noise
from dflash_bench.launch import free_port
from dflash_bench.store import atomic_write_text

REPO = Path(__file__).resolve().parents[2]
PAIR = REPO / "dflash_bench" / "assets" / "default_pair"
DEMO_ENGINE_ARGS = ["--engine-arg=--fast", "--engine-arg=--cut-draft", "--engine-arg=--device=cpu"]
EMU_TTFT_MS, EMU_ITL_MS, SLOWER = 20.0, 10.0, 1.3


def sweep(out: Path, argv: list[str]) -> tuple[Path, float]:
    """One `dflash-bench sweep` into `out` (a fresh folder): its sweep folder and seconds."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", *argv, "--port", str(free_port()),
                           "--out", str(out)], capture_output=True, text=True, timeout=1200)
    folders = [p for p in out.iterdir() if (p / "manifest.json").exists()]
    if len(folders) != 1:
        sys.exit(f"sweep into {out} wrote no sweep folder (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return folders[0], time.monotonic() - t0


def demo_argv(args: argparse.Namespace, *extra: str) -> list[str]:
    return ["--model", str(PAIR / "target"), "--drafter", str(PAIR / "drafter"), "--engine", "builtin",
            "--runner", "process", *DEMO_ENGINE_ARGS, "--paired", "--interleave", "--save-token-ids",
            "--suites", args.suites, "-c", "1", "-n", str(args.num_prompts), "--max-tokens", str(args.max_tokens),
            "--repeats", str(args.repeats), "--data-dir", str(args.data_dir), *extra]


def emulator_argv(args: argparse.Namespace, slower: float = 1.0) -> list[str]:
    return ["--model", "org/emulated", "--drafter", "org/emulated-dflash", "--engine", "emulator",
            "--suites", "gsm8k", "-c", "1,4", "-n", "4", "--max-tokens", "32", "--repeats", str(args.repeats),
            "--data-dir", str(args.data_dir), f"--engine-arg=--ttft-ms={EMU_TTFT_MS * slower:g}",
            f"--engine-arg=--itl-ms={EMU_ITL_MS * slower:g}", "--engine-arg=--acceptance-length=5",
            "--engine-arg=--seed=1"]


def judged(case: str, index: int, sweep_dir: Path, base: Path, others: list[Path], work: Path) -> dict[str, Any]:
    """`sweep_dir` gated against `base`'s baseline carrying the noise of `others`."""
    out = work / f"baseline-{case}-{index}-{base.name}.json"
    export_with_noise(base, out, others)
    result = gate.gate(sweep_dir, out)
    return {"case": case, "try": index, "sweep": sweep_dir.name, "baseline": base.name, "noise_runs": len(others) + 1,
            "checks": len(result.checks), "failures": len(result.failures),
            "failed": [f"{c.cell} {c.metric.label}: {c.note or ''} change {c.change}" for c in result.failures][:12]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--tries", type=int, default=5)
    ap.add_argument("--suites", default="gsm8k,humaneval")
    ap.add_argument("-n", "--num-prompts", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True, help="Where the sweeps and baselines go.")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    work = args.work
    runs: list[dict[str, Any]] = []

    def run(name: str, argv: list[str]) -> Path:
        folder, seconds = sweep(work / name, argv)
        runs.append({"name": name, "sweep": folder.name, "seconds": round(seconds, 1)})
        print(f"{name}: {seconds:.0f} s", flush=True)
        return folder

    demo = [run(f"demo-{i}", demo_argv(args)) for i in range(2 * args.pairs)]
    width1 = [run(f"width1-{t}", demo_argv(args, "--engine-arg=--verify-width=1")) for t in range(args.tries)]
    calib = [run(f"emu-{i}", emulator_argv(args)) for i in range(3)]
    emu_reruns = [run(f"emu-rerun-{t}", emulator_argv(args)) for t in range(args.tries)]
    emu_slow = [run(f"emu-slow-{t}", emulator_argv(args, SLOWER)) for t in range(args.tries)]

    gates = []
    for i in range(args.pairs):
        a, b = demo[2 * i], demo[2 * i + 1]
        others = [d for d in demo if d not in (a, b)]
        gates.append(judged("demo rerun", i, b, a, others, work))
        gates.append(judged("demo rerun", i, a, b, others, work))
    for t, w in enumerate(width1):
        a = demo[2 * (t % args.pairs)]
        gates.append(judged("DFlash at width 1", t, w, a, [d for d in demo if d != a], work))
    for t, r in enumerate(emu_reruns):
        gates.append(judged("emulator rerun", t, r, calib[0], calib[1:], work))
    for t, s in enumerate(emu_slow):
        gates.append(judged(f"emulator {round(100 * (SLOWER - 1))}% slower", t, s, calib[0], calib[1:], work))

    result = {"machine": {"cpu": f"{cpu_name()}, shared with other jobs", "cores": len(os.sched_getaffinity(0))},
              "command": "python -m benchmarks.harness.gate_reruns " + " ".join(sys.argv[1:]),
              "settings": {k: str(v) for k, v in vars(args).items() if k not in ("work", "out")},
              "demo_sweep": "dflash-bench sweep " + " ".join(demo_argv(args)), "runs": runs, "gates": gates}
    atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
    for g in gates:
        print(f"{g['case']} #{g['try']}: {g['failures']} of {g['checks']} checks failed")


if __name__ == "__main__":
    main()
