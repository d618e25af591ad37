"""The services from outside Python some tests need: Slurm, Docker's daemon, llama-server, Chromium.

On a machine without one, its tests skip with the reason; CI (.ci/run) installs them all and sets
DFLASH_BENCH_REQUIRE_<SERVICE>=1, which turns that absence into a failure instead of a silent skip. Each such
test carries the service's marker (pyproject.toml), so `.ci/run` can show they skip with the service hidden.
"""

from __future__ import annotations

import os
import signal
from typing import NoReturn

import pytest

SERVICES = ("slurm", "docker", "llamacpp", "chromium")


def require_var(service: str) -> str:
    assert service in SERVICES, service
    return f"DFLASH_BENCH_REQUIRE_{service.upper()}"


def service_missing(service: str, why: str) -> NoReturn:
    """Skip the test with `why`, or fail it where CI requires the service."""
    var = require_var(service)
    if os.environ.get(var) == "1":
        pytest.fail(f"{var}=1 but {why}")
    pytest.skip(why)


def sigint_delivered() -> None:
    """preexec_fn of a child that a test Ctrl-Cs: SIGINT back to its default action, so that Python installs
    its KeyboardInterrupt handler. A shell starts background jobs with SIGINT ignored (`nohup setsid pytest
    ... &`), children inherit that, and an ignored SIGINT would never reach the code under test."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
