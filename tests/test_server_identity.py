"""The server measured is the one launched, with real processes: a foreign server on the port,
two sweeps on one port, a foreign server answering in place of the launched one, and a --url server replaced
mid-cell. And the watchdog: a server that dies is relaunched once, a second death fails the rest."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from benchmarks.fixtures.tampering import foreign_emulator as emulator
from dflash_bench import profiles
from dflash_bench.errors import UserError
from dflash_bench.launch import free_port, launch_command

PY = [sys.executable, "-m", "dflash_bench"]


def sweep_argv(out: Path, data_dir: Path, port: int, *extra: str, conc: str = "1", n: int = 4,
               itl: int = 1) -> list[str]:
    return [*PY, "sweep", "--model", "org/emulated", "--drafter", "org/emulated-dflash", "--engine", "emulator",
            "--runner", "process", "--suites", "gsm8k", "--concurrency", conc, "-n", str(n), "--max-tokens", "24",
            "--port", str(port), "--out", str(out), "--data-dir", str(data_dir), "--engine-arg=--ttft-ms=2",
            f"--engine-arg=--itl-ms={itl}", "--engine-arg=--acceptance-length=4", *extra]


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def folders(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if (p / "manifest.json").exists()) if out.exists() else []


def summaries(folder: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in folder.glob("cells/*/summary.json")}


def manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def test_a_foreign_server_on_the_port_is_refused_in_one_sentence(tmp_path, data_dir):
    port = free_port()
    foreign = emulator(port)
    try:
        proc = subprocess.run(sweep_argv(tmp_path / "out", data_dir, port), capture_output=True, text=True, timeout=120)
    finally:
        stop(foreign)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "telemetry" not in ln]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert f"port {port} is already in use by pid {foreign.pid}" in lines[0] and "--port" in lines[0]
    assert not folders(tmp_path / "out")  # nothing measured, no folder


@contextlib.contextmanager
def held(port: int) -> Iterator[None]:
    """`port` taken by a listening socket of this process for the block (or already taken by someone else)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        with contextlib.suppress(OSError):  # in use already: it is held, which is what the block needs
            sock.bind(("127.0.0.1", port))
            sock.listen()
        yield
    finally:
        sock.close()


def test_a_sweep_without_port_listens_on_free_ports_when_the_engines_default_is_taken(tmp_path, data_dir):
    """A user's sweep does not fail because another program holds the engine's default port: with no --port each
    launched server takes a free one."""
    default = profiles.get("emulator").default_port
    argv = sweep_argv(tmp_path / "out", data_dir, 0)
    del argv[argv.index("--port"):argv.index("--port") + 2]
    with held(default):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (folder,) = folders(tmp_path / "out")
    ports = {name: server["port"] for name, server in manifest(folder)["servers"].items()}
    assert set(ports) == {"emulator-ar", "emulator-dflash"} and default not in ports.values(), ports
    assert {s["status"] for s in summaries(folder).values()} == {"complete"}


def test_a_resume_with_nothing_left_to_measure_needs_no_free_port(tmp_path, data_dir):
    """A finished sweep resumed launches nothing, so the port it saved may be taken meanwhile."""
    folder = Path(shutil.copytree(Path(__file__).parent / "data" / "sweep_steady_flat", tmp_path / "s"))
    with held(manifest(folder)["settings"]["port"]):
        proc = subprocess.run([*PY, "sweep", "--resume", str(folder), "--data-dir", str(data_dir)],
                              capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert all(c["status"] == "complete" for c in manifest(folder)["plan"])


def test_a_launch_refuses_a_server_that_answers_in_place_of_the_one_started(tmp_path):
    """The launched command never listens; a server it starts in a session of its own (outside the launched
    process group) answers /health on the port. The launch fails naming that process, and tears down."""
    port = free_port()
    pidfile = tmp_path / "foreign.pid"
    script = ("import subprocess, sys, time\n"
              f"p = subprocess.Popen([sys.executable, '-m', 'dflash_bench', 'emulate', '--port', '{port}'], "
              "start_new_session=True, stdout=subprocess.DEVNULL)\n"
              f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
              "time.sleep(600)\n")
    try:
        with pytest.raises(UserError) as err:
            with launch_command([sys.executable, "-c", script], port=port, ready_timeout=120):
                pass
        foreign = int(pidfile.read_text())
        assert f"the server answering on port {port} is not the one launched (pid {foreign}" in str(err.value)
    finally:
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def test_two_sweeps_on_one_port_never_measure_each_others_server(tmp_path, data_dir):
    """The second sweep starts while the first one's AR cell runs on the port. However the two interleave, every
    cell ran on its own sweep's server with no request of the other sweep in its counters, or was refused
    naming the port; the second sweep, started mid-cell, is refused before it makes a folder."""
    port = free_port()
    one = subprocess.Popen(sweep_argv(tmp_path / "one", data_dir, port, n=8, itl=40), stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(c["status"] == "running" for f in folders(tmp_path / "one") for c in manifest(f)["plan"]):
        assert time.monotonic() < deadline and one.poll() is None
        time.sleep(0.05)
    two = subprocess.run(sweep_argv(tmp_path / "two", data_dir, port), capture_output=True, text=True, timeout=240)
    one.communicate(timeout=240)
    said = [ln for ln in two.stderr.splitlines() if ln.startswith("error: ")]
    refused = f"port {port} is already in use by pid "
    if two.returncode == 2:  # refused at its start (the AR cell of the first sweep was still running)
        assert len(said) == 1 and refused in said[0] and not folders(tmp_path / "two")
    for folder in folders(tmp_path / "one") + folders(tmp_path / "two"):
        for cid, s in summaries(folder).items():
            if s["status"] == "failed":
                assert refused in s["failure_reason"], (cid, s["failure_reason"])
                continue
            delta = json.loads((folder / "cells" / cid / "server_metrics.json").read_text())["delta"]
            assert delta["vllm:request_success_total"] == s["num_requests"], cid  # this cell's requests, no others
            assert "is in the launched process group" in s["server_identity"]
    assert one.returncode == 0 and two.returncode in (1, 2)


def test_a_url_server_replaced_mid_cell_fails_the_cell_with_that_reason(tmp_path, data_dir):
    port_ar, port_df = free_port(), free_port()
    slow = ["--itl-ms", "40", "--output-len", "24"]
    ar, df = emulator(port_ar, *slow), emulator(port_df, "--mode", "dflash", "--acceptance-length", "4")
    other = None
    try:
        argv = [*PY, "sweep", "--model", "Qwen3-8B", "--engine", "vllm", "--url-ar", f"http://127.0.0.1:{port_ar}",
                "--url-dflash", f"http://127.0.0.1:{port_df}", "--suites", "gsm8k", "-c", "1", "-n", "8",
                "--max-tokens", "24", "--data-dir", str(data_dir), "--out", str(tmp_path / "out"),
                "--expect-model", "emulated"]
        sweep = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        log = f"http://127.0.0.1:{port_ar}/emulator/requests"
        deadline = time.monotonic() + 120
        while len(httpx.get(log).json()) < 3:  # the warm-up and two measured requests are done
            assert time.monotonic() < deadline and sweep.poll() is None
            time.sleep(0.02)
        os.kill(sweep.pid, signal.SIGSTOP)  # the harness held still while the server is swapped under it
        ar.kill()
        ar.wait(10)
        other = emulator(port_ar, *slow)  # the same model name, on the same port: only its start time differs
        os.kill(sweep.pid, signal.SIGCONT)
        _, err = sweep.communicate(timeout=240)
    finally:
        for p in (ar, df, other):
            if p is not None:
                stop(p)
    (folder,) = folders(tmp_path / "out")
    s = summaries(folder)
    bad = s["vllm-ar-gsm8k-c1"]
    assert bad["status"] == "failed", err[-2000:]
    assert bad["failure_reason"].startswith("server identity changed mid-cell: the server's start time went from")
    good = s["vllm-dflash-gsm8k-c1"]
    assert good["status"] == "complete" and "/v1/models lists --expect-model emulated" in good["server_identity"]
    assert manifest(folder)["servers"]["vllm-ar"]["identity"]["model"] == "emulated"


def test_expect_model_refuses_a_url_server_that_serves_another(tmp_path, data_dir):
    port = free_port()
    other = emulator(port, "--model", "someone-elses")
    try:
        argv = [*PY, "sweep", "--model", "Qwen3-8B", "--engine", "vllm", "--url-ar", f"http://127.0.0.1:{port}",
                "--url-dflash", f"http://127.0.0.1:{port}", "--suites", "gsm8k", "-c", "1", "-n", "2",
                "--max-tokens", "8", "--data-dir", str(data_dir), "--out", str(tmp_path / "out"),
                "--expect-model", "Qwen/Qwen3-8B"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    finally:
        stop(other)
    (folder,) = folders(tmp_path / "out")
    s = summaries(folder)
    assert proc.returncode == 1 and {c["status"] for c in s.values()} == {"failed"}
    assert all("serves someone-elses, not --expect-model Qwen/Qwen3-8B" in c["failure_reason"] for c in s.values())


def test_a_dead_server_is_relaunched_once_and_a_second_death_fails_the_rest(tmp_path, data_dir):
    """Every emulator exits after 10 requests. Per server: c1 (warm-up + 4) completes, c2 dies under its load and
    is recorded failed, the relaunched server measures c3 and dies in c4, and c5 fails: no relaunch is left."""
    port = free_port()
    proc = subprocess.run(sweep_argv(tmp_path / "out", data_dir, port, "--engine-arg=--crash-after-requests=10",
                                     conc="1,2,3,4,5", n=5), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 1, proc.stderr[-3000:]
    (folder,) = folders(tmp_path / "out")
    s = summaries(folder)
    m = manifest(folder)
    for mode in ("ar", "dflash"):
        status = [s[f"emulator-{mode}-gsm8k-c{c}"]["status"] for c in range(1, 6)]
        assert status == ["complete", "failed", "complete", "failed", "failed"], (mode, status)
        first, again = m["servers"][f"emulator-{mode}"], m["servers"][f"emulator-{mode} #2"]
        assert first["pid"] != again["pid"] and f"emulator-{mode} #3" not in m["servers"]
        assert "exited with code 3" in s[f"emulator-{mode}-gsm8k-c2"]["failure_reason"]  # the death, by its log
        assert s[f"emulator-{mode}-gsm8k-c5"]["failure_reason"].startswith("server died: ")
        assert s[f"emulator-{mode}-gsm8k-c5"]["num_requests"] == 0  # never sent to a dead server
        # c3 ran on the new server: its identity names the new launch's listener
        assert f"listener pid {again['pid']} " in s[f"emulator-{mode}-gsm8k-c3"]["server_identity"]
        assert any(n.startswith(f"emulator-{mode}: relaunched before emulator-{mode}-gsm8k-c3") for n in m["notes"])


def test_run_expect_model_refuses_another_model_and_records_what_it_checked(tmp_path, data_dir):
    port = free_port()
    server = emulator(port, "--itl-ms", "1")
    url = f"http://127.0.0.1:{port}"
    base = [*PY, "run", "--url", url, "--suite", "gsm8k", "-n", "2", "--max-tokens", "8", "--engine", "emulator",
            "--data-dir", str(data_dir), "--out", str(tmp_path / "out")]
    try:
        wrong = subprocess.run([*base, "--name", "a", "--expect-model", "Qwen/Qwen3-8B"], capture_output=True,
                               text=True, timeout=120)
        right = subprocess.run([*base, "--name", "b", "--expect-model", "emulated"], capture_output=True, text=True,
                               timeout=120)
    finally:
        stop(server)
    said = [ln for ln in wrong.stderr.splitlines() if ln.strip()]
    assert wrong.returncode == 2 and said == [f"error: the server at {url} serves emulated, not --expect-model "
                                              "Qwen/Qwen3-8B; check the URL or the server"]
    assert not (tmp_path / "out" / "a").exists()
    assert right.returncode == 0, right.stderr[-2000:]
    (summary,) = summaries(tmp_path / "out" / "b").values()
    assert "/v1/models lists --expect-model emulated" in summary["server_identity"]
