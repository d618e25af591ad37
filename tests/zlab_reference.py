"""z-lab's reference DFlash code (PyPI `dflash` 0.1.0, the newest, with Gemma knobs) for the exactness tests.

The wheel is fetched once with pip (`pip download dflash==0.1.0 --no-deps`, ~25 kB) into
~/.cache/dflash-bench/zlab, or read from DFLASH_BENCH_ZLAB_WHEEL; its `dflash/model.py` is extracted once into that
cache folder and imported from there (nothing in the system temp folder), not copied into this repository. It runs with this environment's transformers. Tests that need
it skip when it cannot be had, unless DFLASH_BENCH_REQUIRE_ZLAB=1 (CI), where they fail.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

VERSION = "0.1.0"
CACHE = Path.home() / ".cache" / "dflash-bench" / "zlab"
_MODULE: list = []


def _wheel() -> Path | None:
    given = os.environ.get("DFLASH_BENCH_ZLAB_WHEEL")
    if given:
        return Path(given)
    cache = CACHE
    found = sorted(cache.glob(f"dflash-{VERSION}-*.whl"))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", f"dflash=={VERSION}", "--no-deps", "-d", str(cache)],
                       capture_output=True, timeout=180, check=False)
        found = sorted(cache.glob(f"dflash-{VERSION}-*.whl"))
    return found[0] if found else None


def zlab_model():
    """z-lab's `dflash/model.py` as a module, or a skip (a failure under DFLASH_BENCH_REQUIRE_ZLAB=1)."""
    if _MODULE:
        return _MODULE[0]
    wheel = _wheel()
    if wheel is None or not wheel.is_file():
        why = f"z-lab's reference (PyPI dflash=={VERSION}) could not be downloaded and DFLASH_BENCH_ZLAB_WHEEL is unset"
        if os.environ.get("DFLASH_BENCH_REQUIRE_ZLAB") == "1":
            pytest.fail(why)
        pytest.skip(why)
    source = CACHE / f"{wheel.stem}-model.py"
    if not source.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            text = z.read("dflash/model.py")
        tmp = source.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(text)
        tmp.replace(source)
    spec = importlib.util.spec_from_file_location("zlab_dflash_model", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module._cuda_time = time.perf_counter  # its stats time with CUDA syncs; these tests run on the CPU
    _MODULE.append(module)
    return module
