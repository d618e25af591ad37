"""The tests leave nothing in the system temp folder: conftest.py gives each session a temp folder of its own
(TMPDIR) and fails the session, naming them, over whatever tests left in it. Checked here on a session of one
test that leaves a folder behind, and one that cleans up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _session(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_one.py").write_text(f"import tempfile, shutil\n\ndef test_one():\n    {body}\n")
    temp = tmp_path / "system-temp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DFLASH_BENCH_TEST_TMPDIR", "DFLASH_BENCH_RUN_DIR")}
    env.update(TMPDIR=str(temp), PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                           str(tmp_path / "test_one.py")], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert list(temp.iterdir()) == []  # the session's own temp folder is gone too, pytest's tmp_path with it
    return proc


def test_a_session_whose_tests_leave_a_temp_folder_fails_naming_it(tmp_path):
    proc = _session(tmp_path, 'tempfile.mkdtemp(prefix="left-behind-")')
    assert proc.returncode == 1 and "1 passed" in proc.stdout
    assert "the tests left left-behind-" in proc.stderr and "in the system temp folder" in proc.stderr


def test_a_session_whose_tests_clean_up_passes(tmp_path):
    proc = _session(tmp_path, 'shutil.rmtree(tempfile.mkdtemp(prefix="cleaned-"))')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "system temp folder" not in proc.stderr
