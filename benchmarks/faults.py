"""Faults, played: the harness against bad servers and against itself, one row per case.

    python -m benchmarks.faults [--data-dir ../shared/datasets] [--only NAME,...]

Every case runs the real CLI (`python -m dflash_bench ...`) in child processes against the timing
emulator (`--engine emulator` / `dflash-bench emulate`) or a small bad server on 127.0.0.1
(tests/bad_servers.py), and prints one table: case, expected, observed, time to detect, left behind.
"Left behind" checks the server processes recorded in the manifest, temporary files of atomic writes,
and sweep folders that hold nothing measured.

This module is the harness (the Row, the case registry, the helpers, the table); the cases live in
faults_cases.py, faults_trust.py and faults_trust2.py, each registering its own with `case`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dflash_bench.launch import free_port

REPO = Path(__file__).resolve().parents[1]

sys.modules.setdefault("benchmarks.faults", sys.modules[__name__])  # one module, run with -m or imported (faults_cases)
PY = [sys.executable, "-m", "dflash_bench"]
EMU = ["--engine-arg=--ttft-ms=5", "--engine-arg=--itl-ms=2", "--engine-arg=--acceptance-length=5"]


@dataclass
class Row:
    case: str
    expected: str
    observed: str
    detect_s: float | None = None
    left: str = "nothing"
    held: bool = True


CASES: dict[str, Callable[[Path, Path], Row]] = {}


def case(fn: Callable[[Path, Path], Row]) -> Callable[[Path, Path], Row]:
    CASES[fn.__name__] = fn
    return fn


# ---------------------------------------------------------------- helpers


def sweep_argv(out: Path, data: Path, *extra: str, n: int = 6, conc: str = "1", suites: str = "gsm8k") -> list[str]:
    return [*PY, "sweep", "--model", "org/emulated", "--drafter", "org/emulated-dflash", "--engine", "emulator",
            "--suites", suites, "--concurrency", conc, "-n", str(n), "--max-tokens", "32", "--port", str(free_port()),
            "--out", str(out), "--data-dir", str(data), *EMU, *extra]


def run_argv(url: str, out: Path, data: Path, *extra: str) -> list[str]:
    return [*PY, "run", "--url", url, "--suite", "gsm8k", "-n", "4", "--max-tokens", "16", "--out", str(out),
            "--data-dir", str(data), *extra]


def sh(argv: list[str], timeout: float = 300) -> tuple[subprocess.CompletedProcess, float]:
    t = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - t


def folders(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.is_dir()) if out.exists() else []


def first_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[0][:150] if lines else ""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().split()
    except OSError:
        return False
    return stat[2] != "Z"


def left_behind(out: Path) -> str:
    """Server processes of the manifests still running, half-written temporary files, empty sweep folders."""
    found = []
    for folder in folders(out):
        manifest = folder / "manifest.json"
        if not manifest.exists():
            found.append(f"folder without manifest {folder.name}")
            continue
        m = json.loads(manifest.read_text())
        deadline = time.monotonic() + 5
        for info in m.get("servers", {}).values():
            pid = info.get("pid")
            while pid and alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if pid and alive(pid):
                found.append(f"server pid {pid}")
        found += [f"tmp file {p.name}" for p in folder.rglob("*.tmp")]
    return ", ".join(found) or "nothing"


def wait_for(pred: Callable[[], bool], timeout: float = 120, step: float = 0.01) -> float:
    t = time.monotonic()
    while not pred():
        if time.monotonic() - t > timeout:
            raise TimeoutError("condition not reached")
        time.sleep(step)
    return time.monotonic()


def summaries(folder: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in folder.glob("cells/*/summary.json")}


# ---------------------------------------------------------------- the cases (each module registers its own)

from benchmarks import faults_cases  # noqa: E402,F401  (issue 22's and 19's cases, and those that held, register themselves)
from benchmarks import faults_trust  # noqa: E402,F401  (issue 43's cases register themselves)
from benchmarks import faults_trust2  # noqa: E402,F401  (issue 43's cases 2, 5, 6, 7)


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
