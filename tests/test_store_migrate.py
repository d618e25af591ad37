"""Folders and baselines of schema version 1, written by dflash-bench before the typed store.

tests/data/sweep_v1 was written by the code at main before this change (emulator, gsm8k, c1, 2 repeats,
--save-token-ids, then `dflash-bench quality`), and tests/data/baseline_v1.json by its `gate
--export-baseline`. Nothing in them was edited.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dflash_bench import gate
from dflash_bench.cli import app
from dflash_bench.store import SCHEMA_VERSION, SweepDir

DATA = Path(__file__).parent / "data"
V1 = DATA / "sweep_v1"
BASELINE_V1 = DATA / "baseline_v1.json"


@pytest.fixture
def v1(tmp_path) -> Path:
    return Path(shutil.copytree(V1, tmp_path / "v1"))


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_committed_folder_is_version_1():
    assert json.loads((V1 / "manifest.json").read_text())["schema_version"] == 1
    summary = json.loads(next(V1.glob("cells/*dflash*/summary.json")).read_text())
    assert {"lossless", "accuracy", "failures"} <= set(summary["extra"])


def test_a_v1_folder_reads_as_typed_v2_and_stays_unchanged(v1):
    before = _digest(v1)
    sweep = SweepDir.open(v1)
    manifest = sweep.read_manifest()
    assert manifest.settings is not None and manifest.settings.suites == ["gsm8k"] and manifest.settings.repeats == 2
    assert manifest.settings.runner == "process"  # not saved by v1: taken from the servers it recorded
    assert manifest.hardware.host is not None and manifest.hardware.host.cpu_count
    assert manifest.models.block_size and manifest.servers["emulator-dflash"].command
    dflash = [s for s in sweep.summaries() if s.mode == "dflash"]
    assert len(dflash) == 2
    for s in dflash:
        assert s.lossless is not None and s.lossless.n == 3 and s.lossless.exact_match_rate == 1.0
        assert s.accuracy is not None and s.accuracy.n == 3 and s.accuracy.vs_ar is not None
        assert s.failures == {} and s.clock_origin_monotonic_s is not None
    assert sweep.migration_note and "version 1" in sweep.migration_note
    assert _digest(v1) == before  # read, never written back


def test_migrate_writes_version_2_on_request(v1):
    old = [s.model_dump() for s in SweepDir.open(v1).summaries()]
    res = CliRunner().invoke(app, ["migrate", str(v1)])
    assert res.exit_code == 0 and f"rewritten as schema version {SCHEMA_VERSION}" in res.output
    again = SweepDir.open(v1)
    assert again.migration_note is None and [s.model_dump() for s in again.summaries()] == old
    assert json.loads((v1 / "manifest.json").read_text())["schema_version"] == SCHEMA_VERSION
    summary = json.loads(next(v1.glob("cells/*dflash*/summary.json")).read_text())
    assert "extra" not in summary and summary["lossless"]["n"] == 3
    assert "lossless_exact_match_rate" in (v1 / "results.csv").read_text().splitlines()[0]
    assert again.migrate() is False
    assert "nothing to do" in CliRunner().invoke(app, ["migrate", str(v1)]).output


def test_gate_and_report_work_on_a_v1_folder_and_a_v1_baseline(v1, tmp_path):
    res = CliRunner().invoke(app, ["gate", str(v1), "--baseline", str(BASELINE_V1)])
    assert res.exit_code == 0, res.output
    assert "PASS" in res.output and "schema version 1" in res.output
    result = gate.compare(gate.collect(v1), gate.load_baseline(BASELINE_V1))
    gated = {(c.cell, c.metric.name) for c in result.checks}
    assert ("emulator/dflash/gsm8k/c1", "exact_match_rate") in gated and ("emulator/dflash/gsm8k/c1", "speedup") in gated
    out = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["report", str(v1), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "speedup" in out.read_text().lower()


def test_a_v2_export_of_the_same_sweep_matches_the_v1_baseline(v1, tmp_path):
    """Migration changes the layout, not the numbers the gate compares."""
    v2 = gate.export_baseline(v1, tmp_path / "b.json")
    old = gate.load_baseline(BASELINE_V1)
    # the v1 baseline's metrics, unchanged; a v2 export adds what the SLO read-off needs of each cell
    assert [(c.key, c.repeats, {k: c.metrics[k] for k in o.metrics}) for c, o in zip(v2.cells, old.cells)] == \
        [(c.key, c.repeats, c.metrics) for c in old.cells]
    assert all({"tok_s_user_p50", "tpot_ms_p90"} <= set(c.metrics) for c in v2.cells if c.repeats)
    assert json.loads((tmp_path / "b.json").read_text())["schema_version"] == gate.BASELINE_VERSION


def test_resume_of_a_finished_v1_sweep_keeps_its_cells(v1, data_dir):
    """--resume reads the v1 manifest's settings (identity only) and finds every cell done: nothing is measured
    again, and the folder it writes back (manifest, results.csv) is version 2."""
    before = {p.name: (p / "requests.jsonl").read_bytes() for p in (v1 / "cells").iterdir()}
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--resume", str(v1), "--data-dir", str(data_dir)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {p.name: (p / "requests.jsonl").read_bytes() for p in (v1 / "cells").iterdir()} == before
    manifest = SweepDir.open(v1).read_manifest()
    assert manifest.schema_version == SCHEMA_VERSION and manifest.status == "complete"
    assert all(c.status == "complete" for c in manifest.plan)
