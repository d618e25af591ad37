"""Helpers of the sweep tests: a sweep of the emulator through the CLI, its folder, its results, its servers gone."""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

from dflash_bench.launch import free_port
from launch_helpers import pid_alive

EMU = ["--engine-arg=--ttft-ms=5", "--engine-arg=--itl-ms=2", "--engine-arg=--acceptance-length=5",
       "--engine-arg=--seed=1"]


def sweep_argv(out: Path, *extra: str, suites: str = "gsm8k,mt-bench", conc: str = "1,4") -> list[str]:
    return [sys.executable, "-m", "dflash_bench", "sweep", "--model", "org/emulated", "--drafter", "org/emulated-dflash",
            "--engine", "emulator", "--suites", suites, "--concurrency", conc, "-n", "6", "--max-tokens", "48",
            "--port", str(free_port()), "--out", str(out), *EMU, *extra]


def only_sweep(out: Path) -> Path:
    (folder,) = [p for p in out.iterdir() if (p / "manifest.json").exists()]
    return folder


def results(folder: Path) -> dict[str, dict]:
    with open(folder / "results.csv") as f:
        return {row["cell_id"]: row for row in csv.DictReader(f)}


def assert_servers_gone(folder: Path) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    for info in manifest["servers"].values():
        if info.get("pid"):
            deadline = time.time() + 5
            while pid_alive(info["pid"]) and time.time() < deadline:
                time.sleep(0.1)
            assert not pid_alive(info["pid"]), f"server {info['pid']} left running"
