"""Gemma 4's KV pool on `serve --fast` (engine/fast/models/cache_layout.py, pool.py): a slot's bytes are what the engine really
allocates (sliding layers' rings, full layers, the drafter's layers, the logits), at several slot counts and
lengths on both sides of the ring; a real server takes as many slots as its budget holds, reports them on /metrics,
and refuses more in one sentence."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launch_helpers import stop_harness

pytest.importorskip("transformers")

from dflash_bench.testing.tiny import make_tiny_pair  # noqa: E402

B = 4
MAX_LEN = 128  # past the sliding layers' ring (window 8 + RING_MARGIN + its spare row)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_tiny_pair(tmp_path_factory.mktemp("gemma_pool"), arch="gemma4", seed=1, block_size=B, layers=7)


def per_slot(target: Path, drafter: Path | None, max_len: int = MAX_LEN) -> int:
    from transformers import AutoConfig

    from dflash_bench.engine.reference.drafter import DrafterConfig
    from dflash_bench.engine.fast.running.pool import slot_bytes

    dc = DrafterConfig.from_dict(json.loads((drafter / "config.json").read_text())) if drafter is not None else None
    return slot_bytes(AutoConfig.from_pretrained(target), dc, max_len=max_len, dtype_bytes=4,
                      block=dc.block_size if dc is not None else 1)


def allocated(eng) -> int:
    """Bytes of every tensor the engine holds per slot: the target's caches of each kind, the drafter's, the
    logits the runner keeps."""
    probe = eng.core.probe
    drafter = probe.drafter
    kv = [t for k in probe.target.kinds for t in k.k + k.v] + (drafter.cache.k + drafter.cache.v if drafter is not None else [])
    assert probe.state.logits is not None
    return sum(t.nbytes for t in kv) + probe.state.logits.nbytes


@pytest.mark.parametrize("dflash", [False, True])
def test_a_gemma_slots_bytes_are_what_the_engine_allocates(pair, dflash: bool):
    """Exact, at two slot counts and at lengths below the ring (every position kept) and above it (a ring)."""
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.build import build
    from dflash_bench.engine.fast.models.cache_layout import RING_MARGIN

    target, drafter = pair
    for max_len in (32, MAX_LEN):
        sizes = {}
        for slots in (2, 3):
            eng = build(EngineConfig.from_options(str(target), str(drafter) if dflash else None, mode="dflash" if dflash else "ar",
                                    device="cpu", dtype="float32", max_slots=slots, max_model_len=max_len, fast=True))
            rows = {k.k[0].shape[1] for k in eng.core.probe.target.kinds}
            assert rows == ({max_len} if max_len <= 8 + RING_MARGIN else {8 + RING_MARGIN + 1, max_len})
            sizes[slots] = allocated(eng)
        want = per_slot(target, drafter if dflash else None, max_len)
        assert sizes[3] - sizes[2] == want and sizes[2] == 2 * want, (max_len, sizes, want)


def serve(*args: str, target: Path, drafter: Path) -> subprocess.Popen:
    from dflash_bench.launch import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dflash_bench", "serve", "--model", str(target), "--draft",
                             str(drafter), "--fast", "--device", "cpu", "--dtype", "float32", "--port", str(port),
                             "--max-model-len", str(MAX_LEN), "--served-model-name", "tiny", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    return proc


def test_b_serve_sizes_the_gemma_pool_from_the_budget_and_reports_it(pair):
    from dflash_bench.client.server_slots import server_slots
    from test_engine_server import wait_ready

    target, drafter = pair
    budget = 3 * per_slot(target, drafter) + 1  # three slots and a byte: a fourth would need one slot's bytes more
    proc = serve("--kv-cache-memory-bytes", str(budget), target=target, drafter=drafter)
    try:
        wait_ready(proc.url, proc)
        assert server_slots(proc.url, 10) == 3
    finally:
        stop_harness(proc)
    log = proc.stdout.read()  # type: ignore[union-attr]
    assert f"KV pool: 3 slots of {MAX_LEN} tokens" in log


def test_b_serve_refuses_more_gemma_slots_than_the_budget_holds(pair):
    target, drafter = pair
    budget = 3 * per_slot(target, drafter) + 1
    proc = serve("--kv-cache-memory-bytes", str(budget), "--max-slots", "4", target=target, drafter=drafter)
    try:
        text, _ = proc.communicate(timeout=300)
    finally:
        stop_harness(proc)
    assert proc.returncode != 0 and "--max-slots 4 needs" in text and "3 slots fit: use --max-slots 3" in text, text
    shorter = int(re.search(r"--max-model-len (\d+) for 4 slots", text).group(1))  # type: ignore[union-attr]
    assert 4 * per_slot(target, drafter, shorter) <= budget < 4 * per_slot(target, drafter, shorter + 1)
    assert "Traceback" not in text and len([ln for ln in text.splitlines() if "--max-slots 4" in ln]) == 1
