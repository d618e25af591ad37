"""`dflash-bench demo`, README's main job, end to end on the CPU: builtin engine, every offline suite, report."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_runs_every_suite_and_writes_the_report(tmp_path, data_dir):
    out = tmp_path / "reports"
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "demo", "--data-dir", str(data_dir), "--out", str(out),
                           "--concurrency", "1,2", "-n", "2", "--max-tokens", "8", "--repeats", "2"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("report: ")
    page = last.removeprefix("report: ")
    assert page.endswith("report.html") and open(page).read().startswith("<!DOCTYPE html>")
    (folder,) = [p for p in out.iterdir() if (p / "manifest.json").exists()]
    rows = list(csv.DictReader(open(folder / "results.csv")))
    suites = {r["suite"] for r in rows}
    assert suites == {"gsm8k", "math500", "humaneval", "mbpp", "mt-bench", "spec-bench"}  # speed-bench needs prepared data
    assert len(rows) == len(suites) * 2 * 2 * 2 and all(r["status"] == "complete" for r in rows)
    # the final table gives each speedup as the repeats' median with their lowest-highest
    assert "speedup over 2 repeats: median (lowest-highest)" in proc.stdout
    spreads = re.findall(r"(\d+\.\d\d)x \((\d+\.\d\d)-(\d+\.\d\d)\)", proc.stdout)
    assert len(spreads) == len(suites) * 2 and all(float(lo) <= float(mid) <= float(hi) for mid, lo, hi in spreads)
    # the builtin engine is lossless: every DFlash cell matches its AR cell token for token at temperature 0
    for r in rows:
        if r["mode"] == "dflash":
            assert r["lossless_exact_match_rate"] == "1.0", (r["cell_id"], r["lossless_status"])
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["servers"]["builtin-dflash"]["command"][:2] == ["dflash-bench", "serve"]
    assert {"--fast", "--cut-draft"} <= set(manifest["servers"]["builtin-dflash"]["command"])
