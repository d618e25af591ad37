"""Fault cases of trust in what is on disk and who answers: any bytes in a sweep folder's files, hostile content
in every one of them and in a baseline (fixtures/hostile.py: huge integers, lone surrogates, wrong types, deep
nesting, NaN and Infinity, through every reader) and hostile layouts of its cells (ids leaving the folder, links,
stray copies), names that would leave --out or do not encode, a full disk, the
server measured is the one launched, a dead server relaunched once. Each registers with `common.case`."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

from benchmarks.fixtures import hostile
from benchmarks.fixtures.tampering import KINDS, damaged, foreign_emulator
from dflash_bench.launch import free_port
from benchmarks.faults.common import PY, Row, case, folders, left_behind, sh, summaries, sweep_argv


@case
def folder_bytes(tmp: Path, data: Path) -> Row:
    out = tmp / "out"
    sh(sweep_argv(out, data, n=4))
    (made,) = folders(out)
    files = sorted(p.relative_to(made) for p in made.rglob("*") if p.is_file())
    tried, bad = 0, []
    for rel in files:
        for kind in KINDS:
            folder = tmp / "copy"
            shutil.rmtree(folder, ignore_errors=True)
            shutil.copytree(made, folder)
            (folder / rel).write_bytes(damaged((made / rel).read_bytes(), kind))
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


# ---------------------------------------------------------------- the server measured is the one launched


@case
def foreign_server_on_port(tmp: Path, data: Path) -> Row:
    out = tmp / "out"
    argv = sweep_argv(out, data)
    port = int(argv[argv.index("--port") + 1])
    foreign = foreign_emulator(port)
    try:
        proc, dt = sh(argv)
    finally:
        foreign.kill()
        foreign.wait()
    said = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    named = bool(said) and f"already in use by pid {foreign.pid}" in said[0]
    return Row("a foreign server already on --port", "refused in one sentence naming it, nothing measured",
               f"exit {proc.returncode}: {(said or ['-'])[0][7:110]}", dt, left_behind(out),
               proc.returncode == 2 and len(said) == 1 and named and not folders(out))


@case
def two_sweeps_one_port(tmp: Path, data: Path) -> Row:
    import json
    import time

    first = sweep_argv(tmp / "one", data, "--engine-arg=--itl-ms=40", n=8)
    port = first[first.index("--port") + 1]
    one = subprocess.Popen(first, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not any(c["status"] == "running" for f in folders(tmp / "one") if (f / "manifest.json").exists()
                      for c in json.loads((f / "manifest.json").read_text())["plan"]):
            if time.monotonic() > deadline or one.poll() is not None:
                break
            time.sleep(0.05)
        second = sweep_argv(tmp / "two", data)
        second[second.index("--port") + 1] = port
        two, dt = sh(second)
        one.wait(240)
    finally:
        if one.poll() is None:
            one.kill()
            one.wait()
    clean = []
    for folder in folders(tmp / "one") + folders(tmp / "two"):
        for cid, s in summaries(folder).items():
            if s["status"] == "complete":
                delta = json.loads((folder / "cells" / cid / "server_metrics.json").read_text())["delta"]
                clean.append(delta.get("vllm:request_success_total") == s["num_requests"])
            else:
                clean.append("already in use" in (s["failure_reason"] or ""))
    said = [ln for ln in two.stderr.splitlines() if ln.startswith("error: ")]
    return Row("two sweeps, different --out, same --port, at once", "the second refused; no cell counts the other's "
               "requests", f"sweep 1 exit {one.returncode}; sweep 2 exit {two.returncode}: {(said or ['-'])[0][7:80]}; "
               f"{sum(clean)}/{len(clean)} cells clean", dt, left_behind(tmp / "one"),
               one.returncode == 0 and two.returncode == 2 and bool(clean) and all(clean))


# ---------------------------------------------------------------- the watchdog


@case
def server_dies_twice(tmp: Path, data: Path) -> Row:
    import json

    out = tmp / "out"
    proc, _ = sh(sweep_argv(out, data, "--engine-arg=--crash-after-requests=10", n=5, conc="1,2,3,4,5"), timeout=600)
    (folder,) = folders(out)
    s = summaries(folder)
    servers = json.loads((folder / "manifest.json").read_text())["servers"]
    seen = {mode: "".join("o" if s[f"emulator-{mode}-gsm8k-c{c}"]["status"] == "complete" else "x"
                          for c in range(1, 6)) for mode in ("ar", "dflash")}
    launches = {mode: sum(k.startswith(f"emulator-{mode}") for k in servers) for mode in ("ar", "dflash")}
    return Row("server exits after every 10 requests (5 cells a server)", "relaunched once after its failed cell; "
               "the 2nd death fails the rest", f"cells (o=complete): {seen}; launches: {launches}; exit {proc.returncode}",
               None, left_behind(out), seen == {"ar": "oxoxx", "dflash": "oxoxx"} and launches == {"ar": 2, "dflash": 2})


@case
def hostile_folder(tmp: Path, data: Path) -> Row:
    out = tmp / "out"
    sh(sweep_argv(out, data, "--save-token-ids", n=4))
    (made,) = folders(out)
    baseline = hostile.every_file(made, data)
    seed, work = hostile.seed(), tmp / "work"
    work.mkdir()
    rnd, cases, broke, runs = random.Random(seed), hostile.cases(made), [], []

    def counted(label: str) -> bool:  # play asks this once for each command it runs on a damaged copy
        runs.append(label)
        return True

    for c in cases:
        broke += hostile.play(c, made, baseline, work, data, rnd, counted, free_port)
    shutil.rmtree(work / "folder", ignore_errors=True)
    return Row("hostile bytes and JSON in every file, and in a baseline; hostile layouts of every cell (seed %d)" % seed,
               "report, gate, gate -b, --export-baseline [--noise-from], migrate, quality, --resume: one sentence or "
               "read fine, never a traceback; nothing outside the folder written, results.csv each cell once",
               f"{len(cases)} damaged copies, {len(runs)} runs of the commands that read them; " +
               (f"{len(broke)} broke, e.g. {broke[0][:90]}" if broke else "every one held"), None, left_behind(out),
               not broke)


@case
def hostile_names(tmp: Path, data: Path) -> Row:
    bad = []
    for name in ("../escaped", "/tmp/abs", "a/b", ".."):
        proc, _ = sh([*PY, "run", "--url", "http://127.0.0.1:9", "--suite", "gsm8k", "--out", str(tmp / "o"),
                      "--name", name])
        if proc.returncode != 2 or "--name" not in proc.stderr or "Traceback" in proc.stderr:
            bad.append(f"--name {name}: exit {proc.returncode}")
    out = str(tmp) + "/bad" + b"\xff\xfe".decode("utf-8", "surrogateescape")
    proc, _ = sh([*PY, "sweep", "--model", "org/emulated", "--engine", "emulator", "--suites", "gsm8k", "--out", out,
                  "--data-dir", str(data)])
    if proc.returncode != 2 or "error: --out" not in proc.stderr:
        bad.append(f"--out not UTF-8: exit {proc.returncode}")
    left = sorted(p.name for p in tmp.iterdir()) + sorted(p.name for p in tmp.parent.glob("escaped"))
    return Row("--name leaving --out, --out not UTF-8", "one sentence naming the option, nothing written",
               "; ".join(bad) or "every one refused", None, ", ".join(left) or "nothing", not bad and not left)
