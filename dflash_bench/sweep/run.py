"""Run a sweep: one server per (engine, mode) launch, every cell on it, teardown; resumable at any point.

The order of work is owned here; measuring a cell is `client.cell.measure_cell`, launching a server is
`launch.launch_server`, and everything lands in the sweep folder through the store (dflash_bench/store/).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Any, Iterator

from dflash_bench.errors import UserError
from dflash_bench.store import CellPlan, GpuInfo, Manifest, ServerRecord, StoreError, SweepDir
from dflash_bench.sweep import provenance
from dflash_bench.sweep.folder import close_sweep, open_sweep, stop_leftovers
from dflash_bench.sweep.plan import Launch, SweepSettings, launches
from dflash_bench.sweep.progress import SweepProgress


@dataclass
class SweepResult:
    path: Path
    failed: list[str] = field(default_factory=list)
    interrupted: bool = False

    @property
    def exit_code(self) -> int:
        return 130 if self.interrupted else (1 if self.failed else 0)


def run_sweep(settings: SweepSettings, *, out: Path, resume: Path | None = None, data_dir: Path | None = None,
              argv: list[str] | None = None, quiet: bool = False, image: str | None = None) -> SweepResult:
    """Plan (or reload) the sweep, run every cell not yet complete, and return where it landed."""
    from dflash_bench import models

    if provenance.redact(settings.engine_args) != settings.engine_args:  # it would land in the manifest
        raise UserError("an --engine-arg carries a secret (a token, key or password); pass it through the "
                        "environment instead (HF_TOKEN, VLLM_API_KEY, ...) so it is never written to the sweep folder")
    pair = models.resolve(settings.model, drafter=settings.engine_options.get("drafter"))
    image = image or settings.image
    prompts = None
    if resume is None:  # a missing dataset fails before a sweep folder exists
        prompts = prompt_loader(settings, data_dir)
    # a mismatched resume is refused before any dataset is touched; the folder's lock, taken here, is
    # held until everything is written
    sweep, manifest, lock = open_sweep(settings, out, resume, pair, argv or sys.argv)
    try:
        if resume is not None:
            stop_leftovers(manifest.sweep_id)  # only now: the lock says no other run of this sweep is alive
            prompts = prompt_loader(settings, data_dir)
        result = _run_plan(settings, pair, sweep, manifest, prompts, image, quiet)
        annotate_quality(sweep, settings)
    finally:
        lock.release()
    return result


def _run_plan(settings: SweepSettings, pair, sweep: SweepDir, manifest: Manifest, prompts, image: str | None,
              quiet: bool) -> SweepResult:
    progress = SweepProgress(manifest, quiet=quiet)
    result = SweepResult(sweep.path)
    telemetry = start_telemetry(manifest, progress, settings, pair)
    try:
        with progress:
            for group in _groups(launches(manifest.plan, paired=settings.paired), settings.paired):
                run_servers(group, settings, pair, sweep, manifest, prompts, progress, telemetry, result, image)
    except KeyboardInterrupt:
        result.interrupted = True
    except SystemExit as err:  # SIGTERM unwinds as launch.Terminated (a SystemExit)
        result.interrupted = True
        if not is_terminated(err):
            raise
    finally:
        close_sweep(sweep, manifest, result)
    if not quiet:
        progress.print_table(sweep)
        if result.interrupted:
            progress.print_resume(sweep)
    return result


def _groups(ls: list[Launch], paired: bool) -> list[list[Launch]]:
    """The launches whose servers run together: each alone, or paired an engine's two."""
    return [list(g) for _, g in groupby(ls, key=lambda launch: launch.engine)] if paired else [[launch] for launch in ls]


# ------------------------------------------------------------------ server lifetimes


def run_servers(group: list[Launch], settings: SweepSettings, pair, sweep: SweepDir, manifest: Manifest, prompts,
                progress: SweepProgress, telemetry, result: SweepResult, image: str | None) -> None:
    """Server lifetimes run together: one launch, or with --paired an engine's AR and DFlash launches (the DFlash
    server on a free port); their cells in plan order. A server that does not start fails its own cells, one that
    dies fails its later ones."""
    mine = {id(c) for launch in group for c in launch.cells}
    cells = [c for c in manifest.plan if id(c) in mine]
    try:
        with contextlib.ExitStack() as stack:
            servers = {}
            for launch in group:
                port = settings.port
                if len(group) > 1 and launch.mode == "dflash":
                    from dflash_bench.launch import free_port

                    port = free_port()
                try:
                    servers[launch.mode] = stack.enter_context(_server(launch, settings, pair, sweep, manifest, image, port))
                except UserError as err:
                    for cell in launch.cells:
                        fail_cell(sweep, manifest, cell, f"server did not start: {_reason(err)}", result)
                    continue
                _record_server(manifest, f"{launch.engine}-{launch.mode}", servers[launch.mode]["info"])
                _check_same_image(manifest, launch.engine)
            sweep.write_manifest(manifest)
            for cell in [c for c in cells if c.mode in servers]:
                server = servers[cell.mode]
                try:
                    server["check"]()
                except UserError as err:  # the server died between cells: its later cells fail
                    fail_cell(sweep, manifest, cell, f"server died: {_reason(err)}", result)
                    continue
                _run_cell(cell, server["url"], settings, pair, sweep, manifest, prompts, progress, telemetry,
                          server["check"], result)
    except UserError as err:  # as the servers went down: what is left of these launches fails
        for cell in cells:
            if cell.status not in ("complete", "failed"):
                fail_cell(sweep, manifest, cell, f"server did not start: {_reason(err)}", result)


def _record_server(manifest: Manifest, key: str, info: ServerRecord) -> None:
    """The first server of each (engine, mode) keeps its key; later ones (a resume, a relaunch) are added
    beside it as `<key> #2`, `#3`, ..., so the record of what measured the first cells is never lost."""
    if key not in manifest.servers:
        manifest.servers[key] = info
        return
    n = 2
    while f"{key} #{n}" in manifest.servers:
        n += 1
    manifest.servers[f"{key} #{n}"] = info


def _check_same_image(manifest: Manifest, engine: str) -> None:
    """AR and DFlash must run the same image: a digest that changed between them (a re-pulled tag) is noted."""
    digests = {mode: getattr(manifest.servers.get(f"{engine}-{mode}"), "image_digest", None) for mode in ("ar", "dflash")}
    if all(digests.values()) and digests["ar"] != digests["dflash"]:
        note = f"{engine}: the AR and DFlash servers ran different image digests ({digests['ar']} vs {digests['dflash']})"
        if note not in manifest.notes:
            manifest.notes.append(note)


@contextlib.contextmanager
def _server(launch: Launch, settings: SweepSettings, pair, sweep: SweepDir, manifest: Manifest,
            image: str | None, port: int | None) -> Iterator[dict[str, Any]]:
    """A running server for this launch: launched by us on `port` (None: the engine's default), or the user's
    own URL."""
    if settings.url_ar:
        url = settings.url_ar if launch.mode == "ar" else settings.url_dflash
        yield {"url": url, "check": lambda: None, "info": ServerRecord(runner="external", url=url)}
        return
    from dflash_bench.launch import launch_server
    from dflash_bench.telemetry import scheduler_gpus

    runner = settings.runner
    gpus = (scheduler_gpus() or "all") if runner == "docker" else "all"  # a container escapes a Slurm job's GPUs
    with launch_server(launch.engine, pair, launch.mode, runner=runner, preset=settings.gpu, gpus=gpus,
                       extra_args=settings.engine_args, sweep_id=manifest.sweep_id, image=image,
                       log_path=sweep.log_path(launch.engine, launch.mode),
                       port=port) as server:
        yield {"url": server.url, "check": server.check, "info": server.info.model_copy()}


# ------------------------------------------------------------------ one cell


def _run_cell(cell: CellPlan, url: str, settings: SweepSettings, pair, sweep: SweepDir, manifest: Manifest, prompts,
              progress: SweepProgress, telemetry, check, result: SweepResult) -> None:
    from dflash_bench import profiles
    from dflash_bench.client.cell import measure
    from dflash_bench.client.summary import summarize_cell, write_cell

    _clear_attempt(sweep, manifest, cell)
    cell.status, cell.reason = "running", None
    sweep.write_manifest(manifest)
    cell_prompts, max_tokens = prompts(cell.suite, cell.concurrency)
    progress.start_cell(cell, total=sum(len(p.turns) for p in cell_prompts))
    thinking = settings.thinking if settings.thinking is not None else pair.thinking
    if cell.thinking_asked is not None:  # --thinking both: this cell's arm
        thinking = cell.thinking_asked
    try:
        m = measure(url, cell_prompts, concurrency=cell.concurrency, max_tokens=max_tokens,
                    temperature=settings.temperature, api=profiles.get(cell.engine).api,
                    save_token_ids=settings.save_token_ids, enable_thinking=thinking, seed=settings.seed,
                    telemetry=telemetry, on_progress=progress.on_request,
                    tokenizer=profiles.get(cell.engine).tokenizer(pair))
    except UserError as err:
        fail_cell(sweep, manifest, cell, _reason(err), result)
        return
    failure = None
    try:
        check()  # a server that died mid-cell fails the cell even if some requests got through
    except UserError as err:
        failure = f"server died: {_reason(err)}"
    summary = summarize_cell(m, cell_id=cell.cell_id, engine=cell.engine, mode=cell.mode, suite=cell.suite,
                             concurrency=cell.concurrency, repeat=cell.repeat, failure=failure,
                             input_len=cell.input_len, thinking_asked=cell.thinking_asked)
    _record_thinking(summary, pair.target, cell_prompts, thinking)
    write_cell(sweep, summary, m)  # what was measured is kept and counted, failed or not
    cell.status, cell.reason = summary.status, summary.failure_reason
    if summary.status == "failed":
        result.failed.append(cell.cell_id)
    sweep.write_manifest(manifest)
    sweep.write_results_csv()
    progress.end_cell(cell, summary)


def _record_thinking(summary, target: str, prompts, enable_thinking: bool | None) -> None:
    """Thinking as the cell's first prompt renders with the target's own template (thinking.record)."""
    from dflash_bench.thinking import record

    if not prompts:
        return
    rec = record(target, [{"role": "user", "content": prompts[0].turns[0]}], enable_thinking)
    summary.thinking, summary.thinking_evidence, summary.template_hash = rec.mode, rec.evidence, rec.template_hash


def _reason(err: UserError) -> str:
    """A server's death explained by the log lines that say why (launch.common.explain), else the message."""
    return getattr(err, "reason", None) or str(err)


def _clear_attempt(sweep: SweepDir, manifest: Manifest, cell: CellPlan) -> None:
    """A cell measured again (it failed, or a kill cut it short) starts from an empty folder, so no file of
    the earlier attempt (a failed summary, its telemetry) can mix with the new one; the manifest keeps why."""
    folder = sweep.cell_dir(cell.cell_id)
    if not folder.is_dir():
        return
    try:
        old = sweep.read_summary(cell.cell_id)
    except StoreError:  # half-written by the kill: nothing to keep
        old = None
    if old is not None and old.status == "failed":
        manifest.notes.append(f"{cell.cell_id}: measured again after a failed attempt ({old.failure_reason})")
    shutil.rmtree(folder)


def fail_cell(sweep: SweepDir, manifest: Manifest, cell: CellPlan, reason: str, result: SweepResult) -> None:
    """Record a failed cell (with its reason) as a summary, so it is done and visible everywhere; whatever
    requests.jsonl the attempt left is counted in it."""
    from dflash_bench.client.summary import summarize_records

    summary = summarize_records(sweep.read_requests(cell.cell_id), cell_id=cell.cell_id, engine=cell.engine,
                                mode=cell.mode, suite=cell.suite, concurrency=cell.concurrency, repeat=cell.repeat,
                                failure=reason, input_len=cell.input_len, thinking_asked=cell.thinking_asked)
    cell.status, cell.reason = "failed", summary.failure_reason
    sweep.write_summary(summary)
    sweep.write_manifest(manifest)
    sweep.write_results_csv()
    result.failed.append(cell.cell_id)


LONG_MAX_TOKENS = 256  # new tokens per request on the long-<N> suites unless --max-tokens says otherwise


def prompt_loader(settings: SweepSettings, data_dir: Path | None):
    """(suite, concurrency) -> (prompts, max_tokens). Suites load once up front so bad data fails fast.

    The --input-len suites (long-<N>) are built from real text by longctx.build_prompts, counted with the
    target's tokenizer when it is a local folder (else about 4 characters a token, as each prompt records)."""
    from dflash_bench.longctx import build_prompts
    from dflash_bench.suites import get_suite, load_prompts
    from dflash_bench.sweep.plan import long_suite

    for suite in settings.suites:
        get_suite(suite)
    long = {long_suite(n): n for n in settings.input_lens}
    tokenizer = _local_target(settings.model)
    check_context(settings, tokenizer)
    cache: dict[tuple[str, int], tuple[list, int]] = {}

    def load(suite: str, concurrency: int) -> tuple[list, int]:
        if (suite, concurrency) not in cache:
            n = max(settings.num_prompts or max(16, 4 * concurrency), concurrency)
            if suite in long:
                prompts = build_prompts(long[suite], data_dir=data_dir, num_prompts=n, tokenizer=tokenizer,
                                        seed=settings.seed)
                cache[(suite, concurrency)] = (prompts, settings.max_tokens or LONG_MAX_TOKENS)
            else:
                prompts = load_prompts(suite, data_dir=data_dir, num_prompts=n, seed=settings.seed)
                cache[(suite, concurrency)] = (prompts, settings.max_tokens or get_suite(suite).default_max_tokens)
        return cache[(suite, concurrency)]

    for suite in [*settings.suites, *long]:  # fail before any server starts when a dataset is missing or malformed
        load(suite, settings.concurrency[0])
    return load


def _local_target(model: str) -> Path | None:
    """The target's folder when it is one on this machine (its tokenizer counts the long prompts)."""
    path = Path(model)
    return path if (path / "config.json").is_file() and (path / "tokenizer_config.json").is_file() else None


def check_context(settings: SweepSettings, target: Path | None) -> None:
    """Refuse an --input-len the target cannot hold, where its config says how many positions it has."""
    import json

    if not settings.input_lens or target is None:
        return
    try:
        config = json.loads((target / "config.json").read_text())
    except (OSError, ValueError):
        return
    limit = config.get("max_position_embeddings") or (config.get("text_config") or {}).get("max_position_embeddings")
    new = settings.max_tokens or LONG_MAX_TOKENS
    too_long = [n for n in settings.input_lens if isinstance(limit, int) and n + new > limit]
    if too_long:
        raise UserError(f"--input-len {too_long[0]} plus {new} new tokens passes the target's {limit} positions "
                        f"({settings.model}): use lengths up to {limit - new}, or a target with a longer context")


def start_telemetry(manifest: Manifest, progress: SweepProgress, settings: SweepSettings, pair):
    """One sampler for the whole sweep (each cell is one window) over the server's own GPUs, or None
    when NVML has no GPU to watch."""
    from dflash_bench.telemetry import TelemetrySampler, gpu_inventory, probe, resolve_gpus, scheduler_gpus

    status = probe(None)
    gpus = None
    if status.enabled:  # devices 0..tp-1 of what the server sees (a container launched here sees every GPU)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES") if settings.runner == "process" else scheduler_gpus()
        devices = server_devices(settings, pair)
        gpus = resolve_gpus(devices, visible) if devices is not None else None
    sampler = TelemetrySampler(gpus)
    manifest.telemetry = sampler.status.as_manifest()
    if sampler.enabled:
        manifest.hardware.gpus = [GpuInfo.model_validate(g) for g in gpu_inventory(sampler.status.gpus)]
    else:
        progress.note(sampler.status.message)
    return sampler if sampler.enabled else None


def server_devices(settings: SweepSettings, pair) -> list[int] | None:
    """The device numbers a launched server uses: its tensor-parallel size from the card flags and
    --engine-arg (one GPU when neither says). None for servers the user runs: which GPUs is unknown."""
    if settings.url_ar:
        return None
    from dflash_bench import profiles

    tp = max(profiles.tensor_parallel(profiles.get(e).command(pair, "ar", 0, settings.gpu, settings.engine_args)) or 1
             for e in settings.engines)
    return list(range(tp))


def annotate_quality(sweep: SweepDir, settings: SweepSettings) -> None:
    """The token-level lossless check, where token ids were saved."""
    if not settings.save_token_ids:
        return
    from dflash_bench.quality.lossless import annotate_sweep

    annotate_sweep(sweep.path)


def is_terminated(err: SystemExit) -> bool:
    from dflash_bench.launch import Terminated

    return isinstance(err, Terminated)
