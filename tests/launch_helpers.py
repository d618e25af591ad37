"""Helpers of the launcher tests: a small real HTTP server, a harness to signal, docker test images."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from services import sigint_delivered

REPO = Path(__file__).resolve().parents[1]

# A real HTTP server with knobs: `ok` serves /health; `exit` logs 60 lines and exits 3 during start-up;
# `never-ready` answers 503; `child` also starts a long-lived child process in its process group.
SERVER = r"""
import http.server, os, subprocess, sys, time
port, mode = int(sys.argv[1]), sys.argv[2]
print(f"test server starting in mode {mode}; HF_TOKEN present: {bool(os.environ.get('HF_TOKEN'))}", flush=True)
if mode == "exit":
    for i in range(60):
        print(f"start-up line {i}", flush=True)
    sys.exit(3)
if mode == "child":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"child pid {child.pid}", flush=True)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        code = 503 if mode == "never-ready" else 200 if self.path == "/health" else 404
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass

print("test server listening", flush=True)
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""

# Launches one server and sleeps until signalled. argv[1] is a JSON object of launch settings.
HARNESS = r"""
import json, sys, time
from dflash_bench.launch import DockerOptions, launch_command
cfg = json.loads(sys.argv[1])
docker = DockerOptions(**cfg["docker"]) if cfg.get("docker") else None
with launch_command(cfg["argv"], port=cfg["port"], runner=cfg["runner"], docker=docker, ready_timeout=60,
                    name="harness-test", log_path=cfg.get("log_path")) as server:
    print("READY", server.info.pid or server.info.container_id, flush=True)
    time.sleep(600)
"""


def server_argv(port: int, mode: str = "ok") -> list[str]:
    return [sys.executable, "-c", SERVER, str(port), mode]


def start_harness(cfg: dict) -> tuple[subprocess.Popen, str]:
    """Start the harness (Ctrl-C reaches it however pytest was started); return it and what it printed after
    READY (pid or container id). Pair it with `stop_harness` in a finally."""
    proc = subprocess.Popen([sys.executable, "-c", HARNESS, json.dumps(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=sigint_delivered)
    line = proc.stdout.readline()
    if not line.startswith("READY"):
        stop_harness(proc)
        raise AssertionError(f"harness did not get ready: {line!r} {proc.stderr.read()}")
    return proc, line.split()[1]


def stop_harness(proc: subprocess.Popen, server_pgid: int | None = None) -> None:
    """Whatever a test did to it: a harness still running gets SIGTERM, so that it tears its server down, and
    SIGKILL after 30 s; then a process server's group that outlived it is killed too."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if server_pgid is not None and group_alive(server_pgid):
        try:
            os.killpg(server_pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def group_alive(pgid: int) -> bool:
    """True while some process of the group runs (zombies do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(pgrp) == pgid and state != "Z":
            return True
    return False


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()
