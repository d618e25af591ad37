"""Does the demo's headline repeat? `dflash-bench demo` run N times in a row, timed, each run's DFlash / AR
speedup per suite and concurrency read back from its sweep folder (the median over the run's repeats, with
their lowest and highest), and the range the runs give at concurrency 1.

    DFLASH_BENCH_DATA=../shared/datasets python -m benchmarks.harness.demo_repeats --runs 5 \
        --json benchmarks/results/demo_cpu_repeats.json

`--append` adds the runs to the file's earlier ones as another set (e.g. an hour later): the ranges then cover
every set, and `sets` says when each ran and at which commit.

Extra arguments after `--` go to every `dflash-bench demo` (e.g. `-- --repeats 2`). The machine's load average
is recorded before and after each run: on a shared box it says how busy the others kept it; so is the CPU time
the demo and its servers used, which the others' load does not inflate as it does the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=REPO)
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def one_run(extra: list[str], out: Path) -> dict:
    """One `dflash-bench demo`, timed; its headline rows from the sweep folder."""
    from dflash_bench import analysis

    load_before = os.getloadavg()[0]
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "demo", "--out", str(out), *extra],
                          capture_output=True, text=True)
    seconds = time.monotonic() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the demo and the servers it waited for
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"demo failed ({proc.returncode}): {proc.stderr[-3000:]}")
    (folder,) = [p for p in out.iterdir() if (p / "manifest.json").exists()]
    head = analysis.headline(analysis.cells(folder))
    cells = [{"suite": r["suite"], "concurrency": int(r["concurrency"]), "repeats": int(r["repeats"]),
              "speedup": round(float(r["speedup"]), 3), "speedup_min": round(float(r["speedup_min"]), 3),
              "speedup_max": round(float(r["speedup_max"]), 3), "ar_tok_s": round(float(r["ar_tok_s"]), 1),
              "dflash_tok_s": round(float(r["spec_tok_s"]), 1), "tau": round(float(r["tau"]), 2)}
             for _, r in head[head["mode"] == "dflash"].iterrows()]  # the demo runs AR against DFlash
    return {"started": started, "seconds": round(seconds, 1),
            "cpu_seconds": round(cpu, 1),
            "load_avg_1min_before": round(load_before, 2), "load_avg_1min_after": round(os.getloadavg()[0], 2),
            "cells": cells}


def c1_range(runs: list[dict]) -> dict[str, dict]:
    """Per suite, the concurrency-1 speedups of the runs: their lowest, highest, and the largest move from
    their middle (half the range over the midpoint), the ±% the headline moved between runs."""
    out: dict[str, dict] = {}
    suites = sorted({c["suite"] for r in runs for c in r["cells"] if c["concurrency"] == 1})
    for suite in suites:
        values = [c["speedup"] for r in runs for c in r["cells"] if c["suite"] == suite and c["concurrency"] == 1]
        lo, hi = min(values), max(values)
        out[suite] = {"per_run": values, "min": lo, "max": hi, "plus_minus_pct": round(100 * (hi - lo) / (hi + lo), 1)}
    return out


def merged(earlier: dict, new: dict) -> dict:
    """`new`'s runs added to `earlier`'s as another set: the ranges over every run, each set's commit, start and
    size in `sets` (a file written before sets were kept is its own first set)."""
    sets = earlier.get("sets") or [{"commit": earlier.get("commit"), "started": earlier["runs"][0]["started"],
                                    "runs": len(earlier["runs"]), "how": earlier.get("how")}]
    sets = sets + [{"commit": new.get("commit"), "started": new["runs"][0]["started"], "runs": len(new["runs"]),
                    "how": new.get("how")}]
    runs = earlier["runs"] + new["runs"]
    return {**new, "runs": runs, "sets": sets, "c1_speedup_range": c1_range(runs),
            "seconds_range": [min(r["seconds"] for r in runs), max(r["seconds"] for r in runs)],
            **({"note": new.get("note") or earlier.get("note")} if new.get("note") or earlier.get("note") else {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--note", default="", help="what the numbers need beside them (the machine's other load, ...)")
    ap.add_argument("--append", action="store_true", help="add the runs to --json's earlier ones as another set")
    ap.add_argument("--keep", type=Path, help="keep the runs' sweep folders and reports here (default: a temporary folder)")
    ap.add_argument("extra", nargs="*", help="arguments for every `dflash-bench demo` (after --)")
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="demo-repeats-") as tmp:
        if args.keep:
            tmp = str(args.keep)
        for i in range(args.runs):
            run = one_run(args.extra, Path(tmp) / f"run{i}")
            runs.append(run)
            c1 = {c["suite"]: f"{c['speedup']:.2f} ({c['speedup_min']:.2f}-{c['speedup_max']:.2f})"
                  for c in run["cells"] if c["concurrency"] == 1}
            print(f"run {i + 1}: {run['seconds']} s ({run['cpu_seconds']} s CPU), load {run['load_avg_1min_before']}->{run['load_avg_1min_after']}; "
                  f"c=1 speedup {c1}", flush=True)
    summary = c1_range(runs)
    for suite, s in summary.items():
        print(f"{suite:12s} c=1: {s['min']:.2f}-{s['max']:.2f}x over {len(runs)} runs (±{s['plus_minus_pct']}%)")
    result = {
        "command": shlex.join(["dflash-bench", "demo", *args.extra]),
        "how": f"python -m benchmarks.harness.demo_repeats --runs {args.runs}: the demo {args.runs} times in a row after the install, "
               "datasets through DFLASH_BENCH_DATA (the offline copies)",
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "platform": platform.platform(terse=True)},
        "commit": commit(), **({"note": args.note} if args.note else {}), "runs": runs, "c1_speedup_range": summary,
        "seconds_range": [min(r["seconds"] for r in runs), max(r["seconds"] for r in runs)],
    }
    if args.json:
        if args.append and args.json.exists():
            result = merged(json.loads(args.json.read_text()), result)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
