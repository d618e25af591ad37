"""Run model-written code safely: each program in its own process, its own temporary folder, a clean
environment, a wall-clock timeout, memory / CPU / process / file-size limits, no network, and no writes
outside its folder (the child side, _jail.py, says how). A program that hangs, forks without end, writes
outside its folder, exhausts memory or reaches for the network is killed or blocked and counts as failed;
the harness carries on.

    result = run_program("assert 1 + 1 == 2")
    result.passed, result.reason, result.isolation
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

JAIL = Path(__file__).with_name("_jail.py")
NOBODY = 65534
TAIL = 2000  # characters of stdout / stderr kept


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 20.0  # wall clock (MBPP 123's reference solution needs ~6 s of CPU)
    cpu_s: int = 20
    memory_mb: int = 1024  # address space
    nproc: int = 32  # processes (RLIMIT_NPROC of the sandbox user)
    file_mb: int = 16  # largest file it may write (stdout and stderr included)


@dataclass
class RunResult:
    passed: bool  # exited 0 within its limits
    reason: str  # "passed", "exit 1", "timeout after 10s", "killed by SIGXCPU", "sandbox setup failed", ...
    returncode: int | None
    duration_s: float
    stdout: str = ""
    stderr: str = ""
    isolation: dict[str, object] = field(default_factory=dict)  # what the kernel granted (network, filesystem, ...)

    def to_dict(self) -> dict:
        return asdict(self)


def run_program(code: str, limits: Limits = Limits()) -> RunResult:
    """Run `code` as `python -I -B program.py` in a fresh temporary folder; never raises for what the program does."""
    folder = Path(tempfile.mkdtemp(prefix="dflash-sandbox-"))
    logs = Path(tempfile.mkdtemp(prefix="dflash-sandbox-logs-"))  # outside the program's reach
    try:
        program = folder / "program.py"
        program.write_text(code)
        if os.getuid() == 0:
            os.chown(folder, NOBODY, NOBODY)
            os.chown(program, NOBODY, NOBODY)
        return _run(folder, program, logs, limits)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)


def run_many(programs: Iterable[str], limits: Limits = Limits(), workers: int = 2) -> list[RunResult]:
    """run_program over several programs, `workers` at a time, results in input order."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda code: run_program(code, limits), programs))


def _run(folder: Path, program: Path, logs: Path, limits: Limits) -> RunResult:
    config = {"folder": str(folder), "program": str(program), "limits": {
        "memory_mb": limits.memory_mb, "cpu_s": limits.cpu_s, "nproc": limits.nproc, "file_mb": limits.file_mb}}
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(folder), "TMPDIR": str(folder)}
    read_end, write_end = os.pipe()
    start = time.monotonic()
    with open(logs / "stdout", "wb") as out, open(logs / "stderr", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-B", str(JAIL), json.dumps(config), str(write_end)],
            cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            pass_fds=(write_end,), start_new_session=True,
        )
        os.close(write_end)
        timed_out = False
        try:
            proc.wait(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.terminate()  # the keeper kills the namespace and returns once it is empty
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        finally:
            _kill_group(proc.pid)  # the backstop, and stragglers where there is no PID namespace
            proc.wait()
    duration = time.monotonic() - start
    isolation = _read_status(read_end)
    code = proc.returncode
    if timed_out:
        reason = f"timeout after {limits.timeout_s:g}s"
    elif not isolation or "error" in isolation:
        reason = f"sandbox setup failed: {isolation.get('error', 'see stderr')}"
    elif code == 0:
        reason = "passed"
    elif code > 128 or code < 0:
        reason = f"killed by {_signal_name(code - 128 if code > 128 else -code)}"
    else:
        reason = f"exit {code}"
    return RunResult(passed=reason == "passed", reason=reason, returncode=code, duration_s=duration,
                     stdout=_tail(logs / "stdout"), stderr=_tail(logs / "stderr"), isolation=isolation)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_status(fd: int) -> dict:
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    try:
        return json.loads(data) if data else {}
    except json.JSONDecodeError:
        return {}


def _tail(path: Path) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - TAIL))
        return f.read().decode(errors="replace")


def isolation() -> dict[str, object]:
    """What this machine's kernel grants a sandboxed program (runs one trivial program to find out)."""
    return run_program("pass", Limits(timeout_s=10)).isolation
