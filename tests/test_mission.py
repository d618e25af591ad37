"""benchmarks/peers/mission.sh: the mission's GPU-host calls, rehearsed on the CPU through the emulator step."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "peers" / "mission.sh"
LONG = ("gsm8k", "mt_bench", "spec_bench")  # the long steps' prompts are Spec-Bench's text


def mission(tmp_path: Path, data_dir: Path, *args: str, data: tuple[str, ...] = ("gsm8k", "mt_bench"),
            wait: bool = True, script: Path = SCRIPT, **env: str) -> Any:
    """mission.sh over copies of the suites the steps measure (Spec-Bench: the long prompts' text), which are all
    the shape's tokenizer trains on (`wait`: run to its end, a CompletedProcess; else the running Popen, in a
    session of its own; `script`: the script of another tree). Each sweep's servers take free ports of their own."""
    folder = tmp_path / "data"
    if not folder.exists():
        folder.mkdir()
        for suite in data:
            shutil.copytree(data_dir / suite, folder / suite)
    full = dict(os.environ, OUT=str(tmp_path / "out"), MISSION_WORK=str(tmp_path / "work"), DFLASH_BENCH_DATA=str(folder),
                PYTHONPATH=str(ROOT), MISSION_CARRY=str(tmp_path / "carry"))  # not the checkout's own .mission
    full.update(env)
    if not wait:
        return subprocess.Popen(["bash", str(script), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=full, start_new_session=True)
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=full, timeout=600)


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
    """The script's clock (`date +%s`) is a file this test moves: it stands still until the first step's sweep has a
    complete cell, then jumps past the deadline, so the cut falls mid-sweep however loaded the machine is (the
    emulator's cells sleep their tokens, so the rest of the sweep cannot finish before the cut)."""
    clock, bin_dir = tmp_path / "clock", tmp_path / "bin"
    clock.write_text("1000000000\n")
    bin_dir.mkdir()
    (bin_dir / "date").write_text(f'#!/bin/sh\nif [ "$*" = "+%s" ]; then cat {clock}; else exec {shutil.which("date")} "$@"; fi\n')
    (bin_dir / "date").chmod(0o755)
    proc = mission(tmp_path, data_dir, "--seconds", "600", "emulator", "emulator", wait=False,
                   PATH=f"{bin_dir}:{os.environ['PATH']}")
    sweeps = tmp_path / "work" / "sweeps" / "emulator-gemma-4-31B-it-h100-tp1"
    try:
        while not any(json.loads(f.read_text())["status"] == "complete" for f in sweeps.glob("*/cells/*/summary.json")):
            assert proc.poll() is None, (tmp_path / "out" / "mission.log").read_text()
            time.sleep(0.2)
        clock.write_text(f"{1000000000 + 600}\n")  # the deadline has passed
        proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = (tmp_path / "out" / "mission.log").read_text()
    assert proc.returncode == 0, log
    assert "== emulator: the deadline: stopping it" in log
    assert "skipped," in log.split("== emulator: exit")[-1]  # the second step had no time left
    folders = list((tmp_path / "out" / "sweeps" / "emulator-gemma-4-31B-it-h100-tp1").iterdir())
    assert len(folders) == 1
    manifest = json.loads((folders[0] / "manifest.json").read_text())
    statuses = [c["status"] for c in manifest["plan"]]
    assert len(statuses) == 12 and "complete" in statuses and statuses.count("complete") < 12
    ps = subprocess.run(["pgrep", "-f", str(tmp_path / "work")], capture_output=True, text=True)
    assert ps.stdout.strip() == ""  # no server or sweep of this run is left behind


def test_a_dry_run_plans_every_vllm_and_sglang_step_without_unpacking_their_bundles(tmp_path, data_dir):
    """Both bundles on the machine (a tree of the repository's code whose bundles leave a mark when sourced or
    unpacked, and fail): a dry run of every vllm and sglang step plans its command, and touches neither bundle."""
    repo, mark = tmp_path / "repo", tmp_path / "touched"
    repo.mkdir()
    for entry in ("benchmarks", "dflash_bench", "tools"):
        (repo / entry).symlink_to(ROOT / entry)
    for bundle in (".vllm-bundle", ".sglang-bundle"):
        (repo / bundle).mkdir()
        (repo / bundle / "setup.sh").write_text(f"echo {bundle} sourced >> {mark}; return 1\n")
        (repo / bundle / "unpack.py").write_text(f"open({str(mark)!r}, 'a').write('{bundle} unpacked')\nraise SystemExit(1)\n")
    steps = ("vllm-pair", "vllm", "vllm-tau", "vllm-long", "sglang")
    proc = mission(tmp_path, data_dir, "--gpu", "h200", "--suites", "gsm8k", "-c", "1", "--seconds", "3600", *steps,
                   data=LONG, script=repo / "benchmarks" / "peers" / "mission.sh", MISSION_DRY_RUN="1")
    log = (tmp_path / "out" / "mission.log").read_text()
    assert proc.returncode == 0 and "Traceback" not in log, log
    assert not mark.exists(), mark.read_text()
    parts = log.split("== ")[1:]
    assert [p.split(":")[0] for p in parts[::2]] == list(steps)
    planned = {"vllm-pair": "+ python3 -m benchmarks.peers.two_clients --engine vllm",  # what each step would run
               "sglang": "python3 -m sglang.launch_server --model-path"}
    for step, part in zip(steps, parts[::2]):
        assert "is not unpacked" in part and planned.get(step, "\nVLLM_SERVER_DEV_MODE=1 vllm serve ") in part, part
    assert all(f"== {step}: exit 0" in log for step in steps), log
    # not a dry run: a bundle that is here and does not set up fails its step in one sentence (a bundle that is not
    # here skips it, as the other tests' machines without bundles show)
    mark.unlink(missing_ok=True)
    proc = mission(tmp_path, data_dir, "--gpu", "h200", "--suites", "gsm8k", "-c", "1", "--seconds", "3600", "vllm",
                   "sglang", data=LONG, script=repo / "benchmarks" / "peers" / "mission.sh")
    log = (tmp_path / "out" / "mission.log").read_text()
    assert mark.read_text().split("\n")[:2] == [".vllm-bundle sourced", ".sglang-bundle sourced"], mark.read_text()
    for bundle, step in ((".vllm-bundle", "vllm"), (".sglang-bundle", "sglang")):
        assert f"failed: {bundle}/setup.sh did not set the bundle up" in log and f"== {step}: exit 1" in log, log


def test_the_vllm_steps_take_a_token_budget_and_resume_only_a_sweep_of_the_same_engine_args(tmp_path, data_dir):
    """--batched-tokens is the vllm steps' --max-num-batched-tokens; a sweep left on the machine with another budget
    is not resumed (its settings would refuse the resume), one with the same is."""
    from dflash_bench.settings import DEFAULT_MODES

    repo = tmp_path / "repo"
    repo.mkdir()
    for entry in ("benchmarks", "dflash_bench", "tools"):
        (repo / entry).symlink_to(ROOT / entry)
    (repo / ".vllm-bundle").mkdir()  # a dry run plans the step without setting the bundle up
    left = tmp_path / "work" / "sweeps" / "vllm-gemma-4-31B-it-h200-tp1" / "20261130-000000-gemma-4-31B-it-vllm"
    left.mkdir(parents=True)
    args = ["--load-format=dummy", "--attention-backend=triton_attn", "--max-num-batched-tokens=8192", "--seed=0"]
    (left / "manifest.json").write_text(json.dumps({"settings": {"modes": list(DEFAULT_MODES), "engine_args": args}}))
    script = repo / "benchmarks" / "peers" / "mission.sh"
    step = ("--gpu", "h200", "--suites", "gsm8k", "-c", "1", "vllm")
    mission(tmp_path, data_dir, *step, script=script, MISSION_DRY_RUN="1")
    same = next(ln for ln in (tmp_path / "out" / "mission.log").read_text().splitlines() if " sweep " in ln)
    assert f"--resume {left}" in same and "--engine-arg=--max-num-batched-tokens=8192" in same
    shutil.rmtree(tmp_path / "out")
    mission(tmp_path, data_dir, "--batched-tokens", "16384", *step, script=script, MISSION_DRY_RUN="1")
    other = next(ln for ln in (tmp_path / "out" / "mission.log").read_text().splitlines() if " sweep " in ln)
    assert "--engine-arg=--max-num-batched-tokens=16384" in other and "--resume" not in other
    bad = mission(tmp_path, data_dir, "--batched-tokens", "8k", "vllm")
    assert bad.returncode == 2 and bad.stderr.strip() == "mission.sh: --batched-tokens takes a positive number of " \
                                                         "tokens, not '8k'"


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


def _rates(line: str, flag: str) -> list[float]:
    if flag == "--speculative-config":
        config = json.loads(line.split("--speculative-config '", 1)[1].split("'", 1)[0])
        assert config["rejection_sample_method"] == "synthetic" and "synthetic_acceptance_length" not in config
        return config["synthetic_acceptance_rates"]
    return [float(r) for r in line.split(flag + " ", 1)[1].split()[0].split(",")]


def test_the_gpu_steps_dry_run_with_one_profile_per_suite_for_vllm_and_the_builtin_engine(tmp_path, data_dir):
    """MISSION_DRY_RUN: every synthetic-tau step's plan and server commands as the GPU call will run them, on two
    GPUs: DFlash only, at each suite's card tau, the same rates for vLLM and the builtin engine; the input-length
    steps' long suites at one profile (one server); no bundle needed."""
    proc = mission(tmp_path, data_dir, "--gpu", "h200", "--tp", "2", "--suites", "gsm8k,mt-bench", "vllm-tau",
                   "builtin-tau", "vllm-long", "builtin-long", data=LONG, MISSION_DRY_RUN="1")
    log = (tmp_path / "out" / "mission.log").read_text()
    assert proc.returncode == 0 and "Traceback" not in log and "error:" not in log, log
    for step in ("vllm-tau", "builtin-tau", "vllm-long", "builtin-long"):
        assert f"== {step}: exit 0" in log, log
    tau, _, long = log.partition("== vllm-long:")
    assert "-ar-" not in tau and "--modes dflash --synthetic-acceptance card" in tau
    vllm = [ln for ln in tau.splitlines() if ln.startswith("VLLM_SERVER_DEV_MODE=1 vllm serve") and "--speculative-config" in ln]
    builtin = [ln for ln in tau.splitlines() if ln.startswith("dflash-bench serve") and "--mode dflash" in ln]
    assert len(vllm) == len(builtin) == 2  # a server per suite: gsm8k, mt-bench
    for a, b in zip(vllm, builtin):
        assert _rates(a, "--speculative-config") == _rates(b, "--synthetic-acceptance-rates")
        assert "--tensor-parallel-size 2" in a and "--tensor-parallel-size 2" in b
    assert "synthetic τ 7.53, drawn (card gsm8k)" in tau and "synthetic τ 4.23, drawn (card mt-bench)" in tau
    assert all(f"-{s}-c{c}" in long for s in ("long-128", "long-1k", "long-4k") for c in (1, 8))
    assert long.count("(card mean of math500, gsm8k, humaneval, mbpp, mt-bench)") == 2  # one server, each engine


def test_the_plain_steps_take_modes_the_builtin_engine_without_eagle3(tmp_path, data_dir):
    """--modes ar: the plain vllm and builtin steps plan AR cells only (the -tau steps' DFlash cells are read against
    them); eagle3 reaches vLLM's sweep, not the builtin engine's, which has no EAGLE-3."""
    proc = mission(tmp_path, data_dir, "--gpu", "h200", "--suites", "gsm8k", "--modes", "ar,eagle3", "vllm", "builtin",
                   MISSION_DRY_RUN="1")
    log = (tmp_path / "out" / "mission.log").read_text()
    assert proc.returncode == 0 and "Traceback" not in log, log
    vllm, _, builtin = log.partition("== builtin:")
    assert "--modes ar,eagle3" in vllm and "vllm-eagle3-gsm8k-c1" in vllm and "vllm-dflash-" not in vllm
    sweep = next(line for line in builtin.splitlines() if line.startswith("+ ") and " sweep " in line)
    assert "--modes ar --" in sweep and "builtin-ar-gsm8k-c32" in builtin and "builtin-dflash-" not in builtin


def test_the_synthetic_steps_run_through_the_emulator(tmp_path, data_dir):
    """emulator-tau and emulator-long: the tau steps' sweeps end to end on the CPU; each DFlash cell records the
    profile its server drew."""
    proc = mission(tmp_path, data_dir, "--suites", "gsm8k,mt-bench", "-c", "1,2", "-n", "2", "--max-tokens", "32",
                   "--input-len", "128,1k", "--long-c", "1", "--long-tokens", "16", "emulator-tau", "emulator-long",
                   data=LONG)
    log = (tmp_path / "out" / "mission.log").read_text()
    assert proc.returncode == 0 and "== emulator-tau: exit 0" in log and "== emulator-long: exit 0" in log, log
    sweeps = tmp_path / "out" / "sweeps"
    (tau,) = (sweeps / "emulator-tau-gemma-4-31B-it-h100-tp1").iterdir()
    plan = json.loads((tau / "manifest.json").read_text())["plan"]
    assert [c["mode"] for c in plan] == ["dflash"] * 4 and all(c["status"] == "complete" for c in plan)
    for c in plan:
        summary = json.loads((tau / "cells" / c["cell_id"] / "summary.json").read_text())
        assert summary["synthetic_source"] == f"card {c['suite']}" and summary["synthetic_rates"] == c["synthetic"]["rates"]
    (long,) = (sweeps / "emulator-long-gemma-4-31B-it-h100-tp1").iterdir()
    plan = json.loads((long / "manifest.json").read_text())["plan"]
    assert {(c["mode"], c["suite"]) for c in plan} == {(m, s) for m in ("ar", "dflash")
                                                       for s in ("gsm8k", "long-128", "long-1k")}
    assert all(c["status"] == "complete" for c in plan)
    assert (tmp_path / "out" / "sweeps.tar.gz").stat().st_size > 0


def test_a_step_run_again_with_other_modes_starts_its_own_sweep_and_resumes_its_own_later(tmp_path, data_dir):
    """The random drafter's DFlash after a step's AR cells: the same step with --modes dflash must not resume the AR
    sweep (whose settings it contradicts: the sweep would refuse, and the call measure nothing); run again with
    --modes ar, the step resumes the AR sweep it made."""
    sweeps = tmp_path / "out" / "sweeps" / "emulator-gemma-4-31B-it-h100-tp1"
    folders: list[list[str]] = []
    for m in ("ar", "dflash", "ar"):
        proc = mission(tmp_path, data_dir, "--suites", "gsm8k", "-c", "1", "-n", "1", "--max-tokens", "8",
                       "--modes", m, "emulator")
        assert proc.returncode == 0, proc.stdout
        folders.append(sorted(f.name for f in sweeps.iterdir()))
    log = (tmp_path / "out" / "mission.log").read_text()
    assert log.count("== emulator: exit 0") == 3 and "cannot resume" not in log, log
    first, second = folders[0][0], (set(folders[1]) - set(folders[0])).pop()
    assert json.loads((sweeps / second / "manifest.json").read_text())["settings"]["modes"] == ["dflash"]
    assert folders[2] == folders[1]  # the third call made no sweep: it resumed the first
    assert f"--resume {tmp_path / 'work' / 'sweeps' / sweeps.name / first}" in log.split("== emulator: exit 0")[2]


def test_a_fresh_machine_resumes_the_sweeps_of_a_carried_xz_archive(tmp_path, data_dir):
    """OUT/sweeps.tar.gz recompressed by xz (half the size, where the carried files' 64 MiB leave no room for the gzip)
    and carried to a fresh machine (an empty work folder): the step resumes the sweep it holds, making none."""
    args = ("--suites", "gsm8k", "-c", "1", "-n", "1", "--max-tokens", "8", "--modes", "ar", "emulator")
    assert mission(tmp_path, data_dir, *args).returncode == 0
    (first,) = (tmp_path / "work" / "sweeps" / "emulator-gemma-4-31B-it-h100-tp1").iterdir()
    (tmp_path / "carry").mkdir()
    with (tmp_path / "carry" / "sweeps.tar.xz").open("wb") as xz:
        unpacked = subprocess.run(["gzip", "-dc", str(tmp_path / "out" / "sweeps.tar.gz")], capture_output=True, check=True)
        xz.write(subprocess.run(["xz", "-c"], input=unpacked.stdout, capture_output=True, check=True).stdout)
    shutil.rmtree(tmp_path / "work")
    shutil.rmtree(tmp_path / "out")
    proc = mission(tmp_path, data_dir, *args)
    log = (tmp_path / "out" / "mission.log").read_text()
    assert proc.returncode == 0 and f"the sweeps of {tmp_path / 'carry' / 'sweeps.tar.xz'} are resumed" in log, log
    assert f"--resume {first}" in log
    assert [f.name for f in first.parent.iterdir()] == [first.name]


def two_gpus(tmp_path: Path) -> str:
    """A PATH whose nvidia-smi lists two GPUs (the CPU machine has none)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf 'GPU 0: NVIDIA H200 (UUID: GPU-a)\\nGPU 1: NVIDIA H200 (UUID: GPU-b)\\n'\n")
    smi.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def test_parallel_steps_each_take_gpus_of_their_own_and_are_refused_past_the_machine(tmp_path, data_dir):
    """--parallel on a two-GPU machine: the first GPU step gets GPU 0, the next GPU 1 (an emulator step none); two
    steps of two GPUs each, or a step named twice, are refused in one sentence before anything runs."""
    path = two_gpus(tmp_path)
    proc = mission(tmp_path, data_dir, "--gpu", "h200", "--parallel", "builtin", "emulator", "vllm",
                   MISSION_DRY_RUN="1", PATH=path)
    log = (tmp_path / "out" / "mission.log").read_text()
    assert proc.returncode == 0, log
    assert "== builtin: " in log and " left, on CUDA_VISIBLE_DEVICES=0; its console: " in log.split("== builtin: ")[1]
    assert " left, on CUDA_VISIBLE_DEVICES=1; its console: " in log.split("== vllm: ")[1]
    assert " left, on no GPU; its console: " in log.split("== emulator: ")[1]
    for step in ("builtin", "emulator", "vllm"):
        console = (tmp_path / "out" / "logs" / f"{step}.console").read_text()
        assert f"--engine {step}" in console and console in log  # its console, then in the call's own
    shutil.rmtree(tmp_path / "out")
    proc = mission(tmp_path, data_dir, "--tp", "2", "--parallel", "builtin", "vllm", PATH=path)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "mission.sh: --parallel gives 2 GPU step(s) 2 GPU(s) each, 4 in all, and this machine has 2")
    proc = mission(tmp_path, data_dir, "--parallel", "vllm", "vllm", PATH=path)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "mission.sh: --parallel runs each step once, and 'vllm' is named twice")
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_parallel_steps_run_at_once_and_each_finishes_its_sweep(tmp_path, data_dir):
    """Two emulator steps at once: both are launched before either is waited for, each sweep ends whole in OUT, and
    nothing of either is left running."""
    proc = mission(tmp_path, data_dir, "--suites", "gsm8k", "-c", "1,2", "-n", "2", "--max-tokens", "16",
                   "--parallel", "emulator", "emulator-tau")
    log = (tmp_path / "out" / "mission.log").read_text()
    assert proc.returncode == 0 and "== emulator: exit 0" in log and "== emulator-tau: exit 0" in log, log
    first_exit = log.index("== emulator: exit")
    assert log.index("== emulator-tau: ") < log.index("== emulator: its console") < first_exit
    for name, modes in (("emulator", {"ar", "dflash"}), ("emulator-tau", {"dflash"})):
        (folder,) = (tmp_path / "out" / "sweeps" / f"{name}-gemma-4-31B-it-h100-tp1").iterdir()
        plan = json.loads((folder / "manifest.json").read_text())["plan"]
        assert {c["mode"] for c in plan} == modes and all(c["status"] == "complete" for c in plan)
    ps = subprocess.run(["pgrep", "-f", str(tmp_path / "work")], capture_output=True, text=True)
    assert ps.stdout.strip() == ""
