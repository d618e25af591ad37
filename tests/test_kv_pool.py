"""`serve --fast`'s KV pool sized from a memory budget (engine/fast/running/pool.py): the arithmetic against the caches the
fast path really allocates, a real server that takes as many slots as its budget holds and refuses more in one
sentence, and the harness that refuses a concurrency beyond a server's slots before a cell runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_bench.engine.config import DEFAULT_SLOTS
from dflash_bench.engine.fast.running.pool import MOST_SLOTS, Budget, choose_slots, slot_bytes
from dflash_bench.errors import UserError
from launch_helpers import stop_harness

pytest.importorskip("transformers")

from dflash_bench.testing.tiny import make_tiny_pair  # noqa: E402

MAX_LEN = 512


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_tiny_pair(tmp_path_factory.mktemp("pool"), seed=1, block_size=4)


def per_slot(target: Path, drafter: Path | None, dtype_bytes: int = 4) -> int:
    from transformers import AutoConfig

    from dflash_bench.engine.reference.drafter import DrafterConfig

    dc = DrafterConfig.from_dict(json.loads((drafter / "config.json").read_text())) if drafter is not None else None
    n = slot_bytes(AutoConfig.from_pretrained(target), dc, max_len=MAX_LEN, dtype_bytes=dtype_bytes,
                   block=dc.block_size if dc is not None else 1)
    assert n is not None
    return n


@pytest.mark.parametrize("dflash", [False, True])
def test_a_slots_bytes_are_what_the_fast_path_allocates(pair, dflash: bool):
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.build import build

    target, drafter = pair
    eng = build(EngineConfig.from_options(str(target), str(drafter) if dflash else None, mode="dflash" if dflash else "ar",
                            device="cpu", dtype="float32", max_slots=3, max_model_len=MAX_LEN, fast=True))
    caches = [eng.core.probe.target.cache] + ([eng.core.probe.drafter.cache] if dflash else [])
    kv = sum(t.numel() * t.element_size() for c in caches for t in c.k + c.v)
    logits = eng.B * eng.vocab_size * 4  # one float32 block of logits a slot
    assert kv // 3 + logits == per_slot(target, drafter if dflash else None)


def test_the_pool_takes_what_fits_and_refuses_more_in_one_sentence():
    b = Budget(10 * 1000 + 999, "a test budget")
    assert choose_slots(None, b, 1000, max_len=MAX_LEN) == 10
    assert choose_slots(7, b, 1000, max_len=MAX_LEN) == 7
    assert choose_slots(None, Budget(10 ** 12, "huge"), 1000, max_len=MAX_LEN) == MOST_SLOTS
    assert choose_slots(None, None, 1000, max_len=MAX_LEN) == DEFAULT_SLOTS  # no budget: the pool as before
    with pytest.raises(UserError, match=r"--max-slots 11 needs .* 10 slots fit"):
        choose_slots(11, b, 1000, max_len=MAX_LEN)
    with pytest.raises(UserError, match="no KV slot fits"):
        choose_slots(None, Budget(999, "small"), 1000, max_len=MAX_LEN)


def serve(*args: str, target: Path) -> subprocess.Popen:
    from dflash_bench.launch import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dflash_bench", "serve", "--model", str(target), "--fast",
                             "--device", "cpu", "--dtype", "float32", "--port", str(port), "--max-model-len",
                             str(MAX_LEN), "--served-model-name", "tiny", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    return proc


def test_serve_sizes_its_pool_from_the_budget_and_run_refuses_a_higher_concurrency(pair, tmp_path, data_dir):
    from dflash_bench.client.server_slots import server_slots
    from test_engine_server import wait_ready

    target, _ = pair
    budget = 3 * per_slot(target, None) + 1  # three slots and a byte
    proc = serve("--kv-cache-memory-bytes", str(budget), target=target)
    try:
        wait_ready(proc.url, proc)
        assert server_slots(proc.url, 10) == 3
        out = subprocess.run([sys.executable, "-m", "dflash_bench", "run", "--url", proc.url, "--suite", "gsm8k",
                              "--concurrency", "4", "--num-prompts", "4", "--max-tokens", "4", "--engine", "builtin",
                              "--out", str(tmp_path), "--name", "s", "--data-dir", str(data_dir)],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode != 0 and "decodes at most 3 requests together" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and not (tmp_path / "s").exists()  # refused before any cell
        ok = subprocess.run([sys.executable, "-m", "dflash_bench", "run", "--url", proc.url, "--suite", "gsm8k",
                             "--concurrency", "3", "--num-prompts", "3", "--max-tokens", "4", "--engine", "builtin",
                             "--out", str(tmp_path), "--name", "s", "--data-dir", str(data_dir)],
                            capture_output=True, text=True, timeout=300)
        assert ok.returncode == 0, ok.stderr
    finally:
        stop_harness(proc)
    log = proc.stdout.read()  # type: ignore[union-attr]
    assert "KV pool: 3 slots of 512 tokens" in log and "--kv-cache-memory-bytes" in log  # what it chose from what


def test_serve_refuses_more_slots_than_its_budget_holds(pair):
    target, _ = pair
    budget = 3 * per_slot(target, None) + 1
    proc = serve("--kv-cache-memory-bytes", str(budget), "--max-slots", "5", target=target)
    try:
        text, _ = proc.communicate(timeout=300)
    finally:
        stop_harness(proc)
    assert proc.returncode != 0 and "--max-slots 5 needs" in text and "3 slots fit" in text, text
    assert "Traceback" not in text


def test_the_budget_options_need_the_fast_path(pair):
    target, _ = pair
    out = subprocess.run([sys.executable, "-m", "dflash_bench", "serve", "--model", str(target), "--device", "cpu",
                          "--kv-cache-memory-bytes", "1000000"], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "add --fast" in out.stderr and "Traceback" not in out.stderr
