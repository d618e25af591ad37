"""The gate on sweep folders written by the real measurement path (`run_one`) against emulator servers."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_bench import gate
from dflash_bench.client.loadgen import LoadSettings
from dflash_bench.client.protocol import RequestSettings
from dflash_bench.client.run_command import run_one
from dflash_bench.emulator import EmulatorProcess


def measure(url: str, label: str, out: Path, name: str, data_dir: Path) -> None:
    run_one(url, "gsm8k", RequestSettings(max_tokens=64), LoadSettings(concurrency=4, timeout=30.0, transport="aiohttp"),
            label=label, engine="vllm", out=out, name=name, data_dir=data_dir, num_prompts=8, quiet=True)


@pytest.mark.slow
def test_gate_catches_an_acceptance_collapse_in_measured_sweeps(tmp_path: Path, data_dir: Path):
    emu = dict(ttft_ms=5, itl_ms=4, output_len=32, seed=1)
    with EmulatorProcess(mode="ar", **emu) as ar, \
            EmulatorProcess(mode="dflash", acceptance_length=6.5, **emu) as good, \
            EmulatorProcess(mode="dflash", acceptance_length=2.0, **emu) as bad:
        for name, dflash in (("base", good), ("new", bad)):
            measure(ar.url, "ar", tmp_path, name, data_dir)
            measure(dflash.url, "dflash", tmp_path, name, data_dir)
    base, new = tmp_path / "base", tmp_path / "new"

    same = gate.gate(base, base)
    assert same.passed and len(same.checks) == 2 + 4  # AR: throughput, TPOT; DFlash: + tau, speedup
    assert {c.method for c in same.checks} == {"plain", "tight"}  # one repeat: labelled plain

    result = gate.gate(new, base)
    assert result.exit_code == 1
    failed = {(c.cell, c.metric.name) for c in result.failures}
    assert ("vllm/dflash/gsm8k/c4", "acceptance_length") in failed
    assert ("vllm/dflash/gsm8k/c4", "speedup") in failed
    tau = next(c for c in result.checks if c.metric.name == "acceptance_length")
    assert tau.baseline[0] > 4 and tau.current[0] < 2.5

    file = tmp_path / "baseline.json"
    gate.export_baseline(base, file)
    again = gate.gate(new, file)
    assert [(c.cell, c.metric.name, c.verdict) for c in again.checks] == \
           [(c.cell, c.metric.name, c.verdict) for c in result.checks]
