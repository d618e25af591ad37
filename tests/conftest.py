"""Shared test fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config) -> None:
    # No GPU here: the fast path's Triton kernels run in Triton's interpreter (read when a kernel is decorated,
    # so this must precede every import of them). `pytest -m gpu` runs the real kernels on a GPU host.
    if config.getoption("markexpr", "") != "gpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")


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
