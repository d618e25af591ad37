"""The launch / stop / doctor / models commands as a user runs them: exit codes, one-line errors, dry runs."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dflash_bench", *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200", **(env or {})}, timeout=60)


def test_dry_run_prints_the_docker_command_of_the_card():
    out = cli("launch", "--engine", "vllm", "--model", "Qwen3-8B", "--mode", "dflash", "--gpu", "h100",
              "--engine-arg=--seed=0", "--dry-run", env={"HF_TOKEN": "hf_do_not_print"})
    assert out.returncode == 0, out.stderr
    argv = shlex.split(out.stdout)
    image = argv.index("vllm/vllm-openai:v0.29.0")
    opts, cmd = argv[:image], argv[image + 1:]
    assert opts[:2] == ["docker", "run"] and "--ipc=host" in opts and ["--network", "host"] == opts[
        opts.index("--network"):opts.index("--network") + 2]
    assert ["--gpus", "all"] == opts[opts.index("--gpus"):opts.index("--gpus") + 2]
    assert ["-e", "HF_TOKEN"] == opts[opts.index("-e"):opts.index("-e") + 2]  # by name: docker reads it
    assert "hf_do_not_print" not in out.stdout + out.stderr
    assert any(o.endswith(":/root/.cache/huggingface:rw") for o in opts)
    # The vLLM card's command after the image (the image's entrypoint is `vllm serve`).
    assert cmd == ["Qwen/Qwen3-8B", "--attention-backend", "flash_attn", "--max-num-batched-tokens", "32768",
                   "--speculative-config",
                   '{"method": "dflash", "model": "z-lab/Qwen3-8B-DFlash-b16", "num_speculative_tokens": 15}',
                   "--port", "8000", "--host", "127.0.0.1", "--seed=0"]  # loopback only: the harness is here


def test_dry_run_process_and_bridge_network_and_gpu_list():
    out = cli("launch", "-e", "sglang", "-m", "Qwen3.5-9B", "--mode", "ar", "--runner", "process", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 python3 -m sglang.launch_server "
                                 "--model-path Qwen/Qwen3.5-9B ")
    assert "DFLASH" not in out.stdout and "--enable-metrics" in out.stdout
    out = cli("launch", "-e", "vllm", "-m", "Qwen3-8B", "--runner", "process", "--gpus", "2,3", "--dry-run")
    assert out.stdout.startswith("CUDA_VISIBLE_DEVICES=2,3 vllm serve Qwen/Qwen3-8B ")  # --gpus for a process
    out = cli("launch", "-e", "sglang", "-m", "Qwen3-8B", "--network", "bridge", "--gpus", "0,1", "--dry-run")
    argv = shlex.split(out.stdout)
    assert ["-p", "127.0.0.1:30000:30000"] == argv[argv.index("-p"):argv.index("-p") + 2]
    assert ["--gpus", '"device=0,1"'] == argv[argv.index("--gpus"):argv.index("--gpus") + 2]
    assert ["--host", "0.0.0.0"] == argv[argv.index("--host"):argv.index("--host") + 2]  # reachable via the map


def test_gemma_on_vllm_warns_about_the_pr_build():
    out = cli("launch", "-m", "gemma-4-31B-it", "--dry-run")
    assert out.returncode == 0 and "needs a build of PR #41703" in out.stderr
    assert "needs" not in cli("launch", "-m", "gemma-4-31B-it", "--image", "me/vllm:pr", "--dry-run").stderr


@pytest.mark.parametrize("args,message", [
    (["launch", "-m", "Qwen9-1B", "--dry-run"], "error: unknown model 'Qwen9-1B': use one of gemma-4-31B-it"),
    (["launch", "-m", "Qwen3-8B", "-e", "tgi", "--dry-run"], "error: unknown engine 'tgi'"),
    (["launch", "-m", "Qwen3-8B", "--mode", "eagle", "--dry-run"], "error: unknown mode 'eagle'"),
    (["launch", "-m", "Qwen3-8B", "--gpu", "a100", "--dry-run"], "error: unknown GPU preset 'a100'"),
    (["launch", "-m", "Qwen3-8B", "--runner", "k8s"], "error: unknown runner 'k8s'"),
    (["launch", "-m", "Qwen3-8B", "--runner", "k8s", "--dry-run"], "error: unknown runner 'k8s'"),
    (["launch", "-m", "Qwen3-8B", "--gpus", "gpu0", "--dry-run"], "error: --gpus 'gpu0'"),
    (["launch", "-m", "Qwen3-8B", "--gpus", "0,,1", "--dry-run"], "error: --gpus '0,,1'"),
    (["launch", "-m", "Qwen3-8B", "--network", "overlay", "--dry-run"], "error: unknown network 'overlay'"),
    (["launch", "-m", "acme/x", "--dry-run"], "error: model x has no DFlash drafter"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    out = cli(*args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith(message) and "Traceback" not in out.stderr


def test_sweep_refuses_an_unknown_gpu_preset_before_its_folder(tmp_path):
    out = cli("sweep", "-m", "Qwen3-8B", "--engine", "emulator", "--gpu", "a100", "--out", str(tmp_path / "out"))
    assert out.returncode == 2 and "error: unknown GPU preset 'a100'" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "out").exists()  # no sweep folder of failed cells


def test_sweep_refuses_tensor_parallelism_on_a_one_gpu_engine_before_its_folder(tmp_path):
    out = cli("sweep", "-m", "Qwen3-8B", "--engine", "emulator", "--tensor-parallel-size", "2", "--out",
              str(tmp_path / "out"))
    assert out.returncode == 2 and "the emulator engine runs on one GPU" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "out").exists()


def test_process_launch_of_a_missing_engine_is_a_clear_error():
    out = cli("launch", "-e", "vllm", "-m", "Qwen3-8B", "--runner", "process",
              env={"PATH": os.path.dirname(sys.executable) + os.pathsep + "/nonexistent"})
    assert out.returncode == 2 and "error: cannot run 'vllm': it is not on PATH" in out.stderr


PAIR = os.path.join(os.path.dirname(__file__), "..", "dflash_bench", "assets", "default_pair")


def test_llamacpp_dry_run_shows_the_image_and_the_planned_gguf_files(tmp_path):
    env = {"DFLASH_BENCH_CACHE": str(tmp_path / "cache"), "DFLASH_BENCH_GGUF_TYPE": "f32"}
    args = ("launch", "-e", "llamacpp", "-m", f"{PAIR}/target", "--drafter", f"{PAIR}/drafter", "--mode", "dflash",
            "--dry-run")
    out = cli(*args, env=env)
    assert out.returncode == 0, out.stderr
    argv = shlex.split(out.stdout)
    cmd = argv[argv.index("ghcr.io/ggml-org/llama.cpp:server") + 1:]
    gguf = str(tmp_path / "cache" / "gguf")
    assert cmd[0] == "-m" and cmd[1].startswith(f"{gguf}/target-") and cmd[1].endswith("-f32.gguf")
    assert cmd[cmd.index("-md") + 1].startswith(f"{gguf}/drafter-") and "draft-dflash" in cmd
    assert not (tmp_path / "cache" / "gguf").exists()  # a dry run converts nothing
    cuda = shlex.split(cli(*args, "--gpu", "h100", env=env).stdout)
    assert "ghcr.io/ggml-org/llama.cpp:server-cuda" in cuda and "-ngl" in cuda
    bf16 = cli(*args, env={**env, "DFLASH_BENCH_GGUF_TYPE": "bf16"}).stdout
    assert "-bf16.gguf" in bf16 and "-f32.gguf" not in bf16  # the type is part of the cached file's key
    bad = cli(*args, env={**env, "DFLASH_BENCH_GGUF_TYPE": "q4"})
    assert bad.returncode == 2 and "error: unknown GGUF type 'q4'" in bad.stderr


def test_engines_build_refuses_an_engine_it_cannot_build():
    out = cli("engines", "build", "vllm")
    assert out.returncode == 2 and "error: cannot build 'vllm': only llamacpp" in out.stderr


def test_doctor_prints_one_yes_no_line_per_check():
    out = cli("doctor", env={"HF_TOKEN": "hf_secret_doctor"})
    assert out.returncode in (0, 1), out.stderr
    *lines, verdict = out.stdout.strip().splitlines()
    assert all(ln.startswith(("yes ", "no ")) for ln in lines), lines
    # every "no" says what it means for the user; the last line and the exit code say whether a GPU sweep can run
    assert all(" -> " in ln for ln in lines if ln.startswith("no ")), lines
    assert verdict.startswith("ready for " if out.returncode == 0 else "not ready: "), verdict
    names = [ln.split(":")[0][4:].strip() for ln in lines]
    assert names[:3] == ["GPUs", "docker daemon", "docker GPU runtime"]
    assert "vllm installed here (--runner process)" in names
    assert "HF_TOKEN" in names and "disk for the model cache" in names
    assert "yes  HF_TOKEN: set (value not shown)" in lines and "hf_secret_doctor" not in out.stdout
    nohf = cli("doctor", env={"HF_TOKEN": "", "HUGGING_FACE_HUB_TOKEN": ""})
    assert any(ln.startswith("no   HF_TOKEN") for ln in nohf.stdout.splitlines())


def test_without_a_docker_daemon_doctor_says_no_and_stop_still_runs(tmp_path):
    env = {"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock", "DFLASH_BENCH_RUN_DIR": str(tmp_path / "run")}
    out = cli("doctor", env=env)
    assert out.returncode == 1  # neither vLLM nor SGLang can run from its image without a daemon
    assert any(ln.startswith("no   docker daemon: cannot reach the Docker daemon") for ln in out.stdout.splitlines())
    assert "the docker daemon" in out.stdout.strip().splitlines()[-1]
    out = cli("stop", env=env)
    assert out.returncode == 0 and "nothing to stop" in out.stdout and "docker: skipped" in out.stderr


def test_doctor_exits_1_when_what_was_asked_for_cannot_run_here(tmp_path):
    hidden = {"DOCKER_HOST": f"unix://{tmp_path}/no-such.sock", "DFLASH_BENCH_CACHE": str(tmp_path / "cache"),
              "PATH": os.path.dirname(sys.executable)}  # no daemon, no llama-server on PATH nor built
    out = cli("doctor", "--engine", "emulator", env=hidden)  # it needs nothing of the machine
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "ready for emulator (--runner process)"
    out = cli("doctor", "--engine", "emulator,llamacpp", env=hidden)
    assert out.returncode == 1, out.stdout
    assert out.stdout.strip().splitlines()[-1] == "not ready: llamacpp (--runner process) needs llamacpp installed here"
    assert ("no   llamacpp installed here (--runner process): not found (dflash-bench engines build llamacpp) -> "
            "--engine llamacpp --runner process cannot start here") in out.stdout.splitlines()
    out = cli("doctor", "--engine", "llamacpp", "--runner", "docker", env=hidden)
    assert out.returncode == 1 and out.stdout.strip().endswith("needs the docker daemon")
    out = cli("doctor", "--engine", "nope")
    assert out.returncode == 2 and out.stderr.startswith("error: unknown engine 'nope'") and out.stdout == ""


@pytest.mark.slow
@pytest.mark.engine
def test_launch_keeps_the_builtin_engine_up_until_ctrl_c(tmp_path):
    """`dflash-bench launch --runner process` prints the URL, serves, and Ctrl-C leaves nothing running."""
    pytest.importorskip("transformers")
    import re
    import signal

    import httpx

    from dflash_bench.testing.tiny import make_tiny_pair
    from dflash_bench.launch import free_port
    from launch_helpers import group_alive, stop_harness
    from services import sigint_delivered

    target, drafter = make_tiny_pair(tmp_path / "tiny", block_size=4)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dflash_bench", "launch", "-e", "builtin", "-m", str(target), "--drafter", str(drafter),
         "--mode", "dflash", "--runner", "process", "--port", str(port), "--engine-arg=--device=cpu",
         "--log", str(tmp_path / "server.log")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "DFLASH_BENCH_RUN_DIR": str(tmp_path / "run")}, preexec_fn=sigint_delivered)
    pid = None
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"ready: http://127.0.0.1:{port}"), (line, proc.stderr.read() if proc.poll() else "")
        pid = int(re.search(r"pid (\d+)", line).group(1))
        assert "vllm:spec_decode_num_drafts_total" in httpx.get(f"http://127.0.0.1:{port}/metrics").text
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        assert not group_alive(pid)
    finally:
        stop_harness(proc, pid)
