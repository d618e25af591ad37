"""Any bytes in a sweep folder's files: one sentence naming the file from report, gate, migrate and --resume;
a damaged cell measured again on resume; a full disk named. Real sweeps against the emulator."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.fixtures.tampering import KINDS, damaged
from dflash_bench.launch import free_port

EMU = ["--engine-arg=--ttft-ms=2", "--engine-arg=--itl-ms=1", "--engine-arg=--acceptance-length=4"]
AR, DF = "emulator-ar-gsm8k-c1", "emulator-dflash-gsm8k-c1"


def sweep_argv(out: Path, data_dir: Path) -> list[str]:
    return [sys.executable, "-m", "dflash_bench", "sweep", "--model", "org/emulated", "--drafter", "org/emulated-dflash",
            "--engine", "emulator", "--runner", "process", "--suites", "gsm8k", "--concurrency", "1", "-n", "4",
            "--max-tokens", "16", "--port", str(free_port()), "--out", str(out), "--data-dir", str(data_dir), *EMU]


@pytest.fixture(scope="module")
def made(tmp_path_factory, data_dir) -> Path:
    out = tmp_path_factory.mktemp("bytes") / "out"
    proc = subprocess.run(sweep_argv(out, data_dir), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = [p for p in out.iterdir() if (p / "manifest.json").exists()]
    return folder


def cli(capsys, *args: str) -> tuple[int, str]:
    """The console entry point in process: its exit code and stderr (an exception other than SystemExit fails)."""
    from dflash_bench.cli import main

    argv = sys.argv
    sys.argv = ["dflash-bench", *args]
    try:
        main()
        code = 0
    except SystemExit as err:
        code = int(err.code or 0)
    finally:
        sys.argv = argv
    return code, capsys.readouterr().err


@pytest.mark.parametrize("file", ["manifest.json", f"cells/{AR}/summary.json", f"cells/{DF}/requests.jsonl"])
@pytest.mark.parametrize("kind", KINDS)
def test_report_gate_and_migrate_name_the_damaged_file_in_one_sentence(made, tmp_path, capsys, file, kind):
    folder = tmp_path / "s"
    shutil.copytree(made, folder)
    (folder / file).write_bytes(damaged((made / file).read_bytes(), kind))
    for args in (["report", str(folder)], ["gate", str(folder), "-b", str(made)], ["migrate", str(folder)]):
        code, err = cli(capsys, *args)
        if code == 0:  # a reader that does not need the file (gate and migrate never read requests.jsonl)
            assert file.endswith("requests.jsonl") and args[0] != "report", (args, err)
            continue
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1, (args, err)
        assert lines[0].startswith("error: ") and str(folder / file) in lines[0], (args, err)


def test_resume_measures_damaged_cells_again_and_says_so(made, tmp_path, data_dir):
    """A requests.jsonl cut short at a line's end (it still parses) and a summary with a non-UTF-8 byte: the
    resume measures both cells again, says why, and keeps the damaged files."""
    folder = tmp_path / "s"
    shutil.copytree(made, folder)
    requests = folder / "cells" / DF / "requests.jsonl"
    lines = requests.read_bytes().splitlines(keepends=True)
    requests.write_bytes(b"".join(lines[:-2]))
    summary = folder / "cells" / AR / "summary.json"
    summary.write_bytes(damaged(summary.read_bytes(), "non-utf8"))
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--resume", str(folder), "--data-dir",
                           str(data_dir), "--port", str(free_port())], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{DF}: measured again: " in proc.stderr and "it was cut short" in proc.stderr
    assert f"{AR}: measured again: " in proc.stderr and "is not UTF-8 text" in proc.stderr
    assert len((folder / "cells" / DF / "requests.jsonl").read_bytes().splitlines()) == len(lines)
    assert (folder / "damaged" / DF / "requests.jsonl").read_bytes() == b"".join(lines[:-2])  # nothing is lost
    from dflash_bench.store import SweepDir

    sweep = SweepDir.open(folder)
    assert [s.status for s in sweep.summaries()] == ["complete", "complete"]
    assert any(n.startswith(f"{DF}: measured again") for n in sweep.read_manifest().notes)


def _can_mount_tmpfs() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=16k tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs unprivileged user namespaces (unshare -rm) to mount a small tmpfs")
def test_a_full_disk_names_the_folder(tmp_path, data_dir):
    """The sweep's --out on a 32 KiB tmpfs (a user namespace's own mount): the sweep stops with one sentence that
    names the file it could not write and says the disk is full."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    argv = sweep_argv(mnt / "out", data_dir)
    script = f"mount -t tmpfs -o size=32k tmpfs {mnt} && exec {' '.join(argv)}"
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=240)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 1 and f"cannot write {mnt}/out/" in lines[0] and "is full" in lines[0], proc.stderr[-2000:]
