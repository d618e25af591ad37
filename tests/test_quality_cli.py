"""`dflash-bench quality SWEEP_DIR` on a planted sweep folder, through the real console entry point."""

from __future__ import annotations

import os
import subprocess
import sys

from dflash_bench.quality.check import quality_rows
from dflash_bench.store import CellPlan, CellSummary, Manifest, RequestRecord, SweepDir, cell_id
from dflash_bench.suites import load_prompts


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "250"}  # rich folds the table to the terminal width
    return subprocess.run([sys.executable, "-m", "dflash_bench", *args], capture_output=True, text=True, timeout=120, env=env)


def test_quality_command_writes_and_prints(tmp_path, data_dir):
    prompts = load_prompts("gsm8k", data_dir=data_dir, num_prompts=4, seed=0)
    plan, sweep = [], None
    for mode in ("ar", "dflash", "eagle3"):  # EAGLE-3 speculates too: checked against AR as DFlash is
        plan.append(CellPlan(cell_id=cell_id("builtin", mode, "gsm8k", 1), engine="builtin", mode=mode, suite="gsm8k", concurrency=1))
    sweep = SweepDir.create(tmp_path / "sweep", Manifest(sweep_id="q", plan=plan))
    for mode in ("ar", "dflash", "eagle3"):
        records = []
        for i, p in enumerate(prompts):
            ids = [1, 2, 3, i] if mode != "dflash" or i else [1, 2, 9, i]  # DFlash diverges on the first prompt at 2
            tops = [[(t, -0.01), (9 if k == 2 else 7, -2.0)] for k, t in enumerate(ids)]
            records.append(RequestRecord(request_id=f"{mode}{i}", prompt_id=p.id, t_send=float(i), token_ids=ids,
                                         top_logprobs=tops, output_text=f"[bold]x[/bold] \\boxed{{{p.reference}}}"))
        cid = cell_id("builtin", mode, "gsm8k", 1)
        sweep.write_requests(cid, records)
        sweep.write_summary(CellSummary(cell_id=cid, engine="builtin", mode=mode, suite="gsm8k", concurrency=1))

    out = cli("quality", str(sweep.path), "--data-dir", str(data_dir))
    assert out.returncode == 0, out.stderr
    assert "75.0% of 4" in out.stdout and "mismatch 1" in out.stdout and "100.0%" in out.stdout
    row, eagle3 = quality_rows(sweep.path)
    assert row["mode"] == "dflash" and eagle3["mode"] == "eagle3"
    assert row["lossless"]["divergences"] == {"mismatch": 1} and row["lossless"]["first_divergence"]["p50"] == 2
    assert row["accuracy"]["vs_ar"]["ar_minus_dflash"] == 0 and row["accuracy_ar"]["correct"] == 4
    assert eagle3["lossless"]["identical"] == 4 and eagle3["accuracy"]["vs_ar"]["ar_minus_dflash"] == 0
    assert [line.split("│")[2].strip() for line in out.stdout.splitlines() if line.startswith("│ builtin")] == ["dflash", "eagle3"]
    dflash = sweep.read_summary(cell_id("builtin", "dflash", "gsm8k", 1))
    assert dflash.lossless is not None and dflash.accuracy is not None
    assert "lossless_exact_match_rate" in (sweep.path / "results.csv").read_text()


def test_quality_command_bad_folder_is_one_line(tmp_path):
    out = cli("quality", str(tmp_path / "nowhere"))
    assert out.returncode == 2 and out.stderr.startswith("error: ") and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
