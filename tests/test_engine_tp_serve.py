"""`serve --fast --tensor-parallel-size 2` as a real process on the CPU (two gloo ranks: rank 0 the server's engine
process, rank 1 its child): it answers, and its ranks live and die together: a rank killed takes the server down
with its reason, the server killed takes its rank with it, Ctrl-C leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
httpx = pytest.importorskip("httpx")

from dflash_bench.testing.tiny import make_tiny_pair  # noqa: E402
from launch_helpers import group_alive, pid_alive, wait_until  # noqa: E402
from dflash_bench.launch import free_port  # noqa: E402
from test_engine_server import wait_ready  # noqa: E402

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_tiny_pair(tmp_path_factory.mktemp("tp_serve"), arch="qwen3", seed=1, block_size=4, layers=2,
                          kv_heads=(2, 2))


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def start(pair) -> tuple[subprocess.Popen, str, int]:
    """The server in a process group of its own; returns it, its URL and its rank 1's pid (the child of the
    server's engine process, both started by multiprocessing's spawn)."""
    target, drafter = pair
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dflash_bench", "serve", "--model", str(target), "--draft",
                             str(drafter), "--fast", "--tensor-parallel-size", "2", "--device", "cpu", "--port",
                             str(port), "--max-model-len", "128", "--max-slots", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    def spawned(pid: int) -> list[int]:  # multiprocessing's spawn, not its resource tracker
        return [c for c in children(pid) if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]

    [engine] = spawned(proc.pid)
    rank1 = spawned(engine)
    assert len(rank1) == 1, children(engine)
    return proc, url, rank1[0]


def ask(url: str, pair) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"model": str(pair[0]), "prompt": "the cat sat", "max_tokens": 8,
                                                      "temperature": 0}, timeout=60)


def test_serves_and_ctrl_c_leaves_no_rank(pair):
    proc, url, rank1 = start(pair)
    try:
        r = ask(url, pair)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole group
        assert proc.wait(timeout=60) is not None
        assert wait_until(lambda: not group_alive(proc.pid), timeout=15), "a rank outlived the server"
    finally:
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_rank_that_dies_takes_the_server_down_saying_so(pair):
    proc, url, rank1 = start(pair)
    try:
        assert ask(url, pair).status_code == 200
        os.kill(rank1, signal.SIGKILL)
        code = proc.wait(timeout=15)  # no hang on a collective: within seconds
        out = proc.stdout.read() if proc.stdout else ""
        assert code != 0 and "tensor-parallel rank 1 exited" in out, out[-2000:]
        assert "Traceback" not in out
        assert wait_until(lambda: not group_alive(proc.pid), timeout=15)
    finally:
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_killed_server_takes_its_rank_with_it(pair):
    proc, url, rank1 = start(pair)
    try:
        # no handler runs: the engine's process sees its pipe close and stops rank 1 (or the kernel ends rank 1 with
        # its parent-death signal)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=15)
        assert wait_until(lambda: not pid_alive(rank1), timeout=15), "rank 1 outlived a killed server"
    finally:
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize("flag", [["--tensor-parallel-size", "2"], ["--enforce-eager"]])
def test_a_fast_path_flag_without_fast_is_one_sentence(pair, flag):
    out = subprocess.run([sys.executable, "-m", "dflash_bench", "serve", "--model", str(pair[0]), "--device", "cpu",
                          "--port", str(free_port()), *flag], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"{' '.join(flag)} runs on the fast path only: add --fast" in out.stderr, out.stderr
