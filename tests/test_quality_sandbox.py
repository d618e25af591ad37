"""Hostile model-written programs are contained by the sandbox, and the harness carries on."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from dflash_bench.quality.sandbox import Limits, run_many, run_program

FAST = Limits(timeout_s=2, cpu_s=2, memory_mb=512, nproc=16, file_mb=1)


def sandbox_processes() -> list[int]:
    """Processes still running a sandboxed program (their command line names a dflash-sandbox folder)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"dflash-sandbox-" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_right_and_wrong_programs_and_clean_environment(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    ok = run_program("import os, sys\nprint(sorted(os.environ))\nopen('scratch.txt', 'w').write('own folder is fine')", FAST)
    assert ok.passed and ok.reason == "passed"
    assert "HF_TOKEN" not in ok.stdout and "hf_secret_value" not in ok.stdout
    bad = run_program("assert sorted([3, 1, 2]) == [3, 2, 1]", FAST)
    assert not bad.passed and bad.reason == "exit 1" and "AssertionError" in bad.stderr
    assert [r.passed for r in run_many(["pass", "raise SystemExit(3)", "pass"], FAST)] == [True, False, True]


@pytest.mark.parametrize("code", [
    "while True:\n    pass",
    "import time\ntime.sleep(60)",
    "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
], ids=["busy-loop", "sleep", "fork-bomb"])
def test_hangs_and_fork_bombs_are_killed(code):
    r = run_program(code, FAST)
    assert not r.passed and r.reason in ("timeout after 2s", "killed by SIGXCPU")
    assert r.duration_s < 10
    assert sandbox_processes() == []  # the namespace (or process group) went down with it


def test_fork_is_capped():
    code = "import os\nn = 0\ntry:\n    while n < 500:\n        if os.fork() == 0:\n            import time; time.sleep(30)\n        n += 1\n" \
           "except OSError:\n    print('capped at', n, flush=True)\n    os._exit(0)\nprint('forked', n)"
    r = run_program(code, FAST)
    assert "capped at" in r.stdout
    if r.isolation.get("user") == "nobody":  # otherwise the cap also counts the user's other processes
        assert int(r.stdout.split()[-1]) <= FAST.nproc
    assert sandbox_processes() == []


def test_huge_allocation_fails_and_harness_survives():
    r = run_program("x = bytearray(8 * 1024 ** 3)\nprint('allocated')", FAST)
    assert not r.passed and "allocated" not in r.stdout and "MemoryError" in r.stderr
    assert run_program("print(sum(range(10)))", FAST).stdout.strip() == "45"


def test_writes_and_deletes_outside_its_folder_are_blocked(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    os.chmod(tmp_path, 0o777)  # even a world-writable folder is out of reach
    target = tmp_path / "escape.txt"
    r = run_program(f"import os\nos.remove({str(victim)!r})", FAST)
    assert not r.passed and victim.read_text() == "keep me"
    r = run_program(f"open({str(target)!r}, 'w').write('x')", FAST)
    assert not r.passed and not target.exists()


def test_file_size_is_capped():
    r = run_program("open('big.bin', 'wb').write(b'x' * (8 * 1024 * 1024))", FAST)
    assert not r.passed


def test_network_is_unreachable():
    tcp = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.5)
    try:
        port_tcp, port_udp = tcp.getsockname()[1], udp.getsockname()[1]
        r = run_program(f"import socket\nsocket.create_connection(('127.0.0.1', {port_tcp}), timeout=1)\nprint('connected')", FAST)
        assert not r.passed and "connected" not in r.stdout
        # UDP is not covered by Landlock: only the fresh network namespace stops it
        r = run_program(f"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                        f"s.sendto(b'leak', ('127.0.0.1', {port_udp}))\nprint('sent')", FAST)
        if r.isolation.get("network") != "namespace":
            pytest.skip(f"no network namespace on this machine: {r.isolation.get('network')}")
        assert not r.passed and "sent" not in r.stdout
        with pytest.raises(socket.timeout):
            udp.recvfrom(16)
    finally:
        tcp.close()
        udp.close()


def test_program_cannot_signal_the_harness():
    # the harness and its parent; a parent that is PID 1 (pytest orphaned, or a container's init) is left out: inside
    # the sandbox's PID namespace that number is the sandbox's own init, which ignores a SIGKILL from within
    targets = tuple(p for p in (os.getpid(), os.getppid()) if p != 1)
    code = (f"import os, signal\nfor target in {targets!r}:\n    try:\n        os.kill(target, signal.SIGKILL)\n"
            "    except OSError as err:\n        print('blocked', err.errno)\nos.kill(0, signal.SIGKILL)\n")
    r = run_program(code, FAST)
    assert r.stdout.count("blocked") == len(targets)  # we are still here to read it
    assert sandbox_processes() == []
