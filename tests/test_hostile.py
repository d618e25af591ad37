"""Content that passes the byte check and names the harness is given: each refused in one sentence that names the
file or the option, with a non-zero exit and no orphan or half-written folder; what a sentence says `--resume`
repairs, a resume repairs. Real sweeps against the emulator, the real CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.fixtures.hostile import HUGE, add_telemetry, cli
from dflash_bench.launch import free_port
from test_folder_bytes import _can_mount_tmpfs  # one probe for both full-disk tests

EMU = ["--engine-arg=--ttft-ms=2", "--engine-arg=--itl-ms=1", "--engine-arg=--acceptance-length=4"]
AR, DF = "emulator-ar-gsm8k-c1", "emulator-dflash-gsm8k-c1"
PY = [sys.executable, "-m", "dflash_bench"]


def sweep_argv(out: Path, data_dir: Path) -> list[str]:
    return [*PY, "sweep", "--model", "org/emulated", "--drafter", "org/emulated-dflash", "--engine", "emulator",
            "--runner", "process", "--suites", "gsm8k", "--concurrency", "1", "-n", "4", "--max-tokens", "16",
            "--port", str(free_port()), "--out", str(out), "--data-dir", str(data_dir), *EMU]


@pytest.fixture(scope="module")
def made(tmp_path_factory, data_dir) -> Path:
    out = tmp_path_factory.mktemp("hostile") / "out"
    proc = subprocess.run(sweep_argv(out, data_dir), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = [p for p in out.iterdir() if (p / "manifest.json").exists()]
    add_telemetry(folder)
    return folder


def one_sentence(outcome, *named: str) -> str:
    lines = [ln for ln in outcome.stderr.splitlines() if ln.strip()]
    assert outcome.traceback is None, outcome.traceback
    assert outcome.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), outcome.stderr
    assert all(n in lines[0] for n in named), (named, lines[0])
    return lines[0]


def copy(made: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "s"
    shutil.copytree(made, folder)
    return folder


def resume(folder: Path, data_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*PY, "sweep", "--resume", str(folder), "--data-dir", str(data_dir), "--port",
                           str(free_port())], capture_output=True, text=True, timeout=240)


def readers(folder: Path, good: Path, tmp: Path) -> list[list[str]]:
    return [["report", str(folder), "--out", str(tmp / "r.html")], ["gate", str(folder), "-b", str(good)],
            ["gate", str(folder), "--export-baseline", "-o", str(tmp / "b.json")], ["migrate", str(folder)]]


def plant(file: Path, path: tuple, raw: str) -> None:
    """`raw` JSON text in place of the value at `path` of a JSON file."""
    data = json.loads(file.read_text())
    node = data
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = "\0planted\0"
    file.write_text(json.dumps(data, indent=2).replace(json.dumps("\0planted\0"), raw))


def test_huge_integer_surrogate_and_text_telemetry_in_cells_are_named_and_resume_measures_them_again(made, tmp_path, data_dir):
    """A 5000-digit integer in one summary, a lone surrogate escape in it, and a telemetry.csv of text where its
    numbers should be: every reader names the file and says the resume measures the cell again; it does."""
    folder = copy(made, tmp_path)
    summary, telemetry = folder / "cells" / AR / "summary.json", folder / "cells" / DF / "telemetry.csv"
    plant(summary, ("num_requests",), HUGE)
    for args in readers(folder, made, tmp_path):
        said = one_sentence(cli(*args), str(summary), "5000 digits")
        assert "`sweep --resume` sets the cell aside under damaged/ and measures it again" in said
    shutil.copy(made / "cells" / AR / "summary.json", summary)
    plant(summary, ("num_requests",), '"\\ud800"')
    for args in readers(folder, made, tmp_path):
        one_sentence(cli(*args), str(summary), "lone surrogate")
    telemetry.write_text("t_s,gpu,power_w\nabc,0,def\n")
    shutil.copy(made / "cells" / AR / "summary.json", summary)
    one_sentence(cli("report", str(folder), "--out", str(tmp_path / "r.html")), str(telemetry), "measures it again")
    plant(summary, ("num_requests",), HUGE)
    proc = resume(folder, data_dir)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"{AR}: measured again: " in proc.stderr and f"{DF}: measured again: " in proc.stderr
    assert (folder / "damaged" / DF / "telemetry.csv").read_text() == "t_s,gpu,power_w\nabc,0,def\n"  # kept
    assert not telemetry.exists()  # the emulator has no GPU: the cell measured again has no telemetry
    for args in readers(folder, made, tmp_path):
        assert cli(*args).code in (0, 1), args  # reads whole again (gate: 1 is a verdict)
    plant(summary, ("suite",), '"gsm\\ud800k"')  # a lone surrogate: the resume used to fail writing it back
    proc = resume(folder, data_dir)
    assert proc.returncode == 0 and f"{AR}: measured again: " in proc.stderr and "lone surrogate" in proc.stderr
    assert (folder / "damaged" / f"{AR}-2" / "summary.json").exists()
    assert cli("report", str(folder), "--out", str(tmp_path / "r.html")).code == 0


def test_a_lone_surrogate_in_the_manifest_is_named_and_not_promised_to_resume(made, tmp_path, data_dir):
    folder = copy(made, tmp_path)
    manifest = folder / "manifest.json"
    data = json.loads(manifest.read_text())
    data["notes"].append("\0n\0")
    manifest.write_text(json.dumps(data).replace(json.dumps("\0n\0"), '"note \\ud800"'))
    before = manifest.read_bytes()
    for args in readers(folder, made, tmp_path):
        said = one_sentence(cli(*args), str(manifest), "lone surrogate")
        assert "restore it from a copy" in said and "resume" not in said
    proc = resume(folder, data_dir)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and str(manifest) in lines[0], proc.stderr[-2000:]
    assert manifest.read_bytes() == before and not (folder / "damaged").exists()


def test_a_stray_damaged_cell_is_set_aside_by_the_resume_the_sentence_promises(made, tmp_path, data_dir):
    folder = copy(made, tmp_path)
    stray = folder / "cells" / "stray"
    stray.mkdir()
    (stray / "summary.json").write_text('{"cell_id": ')
    said = one_sentence(cli("report", str(folder), "--out", str(tmp_path / "r.html")), str(stray / "summary.json"))
    assert "`sweep --resume` sets the cell aside under damaged/" in said
    proc = resume(folder, data_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "stray: set aside (not in the plan)" in proc.stderr
    assert (folder / "damaged" / "stray" / "summary.json").read_text() == '{"cell_id": ' and not stray.exists()
    assert cli("report", str(folder), "--out", str(tmp_path / "r.html")).code == 0


def test_a_huge_integer_in_an_exported_baseline_is_named(made, tmp_path):
    baseline = tmp_path / "b.json"
    assert cli("gate", str(made), "--export-baseline", "-o", str(baseline)).code == 0
    plant(baseline, ("cells", 0, "concurrency"), HUGE)
    one_sentence(cli("gate", str(made), "-b", str(baseline)), f"baseline {baseline}", "5000 digits")


def test_out_that_is_not_utf8_is_refused_before_anything_is_written(tmp_path, data_dir):
    out = Path(tmp_path.as_posix().encode().decode() + "/bad" + b"\xff\xfe".decode("utf-8", "surrogateescape"))
    proc = subprocess.run([*sweep_argv(out, data_dir)], capture_output=True, cwd=tmp_path, timeout=120)
    err = proc.stderr.decode("utf-8", "replace")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: --out "), err
    assert "\\xff\\xfe" in lines[0] and "not UTF-8" in lines[0]
    assert list(tmp_path.iterdir()) == []


def _bad_prompts(data_dir: Path, tmp_path: Path) -> Path:
    data = tmp_path / "data"
    (data / "gsm8k").mkdir(parents=True)
    lines = (data_dir / "gsm8k" / "test.jsonl").read_text().splitlines()[:8]
    record = json.loads(lines[0])
    lines[0] = json.dumps({**record, "question": "\0q\0"}).replace(json.dumps("\0q\0"), '"Janet\\ud800s ducks"')
    (data / "gsm8k" / "test.jsonl").write_text("\n".join(lines) + "\n")
    return data


def test_a_prompt_with_a_lone_surrogate_is_refused_before_a_folder_is_made(tmp_path, data_dir):
    data = _bad_prompts(data_dir, tmp_path)
    file = data / "gsm8k" / "test.jsonl"
    one_sentence(cli("suites", "show", "gsm8k", "--data-dir", str(data)), f"{file} line 1", "lone surrogate")
    from dflash_bench.emulator.process import EmulatorProcess

    with EmulatorProcess(model="emulated") as emu:
        outcome = cli("run", "--url", emu.url, "--suite", "gsm8k", "-n", "8", "--max-tokens", "8", "--engine",
                      "emulator", "--out", str(tmp_path / "out"), "--data-dir", str(data))
    one_sentence(outcome, f"{file} line 1", "lone surrogate")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["../escaped", "..", ".", "a/b", "/tmp/abs", ""])
def test_run_name_cannot_leave_out(tmp_path, name):
    out = tmp_path / "in" / "out"
    outcome = cli("run", "--url", "http://127.0.0.1:9", "--suite", "gsm8k", "--out", str(out), "--name", name)
    one_sentence(outcome, "--name", "under --out")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs unprivileged user namespaces (unshare -rm) to mount a small tmpfs")
@pytest.mark.parametrize("command", ["sweep", "run"])
def test_a_disk_already_full_names_the_folder_and_leaves_nothing(tmp_path, data_dir, command):
    """--out on a tmpfs filled before the command starts: one sentence naming the folder it could not make, and
    nothing on the disk but the file that filled it."""
    from dflash_bench.emulator.process import EmulatorProcess

    mnt = tmp_path / "small"
    mnt.mkdir()
    with EmulatorProcess(model="emulated") as emu:
        argv = sweep_argv(mnt / "out", data_dir) if command == "sweep" else [
            *PY, "run", "--url", emu.url, "--suite", "gsm8k", "-n", "2", "--max-tokens", "4", "--engine", "emulator",
            "--out", str(mnt / "out"), "--name", "r", "--data-dir", str(data_dir)]
        script = (f"mount -t tmpfs -o size=16k tmpfs {mnt} && (cat /dev/zero > {mnt}/fill 2>/dev/null; true) && "
                  f"{' '.join(argv)}; rc=$?; ls -A {mnt}/; exit $rc")
        proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=240)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(errors) == 1 and f"{mnt}/out" in errors[0] and "is full" in errors[0], proc.stderr[-2000:]
    assert proc.stdout.split() == ["fill"], proc.stdout  # no folder holding only .lock
