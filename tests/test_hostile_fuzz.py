"""Hostile bytes in every file of a sweep folder and in an exported baseline: random bytes, and JSON or CSV that
parses yet holds huge integers, lone surrogates, values of the wrong type, deep nesting, NaN and Infinity; and
hostile layouts of each cell (a cell_id leaving the folder or absolute, a cell or a file of it linked outside, stray
copies). Every command that reads the folder (report, gate, gate -b, gate --export-baseline [--noise-from], migrate,
quality, sweep --resume) answers with one sentence or reads it fine, never a traceback, never writes outside the
folder, and leaves results.csv with each cell once. A real sweep against the emulator.

The draws come from a fixed seed; DFLASH_BENCH_FUZZ_SEED=<n> runs others (and reproduces a failure it printed),
DFLASH_BENCH_FUZZ_ALL=1 runs the report and the resume on every case too (as
`python -m benchmarks.faults --only hostile_folder` does); the layouts run the report always, and the resume on
every layout of one cell drawn by the seed."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.fixtures import hostile
from dflash_bench.launch import free_port

EMU = ["--engine-arg=--ttft-ms=2", "--engine-arg=--itl-ms=1", "--engine-arg=--acceptance-length=4"]
CHEAP = {"gate", "gate-baseline", "export-baseline", "noise-from", "migrate", "quality"}
REPORTS, RESUMES = 10, 3  # of the cases, drawn by the seed: the report and the resume are the slow readers


@pytest.fixture(scope="module")
def made(tmp_path_factory, data_dir) -> tuple[Path, Path]:
    """A finished emulator sweep holding every file a folder can (hostile.every_file) and its baseline."""
    out = tmp_path_factory.mktemp("fuzz") / "out"
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", "org/emulated", "--drafter",
                           "org/emulated-dflash", "--engine", "emulator", "--runner", "process", "--suites", "gsm8k",
                           "--concurrency", "1", "-n", "4", "--max-tokens", "16", "--port", str(free_port()), "--out",
                           str(out), "--data-dir", str(data_dir), "--save-token-ids", *EMU], capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = [p for p in out.iterdir() if (p / "manifest.json").exists()]
    return folder, hostile.every_file(folder, data_dir)


def test_every_reader_answers_hostile_files_in_one_sentence(made, tmp_path, data_dir):
    folder, baseline = made
    seed = hostile.seed()
    rnd = random.Random(seed)
    cases = hostile.cases(folder)
    assert {name for name, _ in cases} >= {"manifest.json", "results.csv", "baseline.json", "logs/emulator-ar.log",
                                           *(f"cells/emulator-dflash-gsm8k-c1/{f}" for f in (
                                               "summary.json", "requests.jsonl", "server_metrics.json", "telemetry.csv",
                                               "lossless.jsonl", "accuracy.jsonl"))}
    layouts = [i for i, (_, kind) in enumerate(cases) if kind in hostile.LAYOUTS]
    assert {cases[i][1] for i in layouts} == set(hostile.LAYOUTS)
    every = os.environ.get("DFLASH_BENCH_FUZZ_ALL") == "1"
    slow = rnd.sample(range(len(cases)), REPORTS + RESUMES)
    cell = rnd.choice(sorted({cases[i][0] for i in layouts}))
    resumed = {i for i in layouts if cases[i][0] == cell}
    broke = []
    for i, case in enumerate(cases):
        def keep(label: str, i=i) -> bool:
            return every or label in CHEAP or label == "report" and (i in slow[:REPORTS] or i in layouts) or \
                label == "resume" and (i in slow[REPORTS:] or i in resumed)
        broke += hostile.play(case, folder, baseline, tmp_path, data_dir, rnd, keep, free_port)
    shutil.rmtree(tmp_path / "folder", ignore_errors=True)
    assert not broke, f"{len(broke)} broke (seed {seed}: DFLASH_BENCH_FUZZ_SEED={seed} reproduces):\n" + "\n".join(broke[:20])
