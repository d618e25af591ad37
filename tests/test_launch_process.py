"""The local-process launcher against real servers: readiness, log tails, watchdog, teardown, signals."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import httpx
import pytest

from dflash_bench.launch import ServerDied, ServerNotReady, free_port, launch_command
from launch_helpers import group_alive, pid_alive, server_argv, start_harness, stop_harness, wait_until


@pytest.fixture(autouse=True)
def _run_dir(tmp_path, monkeypatch):
    """Each test records its process servers in its own registry folder."""
    monkeypatch.setenv("DFLASH_BENCH_RUN_DIR", str(tmp_path / "run"))


def test_ready_serves_then_whole_group_is_gone(tmp_path):
    port, log = free_port(), tmp_path / "logs" / "server.log"
    with launch_command(server_argv(port, "child"), port=port, log_path=log, name="test") as server:
        assert httpx.get(server.url + "/health").status_code == 200
        pid = server.info.pid
        child = int(re.search(r"child pid (\d+)", log.read_text()).group(1))
        assert group_alive(pid) and pid_alive(child)
        assert list((tmp_path / "run").glob("*.json"))  # recorded for `dflash-bench stop`
        server.check()
        assert server.info.runner == "process" and server.info.url == f"http://127.0.0.1:{port}"
    assert not group_alive(pid) and not pid_alive(child)
    assert not list((tmp_path / "run").glob("*.json"))
    assert "test server listening" in log.read_text()  # the log stays for the sweep folder


def test_exit_during_startup_gives_exit_code_and_log_tail(tmp_path):
    port = free_port()
    with pytest.raises(ServerDied) as err:
        with launch_command(server_argv(port, "exit"), port=port, name="vllm-dflash"):
            pytest.fail("a server that exited must not be yielded")
    msg = str(err.value)
    assert msg.startswith("the vllm-dflash server exited during start-up with code 3")
    assert "start-up line 59" in msg and "start-up line 20" in msg and "start-up line 19" not in msg  # 40 lines
    assert not isinstance(err.value, ServerNotReady)


def test_never_ready_times_out_with_log_tail_and_stops_it(tmp_path):
    port, log = free_port(), tmp_path / "s.log"
    with pytest.raises(ServerNotReady, match=r"did not answer 200 on /health within 2 s(.|\n)*test server listening"):
        with launch_command(server_argv(port, "never-ready"), port=port, log_path=log, ready_timeout=2.0):
            pass
    assert log.exists()  # a log the caller asked for is kept
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


def test_watchdog_notices_a_server_that_dies_mid_run(tmp_path):
    """...and its reason names the line after it was ready that says why, though 60 lines of echoes follow it."""
    port, log = free_port(), tmp_path / "s.log"
    cause = "torch.OutOfMemoryError: CUDA out of memory (the test's line)"
    with launch_command(server_argv(port), port=port, name="sglang-ar", log_path=log) as server:
        with open(log, "a") as fh:
            fh.write("\n".join([cause] + ["ERROR EngineDeadError: see above"] * 60) + "\n")
        os.kill(server.info.pid, signal.SIGKILL)
        assert server.died.wait(5.0), "the watchdog did not notice within 5 s"
        with pytest.raises(ServerDied, match=r"the sglang-ar server exited with code -9") as err:
            server.check()
    assert err.value.reason.startswith(f"the sglang-ar server exited with code -9: {cause} | ")
    assert cause not in err.value.log_tail  # 40 lines: the cause came from above them


@pytest.mark.parametrize("sig,codes", [(signal.SIGINT, (-2, 1, 130)), (signal.SIGTERM, (143,))])
def test_signal_to_the_harness_leaves_no_process(sig, codes):
    port = free_port()
    harness, pid = start_harness({"argv": server_argv(port, "child"), "port": port, "runner": "process"})
    try:
        pid = int(pid)
        assert group_alive(pid)
        harness.send_signal(sig)
        rc = harness.wait(timeout=30)
        assert rc in codes, harness.stderr.read()
        assert not group_alive(pid)
    finally:
        stop_harness(harness, int(pid))


def test_stop_removes_servers_of_a_killed_harness(tmp_path):
    port = free_port()
    harness, pid = start_harness({"argv": server_argv(port), "port": port, "runner": "process",
                                  "log_path": str(tmp_path / "h.log")})
    pid = int(pid)
    try:
        env = {**os.environ, "DFLASH_BENCH_RUN_DIR": str(tmp_path / "run")}
        # While the harness runs, plain `stop` keeps its server.
        out = subprocess.run([sys.executable, "-m", "dflash_bench", "stop"], capture_output=True, text=True, env=env)
        assert out.returncode == 0 and "nothing to stop" in out.stdout and group_alive(pid)
        harness.kill()  # SIGKILL: no teardown runs
        harness.wait(timeout=10)
        assert group_alive(pid)
        out = subprocess.run([sys.executable, "-m", "dflash_bench", "stop"], capture_output=True, text=True, env=env)
        assert out.returncode == 0 and f"process group {pid}" in out.stdout
        assert wait_until(lambda: not group_alive(pid), 5)
    finally:
        stop_harness(harness, pid)


def test_dflash_bench_runs_without_its_script_on_path(tmp_path, monkeypatch):
    # The builtin engine's `dflash-bench ...` command runs as `python -m dflash_bench` when the script
    # is not on PATH. `--version` exits at once, so the launcher reports a start-up exit with its output.
    bindir = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != bindir))
    with pytest.raises(ServerDied, match=r"exited during start-up with code 0(.|\n)*dflash-bench \d"):
        with launch_command(["dflash-bench", "--version"], port=free_port(), log_path=tmp_path / "v.log"):
            pass


def test_unknown_runner_and_missing_program_are_user_errors():
    from dflash_bench.errors import UserError

    with pytest.raises(UserError, match="unknown runner 'k8s'"):
        with launch_command(["x"], port=1, runner="k8s"):
            pass
    with pytest.raises(UserError, match="cannot run 'no-such-engine-binary': it is not on PATH"):
        with launch_command(["no-such-engine-binary", "--port", "1"], port=1):
            pass


def test_stop_leaves_alone_a_process_group_that_reused_a_stale_record(tmp_path):
    """A record outlives its server (harness and server both gone); later an unrelated program gets the same
    process-group id. `stop --all` must not kill it: the group's leader runs another command."""
    import json

    from dflash_bench.launch.local_process import stop_leftovers

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        run = tmp_path / "run"
        run.mkdir(exist_ok=True)
        (run / f"{other.pid}.json").write_text(json.dumps({
            "pgid": other.pid, "owner_pid": 2 ** 22 + 1, "argv": ["vllm", "serve", "Qwen/Qwen3-8B", "--port", "8000"],
            "url": "http://127.0.0.1:8000", "started": 0}))
        assert stop_leftovers(all_=True) == []
        assert other.poll() is None and not (run / f"{other.pid}.json").exists()  # the stale record is dropped
    finally:
        other.kill()
        other.wait()


def test_the_default_registry_leaves_nothing_in_the_temp_folder(tmp_path, monkeypatch):
    """Without DFLASH_BENCH_RUN_DIR the servers are recorded under the system temp folder: once the last one is
    stopped, its record and the folders made for it are gone, and a folder another record keeps stays."""
    import tempfile

    temp = tmp_path / "system-temp"
    temp.mkdir()
    monkeypatch.delenv("DFLASH_BENCH_RUN_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    port = free_port()
    with launch_command(server_argv(port, "child"), port=port, log_path=tmp_path / "s.log", name="test") as server:
        (record,) = temp.glob(f"dflash-bench-*/servers/{server.info.pid}.json")
    assert list(temp.iterdir()) == []
    other = record.parent / "1.json"  # another harness's server, still running
    other.parent.mkdir(parents=True)
    other.write_text("{}")
    port = free_port()
    with launch_command(server_argv(port, "child"), port=port, log_path=tmp_path / "s.log", name="test"):
        pass
    assert [p.name for p in record.parent.iterdir()] == ["1.json"]
