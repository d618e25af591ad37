"""CI's first check: on a machine without Slurm, Docker's daemon, llama-server or Chromium, the tests that need
one of them skip with a reason; none fails.

Runs the tests marked slurm, docker, llamacpp or browser (tests/conftest.py marks every test that takes
such a service's fixture) with those commands hidden from PATH (a folder of links to everything else on it),
DOCKER_HOST at a socket that does not exist, an empty build cache (no built llama-server), and no
DFLASH_BENCH_REQUIRE_* variable; then checks from pytest's JUnit XML that every one of them was skipped.
Usage (from the repository root, in the project's virtualenv): python .ci/without_services.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

HIDDEN = {"sbatch", "squeue", "scancel", "scontrol", "sinfo", "srun", "salloc", "docker", "dockerd",
          "llama-server", "chromium", "chromium-browser"}
MARKERS = "slurm or docker or llamacpp or browser"


def shadow_path(folder: Path) -> str:
    """A PATH of one folder with a link to every command on PATH except the hidden ones (first one wins)."""
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        try:
            names = os.listdir(entry)
        except OSError:
            continue
        for name in names:
            link = folder / name
            if name not in HIDDEN and not link.exists() and os.access(os.path.join(entry, name), os.X_OK):
                link.symlink_to(os.path.join(entry, name))
    return str(folder)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="dflash-bench-no-services-") as tmp:
        tmp_path = Path(tmp)
        (tmp_path / "bin").mkdir()
        (tmp_path / "cache").mkdir()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("DFLASH_BENCH_REQUIRE_") and k not in ("DFLASH_BENCH_CHROMIUM", "DFLASH_BENCH_CACHE")}
        env.update(PATH=shadow_path(tmp_path / "bin"), DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock",
                   DFLASH_BENCH_CACHE=str(tmp_path / "cache"))
        junit = tmp_path / "junit.xml"
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", MARKERS,
                               f"--junitxml={junit}", "tests"], env=env)
        if proc.returncode not in (0, 5) or not junit.exists():
            print(f"FAIL: pytest exited {proc.returncode} with the services hidden: a test failed instead of skipping")
            return 1
        cases = list(ET.parse(junit).getroot().iter("testcase"))
        ran = [f"{c.get('classname')}::{c.get('name')}" for c in cases if c.find("skipped") is None]
        if not cases or ran:
            print("FAIL: with the services hidden these ran instead of skipping: " + (", ".join(ran) or "no test was selected"))
            return 1
        print(f"ok: all {len(cases)} tests that need Slurm, Docker, llama-server or Chromium skipped with them hidden")
        return 0


if __name__ == "__main__":
    sys.exit(main())
