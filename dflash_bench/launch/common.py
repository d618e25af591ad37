"""What both launchers share: the Server handle, readiness polling, the watchdog, log tails, signals."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx

from dflash_bench.errors import UserError
from dflash_bench.store import ServerRecord

LOG_TAIL_LINES = 40


class ServerDied(UserError):
    """The server exited (during start-up or while a cell ran). The message carries its log tail;
    `reason` is the one-line version a failed cell keeps: the message and the log lines that explain it."""

    def __init__(self, message: str, log_tail: str = "", cause: str = "") -> None:
        """`cause`: the line of the log, before its tail, that says why it ended (`first_cause`)."""
        self.log_tail = log_tail
        why = explain(log_tail)
        if cause and cause not in why:
            why = f"{cause} | {why}" if why else cause
        self.reason = f"{message}: {why}" if why else message
        super().__init__(f"{message}; last lines of its log:\n{log_tail}" if log_tail else message)


# a line that names why a process ended outright, where what follows it are consequences: a server that runs out of
# memory in its engine's process can print a traceback for every request in flight after it (vLLM's EngineDeadError,
# "See stack trace (above) for the root cause"), so much that the cause is far above the log's tail
_CAUSE = re.compile(r"out of memory|OutOfMemoryError|\bOOM\b|Segmentation fault|core dumped|Killed", re.IGNORECASE)
# a line that says why a process ended, most telling first (a log's last line is usually just noise:
# a shutdown message, a progress bar, "listening on ...")
_WHY = re.compile(r"Traceback \(most recent call last\)|\b\w*(Error|Exception|Exit)\b|\berror\b|\bfatal\b|Aborted|"
                  r"panic|" + _CAUSE.pattern, re.IGNORECASE)
CAUSE_SCAN_BYTES = 1 << 30  # read at most this much of a dead server's log for its cause


def first_cause(path: str | Path | None, start: int = 0, limit: int = 400) -> str:
    """The first line of the log from byte `start` (where the server was ready) that names why a process ended
    (_CAUSE), stripped and cut at `limit` characters; '' where none does, or there is no log."""
    if not path or not Path(path).is_file():
        return ""
    with open(path, "rb") as fh:
        fh.seek(start)
        read = 0
        for raw in fh:
            read += len(raw)
            if read > CAUSE_SCAN_BYTES:
                return ""
            line = raw.decode("utf-8", "replace").strip()
            if _CAUSE.search(line):
                return line[:limit]
    return ""


def explain(log_tail: str, limit: int = 600) -> str:
    """The lines of a log tail that explain an exit: a traceback's last frame and its exception, or the
    last error lines; '' when nothing in it looks like a cause (the exit code must speak for itself)."""
    lines = [ln.strip() for ln in log_tail.splitlines() if ln.strip()]
    tb = max((i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")), default=None)
    if tb is not None:
        body = lines[tb + 1:]
        exc = [ln for ln in body if not ln.startswith(("File ", "^", "~")) and _WHY.search(ln)]
        frames = [ln for ln in body if ln.startswith("File ")]
        picked = ([frames[-1]] if frames else []) + (exc[-1:] or body[-1:])
    else:
        picked = [ln for ln in lines if _WHY.search(ln)][-3:]
    return " | ".join(picked)[:limit]


class ServerNotReady(ServerDied):
    """The server stayed up but never answered its readiness endpoint in time."""


class Terminated(SystemExit):
    """SIGTERM arrived: unwinds like Ctrl-C so every `with` block tears its server down."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


# What was launched, as the sweep manifest records it (env names, never their values): the store's schema.
ServerInfo = ServerRecord


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tail(path: str | Path | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ('' when there is none)."""
    if not path or not Path(path).is_file():
        return ""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - 256 * 1024))
        data = fh.read().decode("utf-8", "replace")
    return "\n".join(data.splitlines()[-lines:])


class Server:
    """A running server. `check()` raises ServerDied once it has exited; `died` is set by the watchdog."""

    runner = "?"

    def __init__(self, info: ServerInfo, name: str) -> None:
        self.info = info
        self.url = info.url
        self.name = name
        self.log_path = info.log_path or os.devnull  # launch_command always names one
        self.died = threading.Event()
        self.ready_at = 0  # the log's size when the server answered ready: its death's cause is looked for after it
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._stopped = False

    # Implemented by the runners.
    def exit_code(self) -> int | None:
        """None while running, else the exit code (or -1 when unknown)."""
        raise NotImplementedError

    def _terminate(self) -> None:
        raise NotImplementedError

    # Shared behaviour.
    def alive(self) -> bool:
        return self.exit_code() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return tail(self.log_path, lines)

    def check(self) -> None:
        """Raise ServerDied (with the log tail) if the server is no longer running."""
        if self._stopping.is_set():
            return
        code = self.exit_code()
        if code is not None:
            self.died.set()
            raise ServerDied(f"the {self.name} server exited with code {code}", self.log_tail(),
                             first_cause(self.log_path, self.ready_at))

    def wait_ready(self, path: str, timeout: float, interval: float = 0.5) -> None:
        """Poll GET url+path until it answers 200; ServerDied if it exits, ServerNotReady on timeout."""
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5.0) as client:
            while True:
                code = self.exit_code()
                if code is not None:
                    raise ServerDied(f"the {self.name} server exited during start-up with code {code}",
                                     self.log_tail())
                with contextlib.suppress(httpx.HTTPError):
                    with client.stream("GET", self.url + path) as r:  # the status is the answer: its body goes unread
                        if r.status_code == 200:
                            with contextlib.suppress(OSError):
                                self.ready_at = os.path.getsize(self.log_path)
                            return
                if time.monotonic() > deadline:
                    raise ServerNotReady(f"the {self.name} server did not answer 200 on {path} within "
                                         f"{timeout:.0f} s", self.log_tail())
                time.sleep(interval)

    def start_watchdog(self, interval: float = 1.0) -> None:
        """Poll the server every `interval` s in a daemon thread; set `died` when it exits."""

        def watch() -> None:
            while not self._stopping.wait(interval):
                try:
                    if self.exit_code() is not None:
                        self.died.set()
                        return
                except Exception:  # the daemon went away: check() will report it
                    continue

        self._watchdog = threading.Thread(target=watch, name=f"watchdog-{self.name}", daemon=True)
        self._watchdog.start()

    def start(self) -> None:
        """Start the server (signals are deferred while it starts, so it is always known to stop())."""
        with hold_signals():
            self._start()

    def _start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the server and everything it started. Idempotent; signals are deferred meanwhile."""
        if self._stopped:
            return
        self._stopping.set()
        with hold_signals():
            self._terminate()
            self._stopped = True


@contextlib.contextmanager
def hold_signals() -> Iterator[None]:
    """Defer SIGINT/SIGTERM until the block ends (teardown, container creation): never half of one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    sigs = (signal.SIGINT, signal.SIGTERM)
    old = {sig: signal.signal(sig, lambda signum, frame: pending.append(signum)) for sig in sigs}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if pending:
            signal.raise_signal(pending[0])  # now handled as it would have been


def _raise_terminated(signum: int, frame: object) -> None:  # noqa: ARG001
    raise Terminated()


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within the block, SIGTERM raises Terminated (like Ctrl-C raises KeyboardInterrupt)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.getsignal(signal.SIGTERM)
    if old not in (signal.SIG_DFL, None, _raise_terminated):
        yield  # the caller installed its own handler: leave it
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
