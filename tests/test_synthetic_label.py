"""Synthetic acceptance (benchmarking only) is labelled all the way: server -> cell summary -> report."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from dflash_bench.testing.tiny import make_tiny_pair  # noqa: E402
from dflash_bench.launch import free_port, launch_command  # noqa: E402


@pytest.mark.slow
def test_synthetic_acceptance_reaches_the_summary_and_the_report(tmp_path, data_dir):
    from dflash_bench.client.loadgen import LoadSettings
    from dflash_bench.client.protocol import RequestSettings
    from dflash_bench.client.run_command import run_one
    from dflash_bench.report import build_report
    from dflash_bench.store import SweepDir

    target, drafter = make_tiny_pair(tmp_path / "pair", seed=1, block_size=8)
    port = free_port()
    argv = ["dflash-bench", "serve", "--model", str(target), "--draft", str(drafter), "--device", "cpu", "--fast",
            "--max-model-len", "512", "--max-slots", "4", "--synthetic-acceptance", "3", "--benchmark-only",
            "--port", str(port)]
    with launch_command(argv, port=port, runner="process", ready_timeout=120, name="synthetic") as server:
        run_one(server.url, "gsm8k", RequestSettings(max_tokens=16), LoadSettings(concurrency=2, timeout=60.0),
                label="dflash", engine="builtin", out=tmp_path / "reports", name="syn", data_dir=data_dir,
                num_prompts=2, quiet=True)
    sweep = SweepDir.open(tmp_path / "reports" / "syn")
    (summary,) = sweep.summaries()
    assert summary.synthetic_acceptance == 3.0
    page = build_report([sweep.path]).read_text()
    assert "Synthetic τ, drawn (mean 3)" in page
