"""llama.cpp as a DFlash engine: build `llama-server` from PyPI's llama-cpp-python sdist, convert HF folders to GGUF.

    from dflash_bench.llamacpp import server_build as build, convert
    server = build.find_server() or build.build_server().server   # PATH first, then the cache
    gguf = convert.gguf_for(target_dir, dtype="f32")                # converted once, cached by content hash

The sdist carries the full llama.cpp tree under vendor/llama.cpp; its converter (convert_hf_to_gguf.py,
gguf-py) runs from that tree, so the converter and the server always come from the same source.
"""

from __future__ import annotations

import os
from pathlib import Path

VERSION = "0.3.36"  # llama-cpp-python release whose vendor/llama.cpp we build and convert with
PACKAGE = "llama-cpp-python"
CACHE_ENV = "DFLASH_BENCH_CACHE"


def cache_root() -> Path:
    """Where builds and GGUF files live (env DFLASH_BENCH_CACHE, else ~/.cache/dflash-bench)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "dflash-bench"


def install_dir(version: str = VERSION) -> Path:
    return cache_root() / f"llamacpp-{version}"
