"""How long `dflash-bench report` takes, and how big the page is, on a full-size planted sweep.

    python -m benchmarks.harness.report_build [--suites 7] [--concurrency 1,2,4,8,16,32] [--repeats 3] [--gpus 8]

Builds a sweep folder with planted values (tests/report_sweeps.py: 10 Hz telemetry of every GPU for
4 s per cell) in a temporary folder, then times build_report on it and prints the sizes.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks.fixtures.report_sweeps import make_sweep

from dflash_bench.report import build_report

SUITES = ["gsm8k", "math500", "humaneval", "mbpp", "mt-bench", "alpaca", "speed-bench"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suites", type=int, default=7)
    ap.add_argument("--concurrency", default="1,2,4,8,16,32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        path = make_sweep(Path(tmp) / "big", suites=tuple(SUITES[: args.suites]), repeats=args.repeats, gpus=args.gpus,
                          concurrency=tuple(int(c) for c in args.concurrency.split(",")), lossless=True)
        t1 = time.perf_counter()
        page = build_report([path])
        t2 = time.perf_counter()
        figs = sorted((page.parent / "figures").glob("*.png"))
        cells = len(list((path / "cells").iterdir()))
        print(f"cells {cells}; planting {t1 - t0:.1f} s; report {t2 - t1:.1f} s; page {page.stat().st_size / 1e6:.2f} MB; "
              f"{len(figs)} figures, {sum(f.stat().st_size for f in figs) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
