"""`dflash-bench demo`, README's main job, end to end on the CPU: builtin engine, every offline suite, report."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_runs_every_suite_and_writes_the_report(tmp_path, data_dir):
    out = tmp_path / "reports"
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "demo", "--data-dir", str(data_dir), "--out", str(out),
                           "--concurrency", "1,2", "-n", "2", "--max-tokens", "8", "--repeats", "2"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("report: ")
    page = last.removeprefix("report: ")
    assert page.endswith("report.html") and open(page).read().startswith("<!DOCTYPE html>")
    (folder,) = [p for p in out.iterdir() if (p / "manifest.json").exists()]
    rows = list(csv.DictReader(open(folder / "results.csv")))
    suites = {r["suite"] for r in rows}
    assert suites == {"gsm8k", "math500", "humaneval", "mbpp", "mt-bench", "spec-bench"}  # speed-bench needs prepared data
    assert len(rows) == len(suites) * 2 * 2 * 2 and all(r["status"] == "complete" for r in rows)
    # the final table gives each speedup as the repeats' median with their lowest-highest
    assert "speedup over 2 repeats: median (lowest-highest)" in proc.stdout
    spreads = re.findall(r"(\d+\.\d\d)x \((\d+\.\d\d)-(\d+\.\d\d)\)", proc.stdout)
    assert len(spreads) == len(suites) * 2 and all(float(lo) <= float(mid) <= float(hi) for mid, lo, hi in spreads)
    # the builtin engine is lossless: every DFlash cell matches its AR cell token for token at temperature 0
    for r in rows:
        if r["mode"] == "dflash":
            assert r["lossless_exact_match_rate"] == "1.0", (r["cell_id"], r["lossless_status"])
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["servers"]["builtin-dflash"]["command"][:2] == ["dflash-bench", "serve"]
    command = manifest["servers"]["builtin-dflash"]["command"]
    assert {"--fast", "--cut-draft"} <= set(command) and command[command.index("--verify-width") + 1] == "8"
    # at one fixed width tau is a property of the code: the same in every repeat and at either concurrency (the same
    # prompts), so a baseline of one run gates the next with the tight threshold
    taus: dict[str, set[str]] = {}
    for r in rows:
        if r["mode"] == "dflash":
            taus.setdefault(r["suite"], set()).add(r["acceptance_length"])
    assert all(len(t) == 1 and float(next(iter(t))) > 1.5 for t in taus.values()), taus


class _Hub:
    """A TCP listener standing in for an unreachable hub: it accepts each connection and closes it unanswered,
    counting them (a client that retries shows up as many)."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.connections = 0
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def _offline_env(hub: _Hub) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DFLASH_BENCH_DATA", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    return {**env, "HF_ENDPOINT": hub.url, "COLUMNS": "200"}


def test_demo_options_are_checked_before_any_prompt_set_loads(tmp_path):
    hub = _Hub()
    try:
        proc = subprocess.run([sys.executable, "-m", "dflash_bench", "demo", "--concurrency", "0", "--out", str(tmp_path)],
                              capture_output=True, text=True, timeout=120, env=_offline_env(hub))
    finally:
        hub.close()
    assert proc.returncode == 2 and proc.stderr.strip() == "error: --concurrency takes positive integers, e.g. 1,8,32"
    assert hub.connections == 0 and list(tmp_path.iterdir()) == []
    hub = _Hub()  # the sweep's too: its plan is checked before it sizes itself from the prompts
    try:
        proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", "Qwen3-8B", "--gpu", "h100",
                               "--concurrency", "1,1", "--out", str(tmp_path)],
                              capture_output=True, text=True, timeout=120, env=_offline_env(hub))
    finally:
        hub.close()
    assert proc.returncode == 2 and proc.stderr.strip() == "error: --concurrency lists a value twice", proc.stderr
    assert hub.connections == 0 and list(tmp_path.iterdir()) == []


def test_an_unreachable_hub_is_one_sentence_after_one_try(tmp_path):
    """Without --data-dir, a hub that does not answer is found by one request, not by the hub client's retries."""
    hub = _Hub()
    try:
        for args in (["demo", "--out", str(tmp_path)], ["suites", "show", "gsm8k"]):
            before = hub.connections
            proc = subprocess.run([sys.executable, "-m", "dflash_bench", *args], capture_output=True, text=True,
                                  timeout=300, env=_offline_env(hub))
            errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
            assert proc.returncode == 2 and len(errors) == 1, proc.stderr
            assert f"the Hugging Face hub ({hub.url}) cannot be reached" in errors[0] and "--data-dir" in errors[0]
            assert "Traceback" not in proc.stderr and "skipping" not in proc.stderr
            assert hub.connections - before == 1, (args, hub.connections - before)
    finally:
        hub.close()
    assert list(tmp_path.iterdir()) == []
