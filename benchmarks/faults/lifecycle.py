"""Fault cases of a sweep's life: two sweeps racing for one folder, resumes, a hung or failing server, ctrl-c,
SIGTERM and kill -9, a server dying mid-cell, a planted script, and servers whose streams leave out what the
client needs (usage, speculation counters, a warm-up's connect). Each registers with `common.case`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from benchmarks.faults.common import (
    PY, Row, case, first_line, folders, left_behind, run_argv, sh, summaries, sweep_argv, wait_for,
)
from benchmarks.fixtures.bad_servers import SCRIPT, BadServer

from dflash_bench.emulator import EmulatorProcess
from dflash_bench.launch import free_port


# ---------------------------------------------------------------- races, resumes and failing cells


def _race(procs: list[subprocess.Popen]) -> tuple[list[int], list[str], float | None]:
    """Two commands started at once, waited for: their exit codes (sorted), the first error line of each refused
    one (exit 2), and seconds until the first refusal was seen."""
    t = time.monotonic()
    results, detect = [], None
    for p in procs:
        _, err = p.communicate(timeout=300)
        if p.returncode == 2 and detect is None:
            detect = time.monotonic() - t
        results.append((p.returncode, first_line(err)))
    return sorted(c for c, _ in results), [e for c, e in results if c == 2], detect


@case
def same_out_same_second(tmp: Path, data: Path) -> Row:
    out = tmp / "out"
    time.sleep(1 - time.time() % 1 + 0.05)  # both start early in one second: the sweep id (a timestamp) is equal
    procs = [subprocess.Popen(sweep_argv(out, data), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    codes, refused, detect = _race(procs)
    held = codes == [0, 2] and len(folders(out)) == 1
    seen = f"exit {codes}; {len(folders(out))} folder(s); refused: {refused[0] if refused else '-'}"
    return Row("two sweeps, same --out, same second", "one runs, the other refused in one sentence", seen, detect,
               left_behind(out), held)


@case
def two_resumes(tmp: Path, data: Path) -> Row:
    out = tmp / "out"
    proc, _ = sh(sweep_argv(out, data))
    (folder,) = folders(out)
    for cell in folder.glob("cells/*"):
        shutil.rmtree(cell)
    resume = [*PY, "sweep", "--resume", str(folder), "--data-dir", str(data)]
    a = subprocess.Popen(resume + ["--port", str(free_port())], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    b = subprocess.Popen(resume + ["--port", str(free_port())], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    codes, refused, detect = _race([a, b])
    done = sum(s["status"] == "complete" for s in summaries(folder).values())
    return Row("two --resume of one folder at once", "one resumes, the other refused in one sentence",
               f"exit {codes}; {done}/2 cells complete; refused: {refused[0] if refused else '-'}", detect,
               left_behind(out), codes == [0, 2] and done == 2)


@case
def port_on_resume(tmp: Path, data: Path) -> Row:
    out = tmp / "out"
    argv = sweep_argv(out, data)
    port = int(argv[argv.index("--port") + 1])
    sh(argv)
    (folder,) = folders(out)
    first = json.loads((folder / "manifest.json").read_text())["servers"]
    shutil.rmtree(folder / "cells" / "emulator-dflash-gsm8k-c1")
    proc, _ = sh([*PY, "sweep", "--resume", str(folder), "--data-dir", str(data)])
    servers = json.loads((folder / "manifest.json").read_text())["servers"]
    again = servers.get("emulator-dflash #2", {}).get("port")
    kept = servers.get("emulator-dflash") == first.get("emulator-dflash")
    return Row("--port 18001-style sweep resumed without --port", "resume uses the saved port; first server record kept",
               f"exit {proc.returncode}; resumed on {again} (saved {port}); first record kept: {kept}", None,
               left_behind(out), proc.returncode == 0 and again == port and kept)


@case
def run_all_failed(tmp: Path, data: Path) -> Row:
    out = tmp / "out"
    with EmulatorProcess(mode="ar", ttft_ms=1, itl_ms=1, output_len=8, fail_every=1, fail_kind="error") as em:
        proc, dt = sh(run_argv(em.url, out, data, "--no-warmup"))
    return Row("`run`, every request HTTP 500", "exit non-zero (as sweep)", f"exit {proc.returncode}", dt,
               left_behind(out), proc.returncode == 1)


@case
def hung_server_timeout(tmp: Path, data: Path) -> Row:
    out = tmp / "out"
    with BadServer("hang") as srv:
        proc, dt = sh(run_argv(srv.url, out, data, "--timeout", "2"))
    return Row("server accepts, never answers; run --timeout 2", "refused after ~2 s, no folder left",
               f"exit {proc.returncode}: {first_line(proc.stderr)[:90]}", dt,
               ", ".join(p.name for p in folders(out)) or "nothing",
               proc.returncode == 2 and dt < 10 and not folders(out))


@case
def failed_cell_counts(tmp: Path, data: Path) -> Row:
    out = tmp / "out"
    proc, _ = sh(sweep_argv(out, data, "--engine-arg=--crash-after-requests=10", conc="1,2"))
    (folder,) = folders(out)
    bad = []
    shown = ""
    for cid, s in summaries(folder).items():
        if s["status"] != "failed":
            continue
        file = folder / "cells" / cid / "requests.jsonl"
        recs = [json.loads(x) for x in file.read_text().splitlines()] if file.exists() else []
        recs = [r for r in recs if not r.get("warmup")]
        ok = sum("error" not in r for r in recs)
        shown = shown or f"{cid}: {s['num_requests']} req / {s['num_ok']} ok (records {len(recs)}/{ok}); {s['failure_reason'][:60]}"
        if s["num_requests"] != len(recs) or s["num_ok"] != ok:
            bad.append(cid)
    return Row("server exits mid-cell: the failed cell's summary", "counts = records; reason names the exit",
               shown or "no failed cell", None, left_behind(out), bool(shown) and not bad)


@case
def no_plan_resume(tmp: Path, data: Path) -> Row:
    out = tmp / "out"
    with EmulatorProcess(mode="ar", ttft_ms=1, itl_ms=1, output_len=8) as em:
        sh(run_argv(em.url, out, data, "--name", "r"))
    proc, dt = sh([*PY, "sweep", "--resume", str(out / "r")])
    said = first_line(proc.stderr)
    return Row("sweep --resume of a `run` folder (no sweep plan)", "says what is wrong, not 'plan differs'",
               f"exit {proc.returncode}: {said[7:110]}", dt, left_behind(out),
               proc.returncode == 2 and "written by `dflash-bench run`" in said and "differs" not in said)


# ---------------------------------------------------------------- interrupts, kills, a planted script


def _interrupt(tmp: Path, data: Path, sig: int) -> tuple[subprocess.Popen, Path, float, str]:
    out = tmp / "out"
    p = subprocess.Popen(sweep_argv(out, data, n=8, conc="1,2", suites="gsm8k,mt-bench"), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for(lambda: bool(folders(out)) and len(list(folders(out)[0].glob("cells/*/summary.json"))) >= 2, 240)
    t = time.monotonic()
    p.send_signal(sig)
    stdout, _ = p.communicate(timeout=60)
    return p, folders(out)[0], time.monotonic() - t, stdout


@case
def ctrl_c(tmp: Path, data: Path) -> Row:
    p, folder, dt, stdout = _interrupt(tmp, data, signal.SIGINT)
    hint = f"--resume {folder}" in stdout
    return Row("Ctrl-C mid-sweep", "exit 130, finished cells + resume command printed",
               f"exit {p.returncode}; resume command printed: {hint}", dt, left_behind(folder.parent),
               p.returncode == 130 and hint)


@case
def sigterm(tmp: Path, data: Path) -> Row:
    p, folder, dt, _ = _interrupt(tmp, data, signal.SIGTERM)
    status = json.loads((folder / "manifest.json").read_text())["status"]
    return Row("SIGTERM mid-sweep", "exit 130, manifest interrupted", f"exit {p.returncode}; manifest {status}", dt,
               left_behind(folder.parent), p.returncode == 130 and status == "interrupted")


@case
def kill9_resume(tmp: Path, data: Path) -> Row:
    p, folder, _, _ = _interrupt(tmp, data, signal.SIGKILL)
    before = {c: (folder / "cells" / c / "summary.json").read_bytes() for c in summaries(folder)}
    proc, _ = sh([*PY, "sweep", "--resume", str(folder), "--data-dir", str(data), "--port", str(free_port())])
    same = all((folder / "cells" / c / "summary.json").read_bytes() == b for c, b in before.items())
    done = sum(s["status"] == "complete" for s in summaries(folder).values())
    return Row("kill -9 mid-sweep, then --resume", "only missing cells run; finished ones byte-identical",
               f"resume exit {proc.returncode}; {len(before)} kept byte-identical: {same}; {done}/8 complete", None,
               left_behind(folder.parent), proc.returncode == 0 and same and done == 8)


@case
def server_killed_mid_cell(tmp: Path, data: Path) -> Row:
    out = tmp / "out"
    p = subprocess.Popen(sweep_argv(out, data, "--engine-arg=--itl-ms=20", n=8), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)

    def server_pid() -> int | None:
        if not folders(out) or not (folders(out)[0] / "manifest.json").exists():
            return None
        m = json.loads((folders(out)[0] / "manifest.json").read_text())
        info = m["servers"].get("emulator-ar") or {}
        running = any(c["status"] == "running" for c in m["plan"])
        return info.get("pid") if running else None

    wait_for(lambda: server_pid() is not None, 120)
    time.sleep(0.3)  # some requests in flight
    folder = folders(out)[0]
    os.kill(server_pid(), signal.SIGKILL)
    t = time.monotonic()
    cell = folder / "cells" / "emulator-ar-gsm8k-c1" / "summary.json"
    dt = wait_for(cell.exists, 120) - t
    p.communicate(timeout=240)
    s = summaries(folder)
    ar, df = s["emulator-ar-gsm8k-c1"], s.get("emulator-dflash-gsm8k-c1", {})
    return Row("server kill -9 mid-cell", "cell failed with reason, sweep goes on",
               f"AR {ar['status']} ({ar['failure_reason'][:50]}); DFlash {df.get('status')}; exit {p.returncode}", dt,
               left_behind(out), ar["status"] == "failed" and df.get("status") == "complete" and p.returncode == 1)


def _faulty(kind: str, reason: str):
    def play(tmp: Path, data: Path) -> Row:
        out = tmp / "out"
        with EmulatorProcess(mode="ar", ttft_ms=1, itl_ms=1, output_len=8, fail_every=2, fail_kind=kind) as em:
            proc, dt = sh(run_argv(em.url, out, data, "--no-warmup", "--name", "r"))
        (cell,) = folders(out / "r" / "cells") if (out / "r" / "cells").exists() else [None]
        recs = [json.loads(x) for x in (cell / "requests.jsonl").read_text().splitlines()] if cell else []
        failed = [r["error"] for r in recs if r.get("error")]
        return Row(f"{kind}: every 2nd request", f"failed records ({reason}), cell counts them",
                   f"exit {proc.returncode}; {len(failed)}/{len(recs)} failed: {(failed or ['-'])[0][:50]}", None,
                   left_behind(out), len(failed) == 2 and all(reason in f for f in failed))
    play.__name__ = f"fault_{kind}"
    return play


for _kind, _reason in (("error", "HTTP 500"), ("malformed", "malformed SSE"), ("drop", "stream dropped")):
    case(_faulty(_kind, _reason))


@case
def planted_script(tmp: Path, data: Path) -> Row:
    out = tmp / "out"
    with BadServer("script") as srv:
        sh(run_argv(srv.url, out, data, "--name", "r", "--label", "ar"))
        sh(run_argv(srv.url, out, data, "--name", "r", "--label", "dflash"))
    proc, _ = sh([*PY, "report", str(out / "r")])
    page = (out / "r" / "report.html").read_text() if (out / "r" / "report.html").exists() else ""
    raw = SCRIPT in page
    return Row("planted <script> in model output", "escaped in the report",
               f"report exit {proc.returncode}; raw markup in page: {raw}", None, left_behind(out),
               proc.returncode == 0 and bool(page) and not raw)


# ---------------------------------------------------------------- what a server's stream leaves out


def _plain_dflash_cell(out: Path, data: Path) -> tuple[subprocess.CompletedProcess, dict]:
    """`dflash-bench run --label dflash` against a plain server (one token a chunk, no usage per chunk, no
    /metrics): the run and its cell's summary."""
    with BadServer("plain") as srv:
        proc, _ = sh(run_argv(srv.url, out, data, "--name", "r", "--label", "dflash"))
    return proc, json.loads(next((out / "r").glob("cells/*/summary.json")).read_text())


@case
def no_chunk_usage(tmp: Path, data: Path) -> Row:
    out = tmp / "out"
    proc, s = _plain_dflash_cell(out, data)
    itl = s.get("itl_ms") or {}
    return Row("no per-chunk usage (1 token/chunk)", "ITL from chunk times and text, marked derived",
               f"ITL n={itl.get('n')} mean {itl.get('mean') or 0:.2f} ms; note: {'itl_ms' in s.get('not_measured', {})}",
               None, left_behind(out), bool(itl) and "itl_ms" in s.get("not_measured", {}))


@case
def dflash_without_speculation(tmp: Path, data: Path) -> Row:
    out = tmp / "out"
    proc, s = _plain_dflash_cell(out, data)
    loud = "DFlash not in effect" in proc.stdout
    return Row("--label dflash, /metrics 404", "flagged in table and summary",
               f"printed: {loud}; summary: {(s.get('dflash_warning') or '-')[:60]}", None, left_behind(out),
               loud and bool(s.get("dflash_warning")))


@case
def no_warmup_connect(tmp: Path, data: Path) -> Row:
    out = tmp / "out"
    with EmulatorProcess(mode="ar", ttft_ms=1, itl_ms=1, output_len=8) as em:
        proc, dt = sh(run_argv(em.url, out, data, "--no-warmup", "--name", "r", "-c", "4", "-n", "8"))
    recs = [json.loads(x) for x in next((out / "r").glob("cells/*/requests.jsonl")).read_text().splitlines()]
    conn = [r["connect_ms"] for r in recs if r.get("connect_ms") is not None]
    wait = [r["connect_wait_ms"] for r in recs if r.get("connect_wait_ms") is not None]
    said = all(r.get("connection") in ("new", "reused") for r in recs)
    write_after = all(r["t_write"] >= r["t_send"] for r in recs)
    return Row("--no-warmup: TCP connect", "handshake and event-loop wait apart; each request new or reused; "
               "TTFT from the write",
               f"{len(conn)} handshakes, mean {sum(conn) / max(len(conn), 1):.3f} ms; loop wait mean "
               f"{sum(wait) / max(len(wait), 1):.2f} ms; all say new/reused: {said}; TTFT starts at write: {write_after}",
               None, left_behind(out), bool(conn) and said and write_after)
