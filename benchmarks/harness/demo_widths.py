"""Which fixed verify width the demo's DFlash server takes: the demo's sweep at each width, one after another.

    python -m benchmarks.harness.demo_widths --widths 4,6,8,16 --data-dir DATA --work W \
        --out benchmarks/results/demo_widths_cpu.json

Each width: `dflash-bench sweep` with the demo's settings (benchmarks/harness/gate_reruns.py `demo_argv`) but the
DFlash server at `--verify-width W`, on the suites given (3 by default, 2 repeats, to keep it short). Per suite and
concurrency the file keeps DFlash / AR output tok/s (the median of the repeats' ratios, dflash_bench.analysis)
and every DFlash cell's τ; `python -m benchmarks.tables` renders it (docs/results/demo.md). `--reuse` reads the
sweeps already in W (W/w<N>) instead of running them again.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from benchmarks.harness.demo_repeats import commit, cpu_name
from benchmarks.harness.gate_reruns import demo_argv, kept, keep, sweep_run
from dflash_bench.launch import free_port
from dflash_bench.store import SweepDir, atomic_write_text


def measured(folder: Path) -> list[dict[str, Any]]:
    """Per suite and concurrency: the speedup (median of the repeats', analysis.headline) and the DFlash cells' τ."""
    from dflash_bench import analysis

    taus: dict[tuple[str, int], list[float]] = {}
    for s in SweepDir.open(folder).summaries():
        if s.mode == "dflash" and s.acceptance_length is not None:
            taus.setdefault((s.suite, s.concurrency), []).append(round(s.acceptance_length, 4))
    head = analysis.headline(analysis.cells(folder))
    return [{"suite": r["suite"], "concurrency": int(r["concurrency"]), "speedup": round(float(r["speedup"]), 3),
             "taus": sorted(taus.get((r["suite"], int(r["concurrency"])), []))} for _, r in head.iterrows()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", default="4,6,8,16")
    ap.add_argument("--suites", default="gsm8k,humaneval,mt-bench")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reuse", action="store_true")
    ap.add_argument("extra", nargs="*", help="After --: options for every sweep (-n, --max-tokens, -c), to make a "
                    "smaller run (the tests do).")
    args = ap.parse_args()
    at = commit()  # the code measured (a commit made meanwhile is not)
    rows = []
    for width in args.widths.split(","):
        out = args.work.resolve() / f"w{width}"
        record = kept(out, args.reuse)
        if record is None:
            argv = demo_argv(args.data_dir, args.suites.split(","), width=width, port=free_port())
            record = keep(out, sweep_run(out, argv + ["--repeats", str(args.repeats), *args.extra]))
        folder = next(p for p in out.iterdir() if (p / "manifest.json").exists())
        rows.append({"width": int(width), **{k: record[k] for k in ("started", "seconds", "load_avg_1min_before",
                                                                  "load_avg_1min_after")}, "cells": measured(folder)})
        print(f"width {width}: {record['seconds']} s", flush=True)
    result = {"command": f"python -m benchmarks.harness.demo_widths --widths {args.widths} --suites {args.suites} "
                         f"--repeats {args.repeats} --data-dir DATA --work W --out F",
              "machine": {"cpu": f"{cpu_name()}, shared with other jobs", "cores": len(os.sched_getaffinity(0))},
              "commit": at, "sweep": "dflash-bench sweep " + " ".join(
                  demo_argv(Path("DATA"), args.suites.split(","), width="W", record=True)) + f" --repeats {args.repeats}", "rows": rows}
    atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
