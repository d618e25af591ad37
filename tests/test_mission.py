"""benchmarks/peers/mission.sh: the mission's GPU-host calls, rehearsed on the CPU through the emulator step."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "peers" / "mission.sh"


def mission(tmp_path: Path, data_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    data = tmp_path / "data"
    if not data.exists():  # the two suites the steps measure: the shape's tokenizer trains on these only
        data.mkdir()
        for suite in ("gsm8k", "mt_bench"):
            shutil.copytree(data_dir / suite, data / suite)
    full = dict(os.environ, OUT=str(tmp_path / "out"), MISSION_WORK=str(tmp_path / "work"), DFLASH_BENCH_DATA=str(data),
                PYTHONPATH=str(ROOT), **env)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=full, timeout=600)


def test_bad_arguments_get_one_sentence(tmp_path, data_dir):
    proc = mission(tmp_path, data_dir, "--gpu", "a100", "vllm")
    assert proc.returncode == 2 and proc.stderr.strip() == "mission.sh: --gpu takes h100 or h200, not 'a100'"
    proc = mission(tmp_path, data_dir, "vllm-pairs")
    assert proc.returncode == 2 and proc.stderr.startswith("mission.sh: unknown argument 'vllm-pairs'")
    proc = mission(tmp_path, data_dir)
    assert proc.returncode == 2 and "name at least one step" in proc.stderr
    proc = mission(tmp_path, data_dir, "--pair", "Qwen3-4B", "vllm")
    assert proc.returncode == 2 and proc.stderr.startswith("mission.sh: no recorded shape for --pair 'Qwen3-4B': use one of ")
    assert "gemma-4-26B-A4B-it" in proc.stderr


def test_another_pairs_steps_write_its_shape_and_plan_its_sweeps(tmp_path, data_dir):
    proc = mission(tmp_path, data_dir, "--pair", "gemma-4-26B-A4B-it", "--gpu", "h200", "vllm", "vllm-pair",
                   MISSION_DRY_RUN="1")
    log = (tmp_path / "out" / "mission.log").read_text()
    assert proc.returncode == 0, log
    assert "skipped: vllm-pair measures gemma-4-31B-it only" in log
    work = tmp_path / "work"
    assert json.loads((work / "gemma-4-26B-A4B-it" / "config.json").read_text())["num_experts"] == 128
    sweep = next(line for line in log.splitlines() if line.startswith("+ ") and " sweep " in line)
    assert f"--model {work}/gemma-4-26B-A4B-it --drafter {work}/gemma-4-26B-A4B-it-DFlash --engine vllm" in sweep
    assert f"--out {work}/sweeps/vllm-gemma-4-26B-A4B-it-h200-tp1" in sweep
    assert "a mixture of 128 experts, 8 a token" in log  # the dry run's weights line


def test_a_step_cut_by_the_deadline_leaves_its_sweep_folder_in_out_and_the_next_step_is_skipped(tmp_path, data_dir):
    proc = mission(tmp_path, data_dir, "--seconds", "30", "emulator", "emulator", MISSION_MIN_STEP_S="12")
    log = (tmp_path / "out" / "mission.log").read_text()
    assert proc.returncode == 0, log
    assert "== emulator: the deadline: stopping it" in log
    assert "skipped," in log.split("== emulator: exit")[-1]  # the second step had too little time left
    folders = list((tmp_path / "out" / "sweeps" / "emulator-gemma-4-31B-it-h100-tp1").iterdir())
    assert len(folders) == 1
    manifest = json.loads((folders[0] / "manifest.json").read_text())
    statuses = [c["status"] for c in manifest["plan"]]
    assert len(statuses) == 12 and "complete" in statuses and statuses.count("complete") < 12
    ps = subprocess.run(["pgrep", "-f", str(tmp_path / "work")], capture_output=True, text=True)
    assert ps.stdout.strip() == ""  # no server or sweep of this run is left behind


def test_the_eagle3_row_plans_an_eagle3_server_with_the_head_the_shape_writes(tmp_path, data_dir):
    proc = mission(tmp_path, data_dir, "--pair", "Qwen3-8B", "--gpu", "h200", "--modes", "ar,dflash,eagle3", "vllm",
                   MISSION_DRY_RUN="1")
    log = (tmp_path / "out" / "mission.log").read_text()
    assert proc.returncode == 0, log
    work = tmp_path / "work"
    assert json.loads((work / "Qwen3-8B-EAGLE3" / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    sweep = next(line for line in log.splitlines() if line.startswith("+ ") and " sweep " in line)
    assert f"--modes ar,dflash,eagle3 --eagle3 {work}/Qwen3-8B-EAGLE3" in sweep
    assert "vllm eagle3 (" in log and f'"method": "eagle3", "model": "{work}/Qwen3-8B-EAGLE3"' in log
