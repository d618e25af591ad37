"""Who answers on a server's port: free before a launch, the launched process (or container) after it, and the
same server at every later check (its served model id and start time), so no cell is measured on another server.

    check_port_free(port)                     before a launch: a UserError in one sentence when it is taken
    verify_launched(server, port)             after readiness: ServerIdentity, or ForeignServer when not ours
    verify_external(url, expect_model)        a --url server: its model id (and --expect-model) recorded
    changed(identity, url)                    later: why the server answering is no longer the one recorded

Listening sockets are read from /proc (Linux); where /proc cannot tell, the identity says what was not checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from dflash_bench.errors import UserError
from dflash_bench.http_limits import get_capped
from dflash_bench.store import ServerIdentity

if TYPE_CHECKING:
    from dflash_bench.launch.common import Server

PROBE_TIMEOUT_S = 10.0


class PortBusy(UserError):
    """The port a server is to be launched on is already taken."""


class ForeignServer(UserError):
    """The server answering on the port is not the one launched (or recorded)."""


class IdentityChanged(UserError):
    """The server answering changed between two checks; `failure` is the reason a cell keeps."""

    def __init__(self, message: str) -> None:
        self.failure = f"server identity changed mid-cell: {message}"
        super().__init__(self.failure)


# ---------------------------------------------------------------- sockets and processes


def _listen_inodes(port: int) -> set[str]:
    """Inodes of the TCP sockets listening on `port` (any address, IPv4 or IPv6) in this network namespace."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(f[9])
    return inodes


def _owners(inodes: set[str], pids: list[int]) -> list[int]:
    """Of `pids`, those holding one of the sockets (processes this user cannot read are skipped)."""
    wanted = {f"socket:[{i}]" for i in inodes}
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.scandir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(fd.path) in wanted:
                        found.append(pid)
                        break
    return found


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()] if Path("/proc").is_dir() else []


def _group(pgid: int) -> list[int]:
    """The processes of process group `pgid`."""
    out = []
    for pid in _all_pids():
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                out.append(pid)
    return out


def _describe(pid: int) -> str:
    with contextlib.suppress(OSError):
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        return f"pid {pid}: {cmd[:80]}"
    return f"pid {pid}"


def _someone_listens(port: int) -> bool:
    """Does anything accept TCP on 127.0.0.1:port, or hold it so that a server could not bind it?"""
    with socket.socket() as s:
        s.settimeout(1.0)
        if s.connect_ex(("127.0.0.1", port)) == 0:
            return True
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: a TIME_WAIT is no obstacle
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def check_port_free(port: int) -> None:
    """Refuse, in one sentence, a launch on a port another process already listens on."""
    if not _someone_listens(port):
        return
    holders = _owners(_listen_inodes(port), _all_pids())
    who = f" by {_describe(holders[0])}" if holders else ""
    raise PortBusy(f"port {port} is already in use{who}: another server (another sweep?) listens there, and it "
                   "would be measured as ours; stop it or pass another --port")


# ---------------------------------------------------------------- what answers


def fingerprint(url: str, timeout: float | None = PROBE_TIMEOUT_S) -> tuple[list[str], float | None]:
    """(the model ids /v1/models lists, the server's start time from /metrics `process_start_time_seconds`);
    a server that does not answer /v1/models in `timeout` is not asked for /metrics."""
    from dflash_bench.metrics import prometheus

    models: list[str] = []
    started = None
    with httpx.Client(base_url=url, timeout=timeout) as client:
        try:
            status, body = get_capped(client, "/v1/models")
            if status == 200:
                models = [str(m["id"]) for m in json.loads(body).get("data") or [] if isinstance(m, dict) and m.get("id")]
        except httpx.TimeoutException:
            return models, None
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        with contextlib.suppress(httpx.HTTPError, ValueError):
            status, body = get_capped(client, "/metrics")
            if status == 200:
                started = prometheus.parse(body.decode("utf-8", "replace"))["gauges"].get("process_start_time_seconds")
    return models, started


def expect(identity: ServerIdentity, url: str, expect_model: str | None, models: list[str] | None = None) -> None:
    """--expect-model: the server lists that model id (ForeignServer otherwise), recorded as checked."""
    if expect_model is None:
        return
    if models is None:
        models, _ = fingerprint(url)
    identity.expected_model = expect_model
    if expect_model not in models:
        raise ForeignServer(f"the server at {url} serves {', '.join(models) or 'no model it lists'}, not "
                            f"--expect-model {expect_model}; check the URL or the server")
    identity.checked.append(f"/v1/models lists --expect-model {expect_model}")


def _served(identity: ServerIdentity, url: str, timeout: float | None = PROBE_TIMEOUT_S) -> list[str]:
    models, started = fingerprint(url, timeout)
    identity.model, identity.started = (models[0] if models else None), started
    identity.checked.append(f"model id {identity.model}" if models else "no model id (/v1/models lists none)")
    identity.checked.append(f"start time {started:.2f} (/metrics)" if started is not None
                            else "no start time (/metrics has no process_start_time_seconds)")
    return models


def verify_launched(server: Server, port: int) -> ServerIdentity:
    """The launched server is the one answering on `port`: for a process, the listening socket belongs to a
    process of its group; for a container, to a process of the container (or the port is mapped to it)."""
    identity = ServerIdentity(port=port)
    identity.checked.append(f"port {port} was free before the launch")
    inodes = _listen_inodes(port)
    if server.runner == "process":
        pgid = server.info.pid
        if pgid is None or not inodes:
            identity.checked.append("listener not checked (no /proc/net/tcp entry for the port)")
        else:
            mine = _owners(inodes, _group(pgid))
            if not mine:
                holders = _owners(inodes, _all_pids())
                who = _describe(holders[0]) if holders else "a process this user cannot see"
                raise ForeignServer(f"the server answering on port {port} is not the one launched ({who} listens "
                                    f"there, outside the launched process group {pgid}); stop it or pass another --port")
            identity.listener_pid = mine[0]
            identity.checked.append(f"listener pid {mine[0]} is in the launched process group {pgid}")
    else:
        _container_listens(server, port, inodes, identity)
    _served(identity, server.url)
    return identity


def _container_listens(server: Server, port: int, inodes: set[str], identity: ServerIdentity) -> None:
    container = getattr(server, "container", None)
    if container is None:
        identity.checked.append("listener not checked (no container)")
        return
    identity.container_id = container.id
    mapped = ((container.attrs.get("NetworkSettings") or {}).get("Ports") or {}).get(f"{port}/tcp") or []
    if any(str(m.get("HostPort")) == str(port) for m in mapped):
        identity.checked.append(f"port {port} is mapped to container {container.short_id}")
        return
    try:  # `docker top`: the container's processes by their host pids
        top = container.top()
        col = top["Titles"].index("PID")
        pids = [int(row[col]) for row in top.get("Processes") or []]
    except Exception:  # noqa: BLE001 - the daemon's answer varies; what could not be read is said, never guessed
        identity.checked.append(f"listener not checked (docker top of {container.short_id} gave no pids)")
        return
    mine = _owners(inodes, pids)
    if mine:
        identity.listener_pid = mine[0]
        identity.checked.append(f"listener pid {mine[0]} is in container {container.short_id}")
        return
    holders = _owners(inodes, [p for p in _all_pids() if p not in pids])
    if holders:
        raise ForeignServer(f"the server answering on port {port} is not the launched container ({_describe(holders[0])} "
                            "listens there); stop it or pass another --port")
    identity.checked.append(f"listener not checked (container {container.short_id}'s processes are not readable here)")


def verify_external(url: str, expect_model: str | None = None,
                    timeout: float | None = PROBE_TIMEOUT_S) -> ServerIdentity:
    """A server the user runs (--url): its model id and start time recorded, --expect-model enforced."""
    identity = ServerIdentity()
    models = _served(identity, url, timeout)
    expect(identity, url, expect_model, models)
    return identity


def changed(identity: ServerIdentity, url: str, timeout: float | None = PROBE_TIMEOUT_S) -> str | None:
    """Why the server answering at `url` is no longer the one `identity` recorded; None while it is."""
    models, started = fingerprint(url, timeout)
    if not models and started is None:
        return f"the server at {url} no longer answers /v1/models or /metrics"
    # an endpoint that did not answer this time (a slow /metrics under load) is no evidence: only a value that
    # differs from the recorded one is
    if identity.model is not None and models and identity.model not in models:
        return f"the served model id went from {identity.model} to {', '.join(models)}"
    if identity.started is not None and started is not None and started != identity.started:
        return f"the server's start time went from {identity.started:.2f} to {started:.2f} (another server answers)"
    if identity.listener_pid is not None and identity.port is not None:
        holders = _owners(_listen_inodes(identity.port), [identity.listener_pid])
        if not holders:
            return f"pid {identity.listener_pid} no longer listens on port {identity.port}"
    return None
