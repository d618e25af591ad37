"""The --input-len axis: long-<N> suites of real text through a whole emulator sweep, and the report's figure."""

from __future__ import annotations

import subprocess
import sys

from dflash_bench.launch import free_port
from dflash_bench.store import SweepDir, read_results_csv

CLI = [sys.executable, "-m", "dflash_bench"]
PAIR = "dflash_bench/assets/default_pair"


def test_a_sweep_with_input_lengths_measures_long_prompts_and_the_report_plots_them(tmp_path, data_dir):
    proc = subprocess.run([*CLI, "sweep", "--model", "org/emulated", "--drafter", "org/emulated-dflash",
                           "--engine", "emulator", "--suites", "gsm8k", "--input-len", "1k,2k", "--concurrency", "1,2",
                           "-n", "3", "--max-tokens", "24", "--port", str(free_port()), "--out", str(tmp_path),
                           "--data-dir", str(data_dir), "--engine-arg=--ttft-ms=2", "--engine-arg=--itl-ms=1"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = [p for p in tmp_path.iterdir() if (p / "manifest.json").exists()]
    sweep = SweepDir.open(folder)
    assert sweep.read_manifest().settings.input_lens == [1024, 2048]
    lens = {s.cell_id: s.input_len for s in sweep.summaries()}
    assert lens["emulator-ar-gsm8k-c1"] is None
    assert lens["emulator-dflash-long-1k-c2"] == 1024 and lens["emulator-ar-long-2k-c1"] == 2048
    assert {r.cell_id: r.input_len for r in read_results_csv(folder / "results.csv")}["emulator-ar-long-2k-c2"] == 2048
    for cid, n in (("emulator-ar-long-1k-c1", 1024), ("emulator-dflash-long-2k-c2", 2048)):
        got = [r.prompt_tokens for r in sweep.read_requests(cid) if not r.warmup]
        # the emulator counts 4 bytes a token, as longctx does without a tokenizer: each prompt is about n
        assert got and all(0.85 * n <= t <= 1.15 * n for t in got), (cid, got)
    report = subprocess.run([*CLI, "report", str(folder)], capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    html = (folder / "report.html").read_text()
    assert 'data-figure="input_length"' in html and (folder / "figures" / "input_length.png").exists()


def test_a_sweep_without_the_axis_has_no_input_length_figure(tmp_path):
    import shutil

    from dflash_bench.report import build_report

    copy = tmp_path / "sw"
    shutil.copytree("tests/data/sweep_v1", copy)
    assert 'data-figure="input_length"' not in build_report([copy]).read_text()


def test_an_input_length_past_the_targets_context_is_refused_before_anything_starts(tmp_path, data_dir):
    proc = subprocess.run([*CLI, "sweep", "--model", f"{PAIR}/target", "--drafter", f"{PAIR}/drafter",
                           "--suites", "gsm8k", "--input-len", "1k,4k", "-c", "1", "--out", str(tmp_path),
                           "--data-dir", str(data_dir)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--input-len 4096 plus 256 new tokens passes the target's 2048 positions" in proc.stderr
    assert not any(tmp_path.iterdir())  # no sweep folder, no server
