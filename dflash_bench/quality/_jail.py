"""Child side of the sandbox: `python -I -B _jail.py CONFIG_JSON STATUS_FD`, run by sandbox.py in the
program's own folder. Stdlib only. Sets up what the kernel offers, reports what it got on STATUS_FD, then
execs the program:

1. namespaces (unshare(2)): a fresh network namespace (no interfaces up: no network, not even loopback)
   and a fresh PID namespace whose init is the program, so every process it starts dies with it;
   as root directly, else inside a new user namespace;
2. resource limits: address space, CPU seconds, processes, file size, open files, no core dumps;
3. as root: drop to the unprivileged `nobody` user (RLIMIT_NPROC binds only non-root users);
4. Landlock: writes (create, delete, rename, truncate) only beneath the program's folder; TCP bind and
   connect denied (a second network barrier); signals to processes outside the sandbox denied;
5. die with the parent (PR_SET_PDEATHSIG), exec the program.

With a PID namespace the first process stays outside as its keeper: it relays the exit status, and on
SIGTERM kills the namespace's init; its wait returns only once every process of the namespace is gone.
"""

import ctypes
import json
import os
import resource
import signal
import struct
import sys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
FS_WRITE_FILE, FS_REMOVE_DIR, FS_REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
FS_MAKE = sum(1 << b for b in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
FS_REFER, FS_TRUNCATE = 1 << 13, 1 << 14
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1
NOBODY = 65534

libc = ctypes.CDLL(None, use_errno=True)


def _err() -> str:
    return os.strerror(ctypes.get_errno())


def unshare_namespaces(status: dict) -> bool:
    """Fresh network + PID namespaces. True when a PID namespace was made (the caller must fork)."""
    uid, gid = os.getuid(), os.getgid()
    base = 0 if uid == 0 else CLONE_NEWUSER
    for flags, pid_ns in ((base | CLONE_NEWNET | CLONE_NEWPID, True), (base | CLONE_NEWNET, False)):
        if libc.unshare(flags) == 0:
            if base:
                _map_ids(uid, gid)
            status["network"] = "namespace"
            status["pid_namespace"] = pid_ns
            return pid_ns
    status["network"] = f"none (unshare: {_err()})"
    status["pid_namespace"] = False
    return False


def _map_ids(uid: int, gid: int) -> None:
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def set_limits(limits: dict) -> None:
    mb = 1024 * 1024
    nproc = limits["nproc"] + (0 if os.getuid() == 0 else _own_processes())
    for res, value in ((resource.RLIMIT_AS, limits["memory_mb"] * mb), (resource.RLIMIT_CPU, limits["cpu_s"]),
                       (resource.RLIMIT_NPROC, nproc), (resource.RLIMIT_FSIZE, limits["file_mb"] * mb),
                       (resource.RLIMIT_NOFILE, 256), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(res, (value, value))


def _own_processes() -> int:
    """Processes of this user already running (RLIMIT_NPROC counts them too when we are not root)."""
    uid, n = os.getuid(), 0
    for pid in os.listdir("/proc"):
        try:
            n += pid.isdigit() and os.stat(f"/proc/{pid}").st_uid == uid
        except OSError:
            pass
    return n


def drop_root(status: dict) -> None:
    if os.getuid() == 0:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        status["user"] = "nobody"
    else:
        status["user"] = "unchanged (not root)"


def interpreter() -> str | None:
    """This Python when the sandbox user can run it and read its standard library, else a system Python
    (stdlib is all the benchmark tests need); None when there is none."""
    mine = os.path.realpath(sys.executable)
    if os.access(mine, os.X_OK) and os.access(os.path.dirname(os.__file__), os.R_OK | os.X_OK):
        return sys.executable
    for path in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if os.access(os.path.realpath(path), os.X_OK):
            return path
    return None


def landlock(folder: str, status: dict) -> None:
    abi = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, 1)
    if abi < 1:
        status["filesystem"] = f"none (landlock: {_err()})"
        return
    fs = FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)
    net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL if abi >= 6 else 0
    attr = struct.pack("QQQ", fs, net, scoped)[: 24 if abi >= 6 else 16 if abi >= 4 else 8]
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, attr, len(attr), 0)
    if ruleset < 0:
        status["filesystem"] = f"none (landlock ruleset: {_err()})"
        return
    _allow(ruleset, folder, fs)
    _allow(ruleset, os.devnull, FS_WRITE_FILE | (FS_TRUNCATE if abi >= 3 else 0))
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
        status["filesystem"] = f"none (landlock restrict: {_err()})"
        return
    os.close(ruleset)
    status["filesystem"] = f"landlock v{abi}: writes only in its folder"
    if net:
        status["tcp"] = "landlock: bind and connect denied"


def _allow(ruleset: int, path: str, access: int) -> None:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    rule = struct.pack("=Qi", access, fd)  # struct landlock_path_beneath_attr is packed
    if libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, 1, rule, 0) != 0:
        raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}: {_err()}")
    os.close(fd)


def main() -> None:
    config, status_fd = json.loads(sys.argv[1]), int(sys.argv[2])
    status: dict = {}
    os.chdir(config["folder"])
    if unshare_namespaces(status):
        child = os.fork()
        if child:  # stays outside: relay the init's exit; SIGTERM takes the namespace down
            os.close(status_fd)
            signal.signal(signal.SIGTERM, lambda *_: os.kill(child, signal.SIGKILL))
            _, code = os.waitpid(child, 0)
            os._exit(os.waitstatus_to_exitcode(code) if os.WIFEXITED(code) else 128 + os.WTERMSIG(code))
    parent = os.getppid()
    set_limits(config["limits"])
    drop_root(status)
    landlock(config["folder"], status)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after the uid change, which clears it
    if os.getppid() != parent:
        os._exit(137)
    python = interpreter()
    status["interpreter"] = python
    if python is None:
        status["error"] = f"no Python the sandbox user ({status['user']}) may run; install python3 system-wide"
    os.write(status_fd, json.dumps(status).encode())
    os.close(status_fd)
    if python is None:
        os._exit(126)
    os.execv(python, [python, "-I", "-B", config["program"]])


if __name__ == "__main__":
    main()
