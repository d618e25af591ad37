"""How long `dflash-bench report` takes, how much memory and how big the page and its figures are, on a full-size
planted sweep.

    python -m benchmarks.harness.report_build [--suites 7] [--concurrency 1,2,4,8,16,32] [--repeats 3] [--gpus 8]
    python -m benchmarks.harness.report_build --suites 1 --concurrency 1-1000 --repeats 1   # 2,000 cells

Builds a sweep folder with planted values (benchmarks/fixtures/report_sweeps.py: 10 Hz telemetry of every GPU for
4 s per cell) in a temporary folder, then runs `dflash-bench report` on it in a process of its own and prints its
wall and CPU seconds, its peak memory, the page's size, the largest figure in pixels and every warning it printed.
"""

from __future__ import annotations

import argparse
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.fixtures.report_sweeps import make_sweep

SUITES = ["gsm8k", "math500", "humaneval", "mbpp", "mt-bench", "alpaca", "speed-bench"]


def concurrencies(text: str) -> tuple[int, ...]:
    """"1,2,4" or a range "1-1000" (every concurrency in it)."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi) + 1) if hi else [int(lo)]
    return tuple(out)


def png_size(path: Path) -> tuple[int, int]:
    width, height = struct.unpack(">II", path.read_bytes()[16:24])
    return width, height


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suites", type=int, default=7)
    ap.add_argument("--concurrency", default="1,2,4,8,16,32", help="a list, or a range such as 1-1000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        path = make_sweep(Path(tmp) / "big", suites=tuple(SUITES[: args.suites]), repeats=args.repeats, gpus=args.gpus,
                          concurrency=concurrencies(args.concurrency), lossless=True)
        t1 = time.perf_counter()
        page = Path(tmp) / "site" / "report.html"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run([sys.executable, "-m", "dflash_bench", "report", str(path), "--out", str(page)],
                              capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "default"})
        t2 = time.perf_counter()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            sys.exit(f"report failed ({proc.returncode}): {proc.stderr[-2000:]}")
        figs = sorted((page.parent / "figures").glob("*.png"))
        sizes = {f.stem: png_size(f) for f in figs}
        widest = max(sizes.items(), key=lambda kv: kv[1][0] * kv[1][1])
        cells = len(list((path / "cells").iterdir()))
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        warnings = [line for line in proc.stderr.splitlines() if "Warning" in line]
        print(f"cells {cells}; planting {t1 - t0:.1f} s; report {t2 - t1:.1f} s wall, {cpu:.1f} s CPU, peak "
              f"{after.ru_maxrss / 1024:.0f} MB; page {page.stat().st_size / 1e6:.2f} MB; {len(figs)} figures, "
              f"{sum(f.stat().st_size for f in figs) / 1e6:.2f} MB, the largest {widest[0]} {widest[1][0]} x "
              f"{widest[1][1]} px; {len(warnings)} warnings; load average {os.getloadavg()[0]:.1f}")
        for line in warnings:
            print(f"  {line}")


if __name__ == "__main__":
    main()
