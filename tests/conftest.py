"""Shared test fixtures."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config) -> None:
    # No GPU here: the fast path's Triton kernels run in Triton's interpreter (read when a kernel is decorated,
    # so this must precede every import of them). `pytest -m gpu` runs the real kernels on a GPU host.
    if config.getoption("markexpr", "") != "gpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    _private_temp(config)


TEMP_ENV = "DFLASH_BENCH_TEST_TMPDIR"


def _private_temp(config) -> None:
    """Every test, and every process it starts, writes its temporary files into one folder of this session's
    (TMPDIR), which must hold nothing at the end but pytest's own tmp_path folders and an empty server
    registry: anything else is what a test (or the code it runs) leaves in the system temp folder, and fails
    the session by name. The folder is removed at the end."""
    if os.environ.get(TEMP_ENV):  # pytest run by a test: the outer session checks
        return
    folder = tempfile.mkdtemp(prefix="dflash-bench-tests-")
    os.chmod(folder, 0o1777)  # as /tmp is: the quality sandbox's programs run as nobody inside it
    os.environ[TEMP_ENV] = os.environ["TMPDIR"] = tempfile.tempdir = folder
    # caches that belong in the home folder, not in the temp folder (torch's default is the temp folder)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path.home() / ".cache" / "dflash-bench" / "torchinductor"))
    os.environ.setdefault("DFLASH_BENCH_RUN_DIR", os.path.join(folder, "servers"))  # launch/local_process.py's registry
    config.stash[_TEMP] = folder


_TEMP = pytest.StashKey[str]()


def pytest_sessionfinish(session, exitstatus) -> None:
    folder = session.config.stash.get(_TEMP, None)
    if folder is None:
        return
    left = sorted(p.name for p in Path(folder).iterdir()
                  if not p.name.startswith("pytest-of-") and not (p.name == "servers" and not any(p.iterdir())))
    shutil.rmtree(folder, ignore_errors=True)
    if left:
        sys.stderr.write(f"\nthe tests left {', '.join(left)} in the system temp folder ({folder}): each test "
                         "removes what it makes there\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# A test that takes one of these fixtures needs a service from outside Python (tests/services.py): it gets the
# service's marker, so that `pytest -m "slurm or docker or llamacpp or browser"` selects exactly those tests.
SERVICE_FIXTURES = {"slurm_cluster": "slurm", "docker_cli": "docker", "llama_server": "llamacpp",
                    "chromium_bin": "browser"}


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        for fixture, marker in SERVICE_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)


def _data_dir() -> Path:
    env = os.environ.get("DFLASH_BENCH_DATA")
    return Path(env) if env else REPO.parent / "shared" / "datasets"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The offline copies of the benchmark datasets (shared/datasets beside the repository)."""
    path = _data_dir()
    if not path.is_dir():
        pytest.fail(f"offline datasets not found at {path}; set DFLASH_BENCH_DATA")
    return path
