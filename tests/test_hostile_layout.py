"""A sweep folder is closed: every command that reads one takes its cells from the folder's own layout (the names of
cells/'s folders), never from a path a file holds, never through a symbolic link, and refuses a stray or duplicated
cell in one sentence naming it, which `sweep --resume` sets aside. Each probe plants one thing in a copy of a real
sweep (the emulator, the real CLI) and checks what the command says and that nothing outside the folder changed."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import subprocess

import pytest

from benchmarks.fixtures.hostile import SECRET, cli, tree
from dflash_bench.store.lock import WriterLock
from test_hostile import AR, DF, copy, one_sentence, resume, sweep_argv


@pytest.fixture(scope="module")
def made(tmp_path_factory, data_dir) -> Path:
    """A finished emulator sweep with token ids saved (quality's lossless check reads them)."""
    out = tmp_path_factory.mktemp("layout") / "out"
    proc = subprocess.run([*sweep_argv(out, data_dir), "--save-token-ids"], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = [p for p in out.iterdir() if (p / "manifest.json").exists()]
    return folder


def victim(tmp_path: Path, made: Path, cell: str) -> Path:
    """A cell's files copied outside the sweep folder, its requests.jsonl's texts marked SECRET: what a path
    leaving the folder would read or overwrite."""
    outside = tmp_path / "outside" / "victim"
    shutil.copytree(made / "cells" / cell, outside)
    lines = [json.loads(ln) for ln in (outside / "requests.jsonl").read_text().splitlines()]
    for r in lines:
        r["output_text"] = SECRET
    (outside / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return outside


def set_cell_id(folder: Path, cell: str, value: str, **more) -> Path:
    file = folder / "cells" / cell / "summary.json"
    data = json.loads(file.read_text())
    data.update(cell_id=value, **more)
    file.write_text(json.dumps(data, indent=2))
    return file


def results_ids(folder: Path) -> list[str]:
    return [row["cell_id"] for row in csv.DictReader(io.StringIO((folder / "results.csv").read_text()))]


def test_a_cell_id_leaving_the_folder_is_refused_by_report_quality_and_migrate(made, tmp_path, data_dir):
    folder = copy(made, tmp_path)
    outside = victim(tmp_path, made, DF)
    before = tree(tmp_path / "outside")
    summary = set_cell_id(folder, DF, "../../outside/victim")
    page = tmp_path / "r.html"
    said = one_sentence(cli("report", str(folder), "--out", str(page)), str(summary), "../../outside/victim")
    assert "`sweep --resume` sets" in said
    assert not page.exists() or SECRET not in page.read_text()
    one_sentence(cli("quality", str(folder), "--data-dir", str(data_dir)), str(summary))
    set_cell_id(folder, DF, "../../outside/victim", schema_version=1)  # an older folder: migrate rewrites it
    one_sentence(cli("migrate", str(folder)), str(summary))
    assert tree(tmp_path / "outside") == before, "a command wrote outside the sweep folder"
    assert sorted(p.name for p in outside.iterdir()) == sorted(p.name for p in (made / "cells" / DF).iterdir())


def test_an_absolute_cell_id_is_refused_by_quality(made, tmp_path, data_dir):
    folder = copy(made, tmp_path)
    elsewhere = tmp_path / "elsewhere" / "cell"
    summary = set_cell_id(folder, DF, str(elsewhere))
    one_sentence(cli("quality", str(folder), "--data-dir", str(data_dir)), str(summary))
    assert not (tmp_path / "elsewhere").exists()


def test_a_symlinked_cell_folder_is_refused_by_quality_and_never_written_through(made, tmp_path, data_dir):
    folder = copy(made, tmp_path)
    outside = victim(tmp_path, made, DF)
    shutil.rmtree(folder / "cells" / DF)
    (folder / "cells" / DF).symlink_to(outside)
    before = tree(tmp_path / "outside")
    for argv in (["quality", str(folder), "--data-dir", str(data_dir)], ["report", str(folder), "--out",
                 str(tmp_path / "r.html")], ["gate", str(folder), "-b", str(made)]):
        said = one_sentence(cli(*argv), str(folder / "cells" / DF), "symbolic link")
        assert str(outside) not in said
    assert tree(tmp_path / "outside") == before


def test_a_symlinked_file_of_a_cell_is_not_read(made, tmp_path):
    folder = copy(made, tmp_path)
    outside = victim(tmp_path, made, DF)
    file = folder / "cells" / DF / "requests.jsonl"
    file.unlink()
    file.symlink_to(outside / "requests.jsonl")
    page = tmp_path / "r.html"
    one_sentence(cli("report", str(folder), "--out", str(page)), str(file), "symbolic link")
    assert not page.exists()


def test_a_pending_symlinked_cell_is_set_aside_by_resume_and_the_outside_kept(made, tmp_path, data_dir):
    folder = copy(made, tmp_path)
    outside = victim(tmp_path, made, AR)
    (outside / "summary.json").unlink()  # pending: the resume measures it
    shutil.rmtree(folder / "cells" / AR)
    (folder / "cells" / AR).symlink_to(outside)
    before = tree(tmp_path / "outside")
    proc = resume(folder, data_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{AR}: set aside" in proc.stderr and "symbolic link" in proc.stderr
    assert tree(tmp_path / "outside") == before
    assert (folder / "damaged" / AR).is_symlink() and not (folder / "cells" / AR).is_symlink()
    assert json.loads((folder / "cells" / AR / "summary.json").read_text())["status"] == "complete"
    assert sorted(results_ids(folder)) == sorted([AR, DF])


@pytest.mark.parametrize("how", ["copy", "symlink", "renamed copy"])
def test_a_stray_copy_of_a_cell_is_refused_by_gate_and_report_and_set_aside_by_resume(made, tmp_path, data_dir, how):
    folder = copy(made, tmp_path)
    stray = folder / "cells" / f"{AR}.bak"
    if how == "symlink":
        stray.symlink_to(AR)
    else:
        shutil.copytree(folder / "cells" / AR, stray)
        if how == "renamed copy":  # its cell_id says its folder's name, but it is the same cell as AR
            set_cell_id(folder, f"{AR}.bak", f"{AR}.bak")
    for argv in (["gate", str(folder), "-b", str(made)], ["report", str(folder), "--out", str(tmp_path / "r.html")],
                 ["gate", str(folder), "--export-baseline", "-o", str(tmp_path / "b.json")]):
        one_sentence(cli(*argv), str(stray))
    proc = resume(folder, data_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{AR}.bak: set aside" in proc.stderr
    assert not stray.exists() and not stray.is_symlink()
    assert (folder / "damaged" / f"{AR}.bak").exists() or (folder / "damaged" / f"{AR}.bak").is_symlink()
    assert sorted(results_ids(folder)) == sorted([AR, DF])  # each cell once
    assert cli("gate", str(folder), "-b", str(made)).code in (0, 1)


def test_quality_refuses_while_another_writes_the_folder(made, tmp_path, data_dir):
    folder = copy(made, tmp_path)
    before = tree(folder)
    with WriterLock(folder):
        said = one_sentence(cli("quality", str(folder), "--data-dir", str(data_dir)), str(folder), "being written")
    assert "pid" in said
    after = tree(folder)
    after.pop(".lock", None)
    assert after == before
    assert cli("quality", str(folder), "--data-dir", str(data_dir)).code == 0  # once the writer is gone
    assert not (folder / ".lock").exists()


def test_migrate_refuses_while_another_writes_the_folder(made, tmp_path):
    folder = copy(made, tmp_path)
    with WriterLock(folder):
        one_sentence(cli("migrate", str(folder)), str(folder), "being written")


def test_report_out_over_a_read_only_file_fails_and_keeps_it(made, tmp_path):
    page = tmp_path / "kept.html"
    page.write_text("mine")
    page.chmod(0o444)
    one_sentence(cli("report", str(made), "--out", str(page)), str(page), "read-only")
    assert page.read_text() == "mine"
