"""Faults, played: the harness against bad servers and against itself, one row per case.

    python -m benchmarks.faults [--data-dir ../shared/datasets] [--only NAME,...]

Every case runs the real CLI (`python -m dflash_bench ...`) in child processes against the timing
emulator (`--engine emulator` / `dflash-bench emulate`) or a small bad server on 127.0.0.1
(benchmarks/fixtures/bad_servers.py), and prints one table: case, expected, observed, time to detect, left behind.
"Left behind" checks the server processes recorded in the manifest, temporary files of atomic writes,
and sweep folders that hold nothing measured.

The cases register themselves with `common.case` when their module is imported: lifecycle.py (sweeps raced,
resumed, interrupted and killed; servers that hang, die or misbehave), integrity.py (the folder's bytes, a full
disk, the server answering being the one launched) and measurement.py (one definition of tau, llama.cpp's
settings, energy of a short cell, connect time under a delayed accept).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.faults import integrity, lifecycle, measurement  # noqa: F401  (their cases register themselves)
from benchmarks.faults.common import CASES, REPO, Row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=Path(os.environ.get("DFLASH_BENCH_DATA", REPO.parent / "shared" / "datasets")))
    ap.add_argument("--only", default=None, help="comma-separated case names")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(CASES)
    rows = []
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                rows.append(CASES[name](Path(tmp), args.data_dir))
            except Exception as err:  # noqa: BLE001 - a case that breaks is a row, not the end of the table
                rows.append(Row(name, "-", f"case broke: {type(err).__name__}: {err}"[:150], held=False))
            r = rows[-1]
            r.observed = r.observed.replace(tmp, "$TMP").replace("|", "/")
            r.held = r.held and r.left == "nothing"
        print(f"[{'held' if r.held else 'BROKE'}] {r.case}", file=sys.stderr, flush=True)
    print("| case | expected | observed | time to detect | left behind | verdict |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        dt = "-" if r.detect_s is None else f"{r.detect_s:.2f} s"
        print(f"| {r.case} | {r.expected} | {r.observed} | {dt} | {r.left} | {'held' if r.held else 'BROKE'} |")
    sys.exit(0 if all(r.held for r in rows) else 1)


if __name__ == "__main__":
    main()
