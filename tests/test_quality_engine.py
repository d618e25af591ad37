"""The builtin engine's AR and DFlash cells are token-for-token identical at temperature 0 on tiny models:
a real sweep (two real servers, real HTTP, token ids saved) whose own lossless check finds no divergence."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from dflash_bench.testing.tiny import make_tiny_pair  # noqa: E402
from dflash_bench.launch import free_port  # noqa: E402
from dflash_bench.quality.lossless import read_comparisons  # noqa: E402
from dflash_bench.store import SweepDir  # noqa: E402


@pytest.mark.slow
@pytest.mark.engine
def test_builtin_ar_and_dflash_cells_are_identical_at_temperature_0(tmp_path, data_dir):
    target, drafter = make_tiny_pair(tmp_path / "tiny", seed=3, block_size=4)  # random: drafts mostly rejected
    out = tmp_path / "reports"
    argv = [sys.executable, "-m", "dflash_bench", "sweep", "--model", str(target), "--drafter", str(drafter),
            "--engine", "builtin", "--suites", "gsm8k,mt-bench", "--concurrency", "2", "-n", "3", "--max-tokens", "24",
            "--save-token-ids", "--port", str(free_port()), "--out", str(out), "--data-dir", str(data_dir)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = [p for p in out.iterdir() if (p / "manifest.json").exists()]
    sweep = SweepDir.open(folder)
    dflash = [s for s in sweep.summaries() if s.mode == "dflash"]
    assert len(dflash) == 2 and all(s.status == "complete" for s in dflash)
    for s in dflash:
        lossless = s.lossless
        assert lossless is not None and lossless.status == "ok", lossless
        rows = read_comparisons(folder, s.cell_id)
        expected = 3 if s.suite == "gsm8k" else 6  # mt-bench: two turns per prompt
        assert lossless.n == expected == len(rows), lossless.model_dump_json()[:500]
        assert lossless.exact_match_rate == 1.0, json.dumps(lossless.examples)[:1500]
        assert all(r.ar_len > 0 and r.ar_len == r.dflash_len for r in rows)
