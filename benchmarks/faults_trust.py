"""Issue 43's cases for benchmarks/faults.py: the server measured is the one launched, a dead server relaunched
once, and any bytes in a sweep folder's files. Imported by faults.py, where they register with `case`."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

from benchmarks.faults import PY, Row, case, folders, left_behind, sh, summaries, sweep_argv


def _damage(blob: bytes, kind: str) -> bytes:
    if kind == "random":
        rnd = random.Random(43)
        return bytes(rnd.randrange(256) for _ in range(2000))
    if kind == "non-utf8":
        return blob[:len(blob) // 2] + b"\xff\xfe" + blob[len(blob) // 2:]
    return blob[:len(blob) // 2]


@case
def folder_bytes(tmp: Path, data: Path) -> Row:
    out = tmp / "out"
    sh(sweep_argv(out, data, n=4))
    (made,) = folders(out)
    files = sorted(p.relative_to(made) for p in made.rglob("*") if p.is_file())
    tried, bad = 0, []
    for rel in files:
        for kind in ("random", "non-utf8", "truncated"):
            folder = tmp / "copy"
            shutil.rmtree(folder, ignore_errors=True)
            shutil.copytree(made, folder)
            (folder / rel).write_bytes(_damage((made / rel).read_bytes(), kind))
            for cmd in (["report", str(folder)], ["gate", str(folder), "-b", str(made)], ["migrate", str(folder)]):
                proc, _ = sh([*PY, *cmd])
                tried += 1
                lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
                named = proc.returncode == 2 and len(lines) == 1 and str(folder / rel) in lines[0]
                if "Traceback" in proc.stderr or not (proc.returncode == 0 or named):
                    bad.append(f"{rel} {kind} {cmd[0]}: exit {proc.returncode} {(lines or ['-'])[-1][:60]}")
    shutil.rmtree(tmp / "copy", ignore_errors=True)
    return Row("random / non-UTF-8 / truncated bytes in every file of a folder", "report, gate, migrate: one "
               "sentence naming the file (or read fine)", f"{len(files)} files, {tried} runs; " +
               (f"{len(bad)} broke, e.g. {bad[0]}" if bad else "every one held"), None, left_behind(out), not bad)


@case
def resume_truncated_requests(tmp: Path, data: Path) -> Row:
    out = tmp / "out"
    sh(sweep_argv(out, data, n=4))
    (folder,) = folders(out)
    file = folder / "cells" / "emulator-dflash-gsm8k-c1" / "requests.jsonl"
    lines = file.read_bytes().splitlines(keepends=True)
    file.write_bytes(b"".join(lines[:-1]))  # cut at a line's end: every line still parses
    proc, _ = sh([*PY, "sweep", "--resume", str(folder), "--data-dir", str(data), "--port", str(_port())])
    said = [ln for ln in proc.stderr.splitlines() if "measured again" in ln]
    again = len(file.read_bytes().splitlines()) == len(lines)
    s = summaries(folder)["emulator-dflash-gsm8k-c1"]
    return Row("requests.jsonl cut short, then --resume", "the cell measured again, and the resume says so",
               f"exit {proc.returncode}; said: {(said or ['nothing'])[0][6:90]}; records back: {again}", None,
               left_behind(out), proc.returncode == 0 and bool(said) and again and s["status"] == "complete")


@case
def full_disk(tmp: Path, data: Path) -> Row:
    mnt = tmp / "small"
    mnt.mkdir()
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0:
        return Row("--out on a full disk", "one sentence naming the folder", "skipped: no unprivileged user "
                   "namespace to mount a small tmpfs", held=True)
    argv = " ".join(sweep_argv(mnt / "out", data, n=4))
    proc, dt = sh(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=32k tmpfs {mnt} && exec {argv}"])
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    named = len(err) == 1 and f"{mnt}/out/" in err[0] and "is full" in err[0]
    return Row("--out on a 32 KiB disk that fills mid-sweep", "one sentence naming the folder, no traceback",
               f"exit {proc.returncode}: {(err or ['-'])[0][:110]}", dt, "nothing",
               proc.returncode == 2 and named and "Traceback" not in proc.stderr)


def _port() -> int:
    from dflash_bench.launch import free_port

    return free_port()
