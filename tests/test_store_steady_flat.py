"""A steady-stream folder written before a cell's settings held the steady stream as one object.

tests/data/sweep_steady_flat was written by the code at main before that change (emulator, gsm8k, c2, -n 2,
--max-tokens 8, --steady-requests 3); its summaries keep `settings.steady_requests` and `settings.steady_ramp`
flat. Only the command line's first word was edited (the path it ran from, now `dflash-bench`).
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

from dflash_bench.report import build_report
from dflash_bench.store import SteadyPlan, SweepDir, read_results_csv

FLAT = Path(__file__).parent / "data" / "sweep_steady_flat"
CELLS = ("emulator-ar-gsm8k-c2", "emulator-dflash-gsm8k-c2")


def test_the_committed_folder_keeps_the_flat_settings():
    for cid in CELLS:
        settings = json.loads((FLAT / "cells" / cid / "summary.json").read_text())["settings"]
        assert (settings["steady_requests"], settings["steady_ramp"]) == (3, 2) and "steady" not in settings


def test_flat_steady_settings_are_read_as_one_steady_object(tmp_path: Path):
    sweep = SweepDir.open(shutil.copytree(FLAT, tmp_path / "s"))
    for cid in CELLS:
        s = sweep.read_summary(cid)
        assert s.settings.steady == SteadyPlan(ramp=2, requests=3)
        assert s.steady is not None and (s.steady.ramp, s.steady.requests) == (2, 3)
        dumped = s.settings.model_dump()
        assert "steady_requests" not in dumped and dumped["steady"] == {"ramp": 2, "requests": 3}
    # results.csv rebuilt from them keeps the columns it had, and reads back typed
    sweep.write_results_csv()
    rows = list(csv.DictReader(open(sweep.path / "results.csv")))
    assert [(r["settings_steady_requests"], r["settings_steady_ramp"]) for r in rows] == [("3", "2")] * 2
    assert {r.settings_steady_requests for r in read_results_csv(sweep.path / "results.csv")} == {3}  # type: ignore[attr-defined]
    # the results.csv main wrote before the change reads with this version's schema
    assert len(read_results_csv(FLAT / "results.csv")) == 2
    # and the report marks both cells with their window
    page = build_report([sweep.path]).read_text()
    assert "Steady stream in 2 cell(s)" in page and "a window of 3 completions after a ramp-up of 2" in page


def test_resume_of_a_finished_flat_steady_sweep_keeps_its_cells(tmp_path: Path, data_dir: Path):
    folder = Path(shutil.copytree(FLAT, tmp_path / "s"))
    before = {cid: (folder / "cells" / cid / "requests.jsonl").read_bytes() for cid in CELLS}
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--resume", str(folder), "--data-dir",
                           str(data_dir)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {cid: (folder / "cells" / cid / "requests.jsonl").read_bytes() for cid in CELLS} == before
    manifest = SweepDir.open(folder).read_manifest()
    assert manifest.status == "complete" and all(c.status == "complete" for c in manifest.plan)
    assert all(SweepDir.open(folder).read_summary(cid).settings.steady == SteadyPlan(ramp=2, requests=3)
               for cid in CELLS)
