"""Local-process launcher: the server command as a subprocess in its own process group.

Each running server is recorded in a small registry folder (one JSON file per server) so that
`dflash-bench stop` can find servers whose harness was killed with SIGKILL.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Callable

from pydantic import BaseModel, Field, ValidationError

from dflash_bench.errors import UserError
from dflash_bench.launch.common import Server, ServerInfo
from dflash_bench.store import StoreError, atomic_write_json

STOP_GRACE_S = 15.0


class Registration(BaseModel):
    """One running process server, as `<registry_dir>/<pgid>.json`: what `stop` needs to find it later."""

    pgid: int
    owner_pid: int  # the harness that started it: once it is gone, the server is a leftover
    argv: list[str] = Field(default_factory=list)
    url: str | None = None
    started: float | None = None  # time.time()


def registry_dir() -> Path:
    """Where running process servers are recorded (env DFLASH_BENCH_RUN_DIR overrides)."""
    env = os.environ.get("DFLASH_BENCH_RUN_DIR")
    return Path(env) if env else _default_registry()


def _default_registry() -> Path:
    return Path(tempfile.gettempdir()) / f"dflash-bench-{os.getuid()}" / "servers"


def _forget(record: Path) -> None:
    """Remove a server's record; the default registry's folders go with the last one, so a harness that stopped
    its servers leaves nothing in the temp folder (a folder DFLASH_BENCH_RUN_DIR names is the user's, kept)."""
    record.unlink(missing_ok=True)
    default = _default_registry()
    if record.parent != default:
        return
    for folder in (default, default.parent):
        try:
            folder.rmdir()  # only when empty: another harness's records keep it
        except OSError:
            return


def resolve_argv(argv: list[str]) -> list[str]:
    """Find argv[0]; `dflash-bench` falls back to this interpreter's module when not on PATH."""
    if not argv:
        raise UserError("the server command is empty.")
    if shutil.which(argv[0]):
        return list(argv)
    if argv[0] == "dflash-bench":
        return [sys.executable, "-m", "dflash_bench", *argv[1:]]
    if argv[0] in ("python3", "python"):
        return [sys.executable, *argv[1:]]
    raise UserError(f"cannot run {argv[0]!r}: it is not on PATH (install the engine, or use --runner docker).")


def shell_line(argv: list[str], env: dict[str, str]) -> str:
    """The command as one shell line; secrets are shown by name only."""
    names = [f"{k}={shlex.quote(v)}" for k, v in env.items()]
    return " ".join(names + [shlex.join(argv)])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def stop_group(pgid: int, grace: float = STOP_GRACE_S, reap: Callable[[], object] | None = None) -> None:
    """SIGTERM the process group, then SIGKILL what is left after `grace` seconds.

    `reap` (our child's `poll`) collects the group leader, which would otherwise stay a zombie.
    """
    if not _signal_group(pgid, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if reap is not None:
            reap()
        if not _group_alive(pgid):
            return
        time.sleep(0.1)
    _signal_group(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    """True while a process of the group runs (zombies waiting for their reaper do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            return True
    return False


def _leader_runs(pgid: int, argv: list[str]) -> bool:
    """Is the group's leader still the recorded server? Its command line (a script's shebang may put the
    interpreter first) ends with the recorded arguments. A leader that exited leaves its id reserved while
    the group lives, so a group without a leader is still the server's."""
    try:
        cmdline = Path(f"/proc/{pgid}/cmdline").read_bytes()
    except OSError:
        return True  # leader gone (or no /proc): nothing else can hold the id
    parts = [p.decode(errors="replace") for p in cmdline.split(b"\0")[:-1]]
    if not parts:
        return True  # a zombie leader waiting for its reaper: still the server's group
    tail = [str(a) for a in argv[1:]]
    name = os.path.basename(str(argv[0])) if argv else ""
    return parts[len(parts) - len(tail):] == tail and any(os.path.basename(p) == name for p in parts[:len(parts) - len(tail)])


class ProcessServer(Server):
    runner = "process"

    def __init__(self, argv: list[str], env: dict[str, str], info: ServerInfo, name: str) -> None:
        super().__init__(info, name)
        self.argv, self.env = argv, env
        self.proc: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None
        self._record: Path | None = None

    def _start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in _terminate)
        self.proc = proc = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env}, start_new_session=True,
        )
        self.info.pid = proc.pid
        self._record = record = registry_dir() / f"{proc.pid}.json"
        reg = Registration(pgid=proc.pid, owner_pid=os.getpid(), argv=self.argv, url=self.url, started=time.time())
        try:
            atomic_write_json(record, reg)
        except StoreError:  # another harness removed the empty folder between our mkdir and our write: once more
            atomic_write_json(record, reg)

    def exit_code(self) -> int | None:
        return self.proc.poll() if self.proc else -1

    def _terminate(self) -> None:
        try:
            if self.proc is not None:
                stop_group(self.proc.pid, reap=self.proc.poll)
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=5)
        finally:
            if self._log:
                self._log.close()
            if self._record:
                _forget(self._record)


def stop_leftovers(all_: bool = False) -> list[str]:
    """Stop recorded process servers: those whose harness is gone, or every one with `all_`."""
    stopped = []
    folder = registry_dir()
    for rec in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            reg = Registration.model_validate_json(rec.read_text())
        except (OSError, ValueError, ValidationError):
            _forget(rec)
            continue
        pgid, owner = reg.pgid, reg.owner_pid
        if not _group_alive(pgid) or not _leader_runs(pgid, reg.argv):
            _forget(rec)  # gone, or its id now belongs to another program
            continue
        if all_ or not _pid_alive(owner):
            stop_group(pgid)
            _forget(rec)
            stopped.append(f"process group {pgid}: {shlex.join(reg.argv)[:120]}")
    return stopped
