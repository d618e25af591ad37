"""`dflash-bench run`: measure one running server on one suite at one concurrency, as one sweep cell."""

from __future__ import annotations

import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_bench.client.cell import Measurement, check_steady, measure
from dflash_bench.client.loadgen import LoadSettings
from dflash_bench.client.protocol import RequestSettings
from dflash_bench.client.server_slots import check_slots
from dflash_bench.client.summary import summarize_cell, write_cell
from dflash_bench.errors import UserError
from dflash_bench.store import CellPlan, CellSummary, Manifest, SweepDir, cell_id
from dflash_bench.store.folder import check_folder_name
from dflash_bench.store.lock import WriterLock

if TYPE_CHECKING:
    from dflash_bench.suites import Prompt


def run_one(url: str, suite: str, request: RequestSettings, load: LoadSettings, *, label: str, engine: str, out: Path,
            name: str | None = None, data_dir: Path | None = None, num_prompts: int | None = None,
            quiet: bool = False, expect_model: str | None = None) -> tuple[Path, CellSummary]:
    """Load the prompts (`load.seed` picks them), measure the cell into `<out>/<name>/cells/<cell-id>/`, print a
    summary.

    Returns the cell folder and its summary (the caller exits non-zero when the cell failed). The folder
    is locked while this runs; one made here and left with nothing measured is removed again."""
    from dflash_bench.suites import load_prompts

    api, concurrency = request.api, load.concurrency
    if name is not None:
        check_folder_name(name)  # the cell goes under --out, nowhere else
    _check_options(url, label, engine, api, load.transport)
    check_steady(load)
    _probe(url, load.timeout)
    check_slots(url, concurrency, load.timeout)
    from dflash_bench.launch.identity import changed, verify_external

    identity = verify_external(url, expect_model, load.timeout)  # --expect-model refused before anything is written
    if not quiet and (note := acceptance_note(engine, label, api)):
        from dflash_bench.console import new_console
        from rich.markup import escape

        new_console(stderr=True).print(f"[yellow]{escape(note)}[/]", highlight=False)
    prompts = load_prompts(suite, data_dir=data_dir, num_prompts=num_prompts, seed=load.seed)
    name = name or "run-" + datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    cid = cell_id(engine, label, suite, concurrency)
    sweep, manifest, lock, fresh = _open_or_create(Path(out) / name, cid)
    try:
        plan = CellPlan(cell_id=cid, engine=engine, mode=label, suite=suite, concurrency=concurrency, status="running")
        manifest.plan = [c for c in manifest.plan if c.cell_id != cid] + [plan]
        sweep.write_manifest(manifest)
        try:
            m = _measure_with_progress(quiet, cid, url, prompts, request, load)
        except (UserError, KeyboardInterrupt) as err:
            if fresh:  # nothing was measured: leave no empty sweep folder behind
                shutil.rmtree(sweep.path, ignore_errors=True)
            else:
                plan.status, plan.reason = "failed", str(err) or "interrupted"
                manifest.status = "failed" if isinstance(err, UserError) else "interrupted"
                sweep.write_manifest(manifest)
            raise
        why = changed(identity, url, load.timeout)  # another server answering now (restarted, or another model) fails the cell
        summary = summarize_cell(m, cell_id=cid, engine=engine, mode=label, suite=suite, concurrency=concurrency,
                                 failure=f"server identity changed mid-cell: {why}" if why else None)
        summary.server_identity = identity.summary()
        write_cell(sweep, summary, m)
        plan.status, plan.reason = summary.status, summary.failure_reason
        manifest.status = ("complete" if all(c.status == "complete" for c in manifest.plan) else
                           "failed" if any(c.status == "failed" for c in manifest.plan) else "partial")
        sweep.write_manifest(manifest)
        sweep.write_results_csv()
    finally:
        lock.release()
    if not quiet:
        print_summary(summary, sweep.cell_dir(cid))
    return sweep.cell_dir(cid), summary


def acceptance_note(engine: str, label: str, api: str) -> str | None:
    """Why a DFlash cell's tau cannot be read with this API (SGLang: only /generate's meta_info carries it)."""
    from dflash_bench import profiles

    profile = profiles.get(engine)
    if label != "dflash" or profile.acceptance != "sglang-meta" or api == profile.api:
        return None
    return (f"{engine} reports acceptance only through its native API: with --api {api} this cell's tau will be "
            f"missing; measure with --api {profile.api} --tokenizer MODEL (the served model's chat template)")


def _check_options(url: str, label: str, engine: str, api: str, transport: str) -> None:
    if label not in ("ar", "dflash"):
        raise UserError(f"--label must be 'ar' or 'dflash', not {label!r}")
    from dflash_bench import profiles

    if engine not in profiles.names():  # the profile says how acceptance is read
        raise UserError(f"--engine must be one of {', '.join(profiles.names())}, not {engine!r}")
    from dflash_bench.client.protocol import APIS
    from dflash_bench.client.transport import TRANSPORTS

    if api not in APIS:
        raise UserError(f"unknown api {api!r}; choose one of {', '.join(APIS)}")
    if transport not in TRANSPORTS:
        raise UserError(f"unknown transport {transport!r}; choose one of {', '.join(TRANSPORTS)}")
    if not url.startswith(("http://", "https://")):
        raise UserError(f"--url must start with http:// or https:// (got {url!r})")


def _probe(url: str, timeout: float | None) -> None:
    """Refuse an unreachable server before anything is written to disk."""
    import socket
    from urllib.parse import urlsplit

    u = urlsplit(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        socket.create_connection((u.hostname or "127.0.0.1", port), timeout=timeout).close()
    except OSError as err:
        raise UserError(f"cannot reach the server at {url} ({err.strerror or err}); is it running and ready?") from None


def _open_or_create(path: Path, cid: str) -> tuple[SweepDir, Manifest, WriterLock, bool]:
    """The folder and its writer's lock, held by this process; True when the folder was made here."""
    from dflash_bench.store.lock import create_locked, open_locked

    if (path / "manifest.json").exists():
        sweep, lock = open_locked(path)
        if sweep.is_complete(cid):
            lock.release()
            raise UserError(f"{path} already holds a measured cell {cid}; choose another --name or --label")
        return sweep, sweep.read_manifest(), lock, False
    from dflash_bench.store.provenance import redact

    sweep, lock = create_locked(path, Manifest(sweep_id=path.name, command_line=redact(sys.argv)))
    return sweep, sweep.read_manifest(), lock, True


def _measure_with_progress(quiet: bool, cid: str, url: str, prompts: list[Prompt], request: RequestSettings,
                           load: LoadSettings) -> Measurement:
    if quiet:
        return measure(url, prompts, request, load)
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    total = sum(len(p.turns) for p in prompts)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task(escape(cid), total=total, rate="")
        last = [0.0]

        def on_progress(done: int, _total: int, tokens: int, elapsed: float) -> None:
            now = time.monotonic()
            if now - last[0] > 0.1 or done == total:
                last[0] = now
                bar.update(task, completed=done, rate=f"{tokens / elapsed:,.0f} tok/s" if elapsed > 0 else "")

        return measure(url, prompts, request, load, on_progress=on_progress)


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


ROWS = (("TTFT ms", "ttft_ms"), ("TPOT ms", "tpot_ms"), ("per-token latency ms", "itl_ms"),
        ("chunk gap ms", "chunk_gap_ms"), ("E2E ms", "e2e_ms"), ("tok/s/user", "tok_s_user"),
        ("tokens/chunk", "tokens_per_chunk"), ("TCP handshake ms", "connect_ms"),
        ("connect wait ms (event loop)", "connect_wait_ms"))


def print_summary(s: CellSummary, cell_dir: Path) -> None:
    from dflash_bench.console import new_console
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"{escape(s.cell_id)}  ({s.num_ok} ok, {s.num_failed} failed, {_fmt(s.duration_s, '.2f')} s)")
    for col in ("metric", "mean", "p50", "p90", "p99", "note"):
        t.add_column(col, justify="right" if col not in ("metric", "note") else "left")
    for name, key in ROWS:
        stat, why = getattr(s, key), s.not_measured.get(key)
        if stat is not None:
            t.add_row(name, _fmt(stat.mean), _fmt(stat.p50), _fmt(stat.p90), _fmt(stat.p99), escape(why or ""))
        elif why:
            t.add_row(name, "-", "-", "-", "-", f"[yellow]not measured: {escape(why)}[/]")
    con = new_console()
    con.print(t)
    con.print(f"output throughput: {_fmt(s.output_throughput)} tok/s   requests: {_fmt(s.request_throughput, '.2f')} req/s")
    if s.acceptance_length is not None:
        con.print(f"acceptance length tau: {s.acceptance_length:.3f} ({s.acceptance_source})"
                  + (f", request-weighted {s.acceptance_length_req_weighted:.3f}" if s.acceptance_length_req_weighted else ""))
    else:
        con.print("acceptance length tau: absent (the server reported no speculative counters)")
    if s.prefix_cache_hit_rate:
        con.print(f"prefix cache: {100 * s.prefix_cache_hit_rate:.1f}% of the prompt tokens were read from the "
                  f"server's cache ({s.prefix_cache_source}), not computed")
    if s.dflash_warning:
        con.print(f"[bold red]WARNING: DFlash not in effect: {escape(s.dflash_warning)}[/]", highlight=False)
    if s.num_failed:
        reasons = escape(", ".join(f"{k} ({v})" for k, v in s.failures.items()))
        con.print(f"[yellow]{s.num_failed} request(s) failed: {reasons}[/yellow]", markup=True, highlight=False)
    if s.status != "complete":
        con.print(f"[bold red]cell {s.status}: {escape(s.failure_reason or '')}[/]", highlight=False)
    con.print(f"written to {escape(str(cell_dir))}", highlight=False)
