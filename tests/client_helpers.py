"""Helpers of the load generator's tests: a cell's folder in a sweep folder under tmp_path, its measured records."""

from __future__ import annotations

from pathlib import Path

from dflash_bench.store import SweepDir


def cell(tmp_path: Path, name: str = "c") -> Path:
    return tmp_path / "sw" / "cells" / name


def measured(tmp_path: Path, name: str = "c"):
    return [r for r in SweepDir(tmp_path / "sw").read_requests(name) if not r.warmup]
