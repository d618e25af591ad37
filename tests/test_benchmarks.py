"""Every script of benchmarks/ runs, on the tiny shape or with tiny arguments, as `python -m benchmarks.<name>`:
a script that rots fails here, not on the GPU host a year later. What a script measures (its speed numbers) is
not asserted: only that it runs to the end and writes what it says it writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def bench(name: str, *args: str, timeout: int = 600) -> str:
    """Run `python -m benchmarks.<name> ARGS` from the repository root; return its stdout (fail on a non-zero exit)."""
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"benchmarks.{name} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_gate_calibration_prints_fail_rates_and_gates_a_big_sweep():
    out = bench("gate_calibration", "--trials", "20")
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("+", "-")) and "%" in line]
    assert len(rows) == 6 and all(0.0 <= float(x) <= 1.0 for r in rows for x in r[1:])
    assert "gate of 210 cells" in out


def test_report_build_builds_a_report_of_planted_cells():
    out = bench("report_build", "--suites", "1", "--concurrency", "1,2", "--repeats", "1", "--gpus", "1")
    assert out.startswith("cells 4;") and " figures" in out


def test_big_sweep_reads_sweep_folders_into_one_results_file(tmp_path):
    from benchmarks.fixtures.report_sweeps import make_sweep

    folder = make_sweep(tmp_path / "s", suites=("gsm8k",), repeats=1, gpus=1, concurrency=(1,))
    out = tmp_path / "big.json"
    bench("big_sweep", str(folder), "--out", str(out), "--tokenizer", "bytes", "--refused", "dflash-bench sweep X", "no.")
    res = json.loads(out.read_text())
    assert res["tokenizer"] == "bytes" and res["refused"] == [{"command": "dflash-bench sweep X", "sentence": "no."}]
    assert len(res["runs"]) == 1 and {r["mode"] for r in res["runs"][0]["rows"]} == {"ar", "dflash"}
    bench("big_sweep", str(folder), "--out", str(out))  # the same run again replaces its rows
    assert len(json.loads(out.read_text())["runs"]) == 1
    proc = subprocess.run([sys.executable, "-m", "benchmarks.big_sweep", str(tmp_path), "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "is not a sweep folder" in proc.stderr


@pytest.mark.engine
def test_big_shape_writes_a_target_and_drafter_without_weights(tmp_path):
    pytest.importorskip("tokenizers")
    shown = json.loads(bench("big_shape", "--pair", "gemma-4-31B-it", "--out", str(tmp_path)))
    target, drafter = Path(shown["target"]), Path(shown["drafter"])
    assert json.loads((target / "config.json").read_text())["model_type"].startswith("gemma")
    assert (drafter / "config.json").is_file() and not list(target.glob("*.safetensors"))
    assert "What is 7 * 6?" in shown["renders"]["text"] and shown["renders"]["token_ids"]


@pytest.mark.engine
def test_engine_profile_profiles_ar_and_dflash_on_the_tiny_pair():
    out = bench("engine_profile", "--max-tokens", "8", "--top", "3", "--hidden", "32", "--layers", "2")
    assert "== ar:" in out and "== dflash:" in out and "tok/s" in out


def test_quality_sandbox_passes_the_reference_solutions(data_dir):
    out = bench("quality_sandbox", "--data-dir", str(data_dir), "--num-prompts", "3", "--workers", "1")
    assert "humaneval: 3/3 reference solutions pass" in out and "mbpp: 3/3 reference solutions pass" in out


@pytest.mark.slow
def test_reading_path_counts_the_files_a_sweep_and_report_run(tmp_path, data_dir):
    out = tmp_path / "path.json"
    bench("reading_path", "--data-dir", str(data_dir), "--json", str(out))
    res = json.loads(out.read_text())
    assert res["files"] == len(res["per_file"]) and "dflash_bench/cli.py" in res["per_file"]
    assert res["function_lines"] == sum(res["per_file"].values())
