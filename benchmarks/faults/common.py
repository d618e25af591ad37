"""What every fault case shares: the Row it returns, the `case` registry, and the helpers that run the real CLI
and look at what it left behind. The cases live in lifecycle.py, integrity.py and measurement.py; __main__.py
plays them (`python -m benchmarks.faults`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dflash_bench.launch import free_port

REPO = Path(__file__).resolve().parents[2]

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
