import csv
import json
import subprocess
import sys

import pytest

from dflash_bench.errors import UserError
from dflash_bench.store import (
    CellPlan,
    CellSummary,
    Manifest,
    RequestRecord,
    Stat,
    StoreError,
    SweepDir,
    atomic_write_text,
    cell_id,
)


def _manifest(*ids):
    return Manifest(sweep_id="s1", plan=[CellPlan(cell_id=i, engine="e", mode="ar", suite="gsm8k", concurrency=1) for i in ids])


def test_cell_id_format():
    assert cell_id("vllm", "dflash", "gsm8k", 8) == "vllm-dflash-gsm8k-c8"
    assert cell_id("vllm", "ar", "mt-bench", 32, repeat=2) == "vllm-ar-mt-bench-c32-r2"


def test_roundtrip_and_results_csv(tmp_path):
    sweep = SweepDir.create(tmp_path / "s", _manifest("a", "b"))
    recs = [RequestRecord(request_id="r0", prompt_id="p0", t_send=0.0, t_end=1.0, output_tokens=5, chunk_times=[0.5, 1.0], chunk_tokens=[1, 5])]
    sweep.write_requests("b", recs)
    assert sweep.read_requests("b") == recs
    assert not sweep.is_complete("b")
    sweep.write_summary(CellSummary(cell_id="b", engine="e", mode="ar", suite="gsm8k", concurrency=1, output_throughput=12.5,
                                    ttft_ms=Stat(n=1, mean=3.0, p50=3.0), acceptance_per_position=[0.9, 0.5]))
    sweep.write_summary(CellSummary(cell_id="a", engine="e", mode="ar", suite="gsm8k", concurrency=1, status="failed", failure_reason="server died"))
    assert sweep.is_complete("b")
    rows = list(csv.DictReader(open(sweep.write_results_csv())))
    assert [r["cell_id"] for r in rows] == ["a", "b"]  # plan order, not completion order
    assert rows[1]["ttft_ms_p50"] == "3.0" and rows[0]["ttft_ms_p50"] == ""
    assert json.loads(rows[1]["acceptance_per_position"]) == [0.9, 0.5]
    assert rows[0]["failure_reason"] == "server died"


def test_refuses_to_overwrite_existing_sweep(tmp_path):
    SweepDir.create(tmp_path, _manifest("a"))
    with pytest.raises(StoreError, match="--resume"):
        SweepDir.create(tmp_path, _manifest("a"))


@pytest.mark.parametrize("content, message", [
    (None, "no manifest.json"),
    ('{"schema_version": 1, "sweep_id": "x", "plan": [', "not valid JSON"),
    ('{"schema_version": 99, "sweep_id": "x"}', "schema version 99"),
    ('{"schema_version": 1, "plan": []}', "sweep_id"),
])
def test_bad_folders_give_one_clear_error(tmp_path, content, message):
    if content is not None:
        (tmp_path / "manifest.json").write_text(content)
    with pytest.raises(StoreError, match=message) as info:
        SweepDir.open(tmp_path)
    assert isinstance(info.value, UserError) and "\n" not in str(info.value)


def test_half_written_summary_is_reported(tmp_path):
    sweep = SweepDir.create(tmp_path, _manifest("a"))
    sweep.cell_dir("a").mkdir(parents=True)
    (sweep.cell_dir("a") / "summary.json").write_text('{"cell_id": "a", "eng')
    with pytest.raises(StoreError, match="half-written"):
        sweep.summaries()


def test_atomic_write_survives_a_kill(tmp_path):
    """A process killed in the middle of a stream of atomic writes leaves a whole old or new file."""
    target = tmp_path / "f.txt"
    atomic_write_text(target, "old" * 1000)
    code = (
        "import os, sys; from pathlib import Path; from dflash_bench.store import atomic_write_text\n"
        "i = 0\n"
        "while True:\n"
        "    atomic_write_text(Path(sys.argv[1]), str(i % 10) * 3_000_000); i += 1\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(target)])
    try:
        import time
        time.sleep(1.0)
    finally:
        proc.kill()
        proc.wait()
    text = target.read_text()
    assert text == "old" * 1000 or (len(text) == 3_000_000 and len(set(text)) == 1)
    assert [p.name for p in tmp_path.iterdir() if p.name != "f.txt" and not p.name.endswith(".tmp")] == []


def test_atomic_writes_have_ordinary_permissions(tmp_path):
    """mkstemp makes private files; written results must read like any other file (umask applies)."""
    from dflash_bench import store

    atomic_write_text(tmp_path / "a.json", "{}")
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o666 & ~store._UMASK
