import csv
import os
import subprocess
import sys

import pytest

from dflash_bench.errors import UserError
from dflash_bench.store import folder
from dflash_bench.store import (
    RESULTS_COLUMNS,
    AccuracySummary,
    CellKey,
    CellPlan,
    CellSummary,
    LosslessSummary,
    Manifest,
    PairedDiff,
    RequestRecord,
    Stat,
    StoreError,
    SweepDir,
    atomic_write_text,
    cell_id,
    read_results_csv,
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
    assert rows[1]["acceptance_per_position"] == "0.9;0.5"  # numbers, never JSON, inside a CSV cell
    assert rows[0]["failure_reason"] == "server died"
    typed = read_results_csv(tmp_path / "s" / "results.csv")
    assert typed[1].acceptance_per_position == [0.9, 0.5] and typed[1].ttft_ms_p50 == 3.0 and typed[0].ttft_ms_p50 is None


def test_results_csv_has_one_declared_header_whatever_the_cells_hold(tmp_path):
    """The header follows from the schema, not from the data: a cell with lossless and accuracy results and a
    bare failed cell give the same columns, and nested results become flat columns."""
    bare = SweepDir.create(tmp_path / "bare", _manifest("a"))
    bare.write_summary(CellSummary(cell_id="a", engine="e", mode="ar", suite="gsm8k", concurrency=1, status="failed"))
    full = SweepDir.create(tmp_path / "full", _manifest("a"))
    full.write_summary(CellSummary(
        cell_id="a", engine="e", mode="dflash", suite="gsm8k", concurrency=1, failures={"HTTP 500": 2, "timeout": 1},
        lossless=LosslessSummary(n=4, identical=3, exact_match_rate=0.75, divergences={"near_tie": 1}),
        accuracy=AccuracySummary(n=4, correct=2, accuracy=0.5, vs_ar=PairedDiff(
            n=4, ar_accuracy=0.75, dflash_accuracy=0.5, ar_minus_dflash=0.25, ci_low=-0.1, ci_high=0.6,
            both=2, only_ar=1, only_dflash=0, neither=1))))
    headers = [next(csv.reader(open(s.write_results_csv()))) for s in (bare, full)]
    assert headers[0] == headers[1] == list(RESULTS_COLUMNS)
    (row,) = csv.DictReader(open(full.path / "results.csv"))
    assert row["lossless_exact_match_rate"] == "0.75" and row["accuracy_vs_ar_ar_minus_dflash"] == "0.25"
    assert row["failures"] == "HTTP 500: 2; timeout: 1"
    assert not any(v.startswith(("{", "[")) for v in row.values())


def test_cell_key_is_the_one_identity():
    plan = CellPlan(engine="vllm", mode="dflash", suite="gsm8k", concurrency=8, repeat=2)
    summary = CellSummary(cell_id="elsewhere", engine="vllm", mode="dflash", suite="gsm8k", concurrency=8, repeat=2)
    assert plan.cell_id == cell_id("vllm", "dflash", "gsm8k", 8, 2) == "vllm-dflash-gsm8k-c8-r2"
    assert summary.cell_id == "elsewhere" and summary.key == plan.key  # the folder name is not the identity
    assert {plan.key: 1}[summary.key] == 1
    ar = summary.model_copy(update={"mode": "ar"})
    assert ar.pair_key() == summary.pair_key() and ar.key != summary.key
    assert plan.sample_of() == CellKey(engine="vllm", mode="dflash", suite="gsm8k", concurrency=8)
    assert plan.sample_of().name == "vllm/dflash/gsm8k/c8"


def test_refuses_to_overwrite_existing_sweep(tmp_path):
    SweepDir.create(tmp_path, _manifest("a"))
    with pytest.raises(StoreError, match="--resume"):
        SweepDir.create(tmp_path, _manifest("a"))


@pytest.mark.parametrize("content, message", [
    (None, "no manifest.json"),
    ('{"schema_version": 1, "sweep_id": "x", "plan": [', "not valid JSON"),
    ('{"schema_version": 99, "sweep_id": "x"}', "schema version 99"),
    ('{"schema_version": 2, "plan": []}', "sweep_id"),
    ('{"schema_version": 1, "plan": []}', "sweep_id"),
    ('{"schema_version": 2, "sweep_id": "x", "settings": {"model": "m"}}', "settings.suites"),
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


FAULTS = ["mid-write", "after-write", "before-fsync", "after-fsync", "before-rename"]


def _inject(monkeypatch, point: str, exc: type[BaseException]) -> None:
    """Make an atomic write stop at `point` by raising `exc` there (a disk error, or a signal's exception)."""
    real_write_all, real_fsync, real_replace = folder._write_all, os.fsync, os.replace

    def write_all(fd, data):
        if point == "mid-write":
            real_write_all(fd, data[: len(data) // 2])
            raise exc("disk full")
        real_write_all(fd, data)
        if point == "after-write":
            raise exc("disk full")

    def fsync(fd):
        if point == "before-fsync":
            raise exc("I/O error")
        real_fsync(fd)
        if point == "after-fsync":
            raise exc("I/O error")

    def replace(src, dst):
        if point == "before-rename":
            raise exc("read-only file system")
        real_replace(src, dst)

    monkeypatch.setattr(folder, "_write_all", write_all)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)


@pytest.mark.parametrize("exc", [OSError, KeyboardInterrupt])
@pytest.mark.parametrize("point", FAULTS)
def test_a_failed_atomic_write_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch, point, exc):
    target = tmp_path / "f.txt"
    atomic_write_text(target, "old" * 1000)
    _inject(monkeypatch, point, exc)
    with pytest.raises(StoreError if exc is OSError else exc):  # an OSError is named as a StoreError
        atomic_write_text(target, "new" * 100_000)
    monkeypatch.undo()
    assert target.read_text() == "old" * 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


@pytest.mark.parametrize("exc", [OSError, KeyboardInterrupt])
@pytest.mark.parametrize("point", FAULTS)
def test_a_failed_first_write_leaves_no_file_at_all(tmp_path, monkeypatch, point, exc):
    _inject(monkeypatch, point, exc)
    with pytest.raises(StoreError if exc is OSError else exc):
        atomic_write_text(tmp_path / "f.txt", "new")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("point", FAULTS)
def test_a_kill_at_any_point_leaves_the_old_file_or_the_new_one(tmp_path, point):
    """A kill runs no cleanup: the process exits (os._exit, as SIGKILL would) at the fault point. The target
    is then whole, old before the rename and new after it; only a hidden temp file may stay behind."""
    target = tmp_path / "f.txt"
    atomic_write_text(target, "old" * 1000)
    code = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from dflash_bench.store import atomic_write_text, folder\n"
        "point = sys.argv[2]\n"
        "real_write_all, real_fsync, real_replace = folder._write_all, os.fsync, os.replace\n"
        "def write_all(fd, data):\n"
        "    real_write_all(fd, data[: len(data) // 2] if point == 'mid-write' else data)\n"
        "    if point in ('mid-write', 'after-write'): os._exit(9)\n"
        "def fsync(fd):\n"
        "    if point == 'before-fsync': os._exit(9)\n"
        "    real_fsync(fd)\n"
        "    if point == 'after-fsync': os._exit(9)\n"
        "def replace(src, dst):\n"
        "    if point == 'before-rename': os._exit(9)\n"
        "    real_replace(src, dst)\n"
        "    if point == 'after-rename': os._exit(9)\n"
        "folder._write_all, os.fsync, os.replace = write_all, fsync, replace\n"
        "atomic_write_text(Path(sys.argv[1]), 'new' * 1_000_000)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(target), point], capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr  # it died at the fault point, not earlier
    assert target.read_text() == "old" * 1000
    assert all(p.name.startswith(".f.txt.") and p.name.endswith(".tmp") for p in tmp_path.iterdir() if p != target)


def test_a_kill_after_the_rename_leaves_the_new_file(tmp_path):
    target = tmp_path / "f.txt"
    atomic_write_text(target, "old")
    code = ("import os, sys\nfrom pathlib import Path\nfrom dflash_bench.store import atomic_write_text\n"
            "real = os.replace\n"
            "def replace(src, dst):\n    real(src, dst)\n    os._exit(9)\n"
            "os.replace = replace\natomic_write_text(Path(sys.argv[1]), 'new' * 1_000_000)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr
    assert target.read_text() == "new" * 1_000_000
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_atomic_writes_have_ordinary_permissions(tmp_path):
    """mkstemp makes private files; written results must read like any other file (umask applies)."""
    mask = os.umask(0)
    os.umask(mask)
    atomic_write_text(tmp_path / "a.json", "{}")
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o666 & ~mask
