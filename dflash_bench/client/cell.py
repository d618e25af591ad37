"""Measure one cell: warm up, scrape /metrics, run the load, scrape again, write the cell through store.py.

`measure_cell` is the programmatic entry point (`dflash-bench run` and the sweep call it); it writes
requests.jsonl, server_metrics.json and, last, summary.json into `cell_dir`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Sequence

import orjson

from dflash_bench.client.loadgen import LoadGenerator, LoadSettings, ProgressFn
from dflash_bench.client.protocol import APIS, RequestSettings, chat_renderer
from dflash_bench.client.transport import TRANSPORTS, Transport, make_transport
from dflash_bench.errors import UserError
from dflash_bench.metrics import prometheus
from dflash_bench.metrics.acceptance import cell_acceptance
from dflash_bench.metrics.definitions import failure_reasons, summarize
from dflash_bench.store import TELEMETRY, CellSummary, SweepDir, now_iso


def measure_cell(url: str, prompts: Sequence, **options: Any) -> CellSummary:
    """Measure `prompts` against the server at `url`; write and return the cell summary.

    The options are `measure_cell_async`'s. Raises UserError when the server cannot be reached at all;
    request failures during the cell are recorded (with their reasons) and counted instead."""
    return asyncio.run(measure_cell_async(url, prompts, **options))


async def measure_cell_async(url: str, prompts: Sequence, *, concurrency: int, cell_dir: Path, engine: str = "vllm",
                             mode: str = "ar", suite: str | None = None, repeat: int = 0, max_tokens: int = 2048,
                             temperature: float = 0.0, api: str = "chat", model: str | None = None,
                             save_token_ids: bool = False, enable_thinking: bool | None = None, warmup: bool = True,
                             request_rate: float | None = None, timeout: float | None = 600.0, seed: int = 0,
                             transport: str = "auto", on_progress: ProgressFn | None = None, telemetry=None,
                             tokenizer: str | None = None) -> CellSummary:
    """One cell: warm-up, /metrics before, the measured load (GPU telemetry over it), /metrics after.

    With api="generate" (SGLang native), `tokenizer` (a Hugging Face id or folder) renders the model's
    chat template on the client; without it the raw prompt text is sent and the summary's settings say so."""
    if api not in APIS:
        raise UserError(f"unknown api {api!r}; choose one of {', '.join(APIS)}")
    if transport not in TRANSPORTS:
        raise UserError(f"unknown transport {transport!r}; choose one of {', '.join(TRANSPORTS)}")
    if concurrency < 1:
        raise UserError("concurrency must be at least 1")
    if not prompts:
        raise UserError("no prompts to send")
    cell_dir = Path(cell_dir)
    settings = {"api": api, "max_tokens": max_tokens, "temperature": temperature, "save_token_ids": save_token_ids,
                "enable_thinking": enable_thinking, "warmup": warmup, "request_rate": request_rate,
                "timeout_s": timeout, "seed": seed, "transport": transport, "num_prompts": len(prompts)}
    try:
        tr = make_transport(transport, url, concurrency + 2)
    except ValueError as err:  # e.g. the raw transport asked for an https:// URL
        raise UserError(str(err)) from None
    started = now_iso()
    snaps: dict[str, Any] = {"url": url.rstrip("/") + "/metrics"}
    try:
        settings["model"] = model or await _served_model(tr, url, api)
        render = None
        if api == "generate":
            settings["prompt_rendering"] = f"chat template of {tokenizer}" if tokenizer else "raw text (no chat template)"
            if tokenizer:
                try:
                    render = chat_renderer(tokenizer, enable_thinking)
                except ValueError as err:
                    raise UserError(str(err)) from None
        req = RequestSettings(api=api, model=settings["model"] or "", max_tokens=max_tokens, temperature=temperature,
                              save_token_ids=save_token_ids, enable_thinking=enable_thinking, render=render)
        load = LoadSettings(concurrency=concurrency, request_rate=request_rate, warmup=warmup, timeout=timeout, seed=seed)

        async def before() -> None:
            snaps["before"], snaps["error"] = await _scrape(tr)
            if telemetry is not None:  # GPU samples cover the measured window only
                telemetry.start()

        gen = LoadGenerator(tr, req, load, on_progress, between=before)
        try:
            result = await gen.run(prompts)
        finally:
            if telemetry is not None:
                telemetry.stop()
        after, err = await _scrape(tr)
        snaps["after"] = after
        snaps["error"] = snaps.get("error") or err
    finally:
        await tr.close()
    if snaps.get("before") and after:
        snaps["delta"] = prometheus.delta(snaps["before"], after)
    summary = CellSummary(cell_id=cell_dir.name, engine=engine, mode=mode, suite=suite or prompts[0].suite,
                          concurrency=concurrency, repeat=repeat, url=url, started_at=started, finished_at=now_iso(),
                          settings=settings, **summarize(result.records),
                          **cell_acceptance(engine, snaps.get("delta"), result.records))
    if telemetry is not None:
        _add_energy(summary, telemetry, cell_dir)
    summary.synthetic_acceptance = (snaps.get("after") or {}).get("gauges", {}).get(SYNTHETIC_GAUGE)
    reasons = failure_reasons(result.records)
    summary.failures = reasons
    # the records' time origin on this host's monotonic clock (time.perf_counter), to line them up with
    # server-side logs or other samples taken on the same host
    summary.clock_origin_monotonic_s = result.t0
    summary.server_metrics_error = snaps.get("error") or None
    if summary.num_ok == 0:
        summary.status = "failed"
        summary.failure_reason = "every measured request failed: " + ", ".join(f"{k} ({v})" for k, v in reasons.items())
    store = SweepDir(cell_dir.parent.parent)
    store.write_requests(cell_dir.name, result.records)
    store.write_server_metrics(cell_dir.name, snaps)
    store.write_summary(summary)
    return summary


SYNTHETIC_GAUGE = "dflash_bench:synthetic_acceptance"  # the builtin engine's benchmarking-only label


def _add_energy(summary: CellSummary, sampler, cell_dir: Path) -> None:
    """Energy of the measured window from the GPU samples; telemetry.csv beside the summary."""
    energy = sampler.summarize(summary.total_output_tokens)
    sampler.write_csv(cell_dir / TELEMETRY)
    for key, value in (energy.summary_fields() | energy.extra_fields()).items():
        setattr(summary, key, value)


async def _served_model(tr: Transport, url: str, api: str) -> str | None:
    """The first served model name from /v1/models; a server that cannot be reached is a UserError."""
    try:
        status, body = await asyncio.wait_for(tr.get("/v1/models"), 30)
    except Exception as err:  # noqa: BLE001 - OS, timeout, aiohttp/httpx connection errors alike
        why = str(err).split("[", 1)[-1].rstrip("]")[:120] or type(err).__name__
        raise UserError(f"cannot reach the server at {url} ({why}); is it running and ready?") from None
    if status == 200:
        try:
            data = orjson.loads(body).get("data") or []
            if data and data[0].get("id"):
                return str(data[0]["id"])
        except (orjson.JSONDecodeError, AttributeError):
            pass
    if api == "generate":
        return None
    raise UserError(f"the server at {url} did not list a model at /v1/models (HTTP {status}); pass --model")


async def _scrape(tr: Transport) -> tuple[dict | None, str | None]:
    try:
        status, body = await asyncio.wait_for(tr.get("/metrics"), 30)
    except Exception as err:  # noqa: BLE001 - any failure means "no counters", recorded with its reason
        return None, f"/metrics unreachable: {type(err).__name__}"
    if status != 200:
        return None, f"/metrics answered HTTP {status}"
    try:
        return prometheus.parse(body.decode("utf-8", "replace")), None
    except ValueError as err:
        return None, f"/metrics is not Prometheus text: {str(err)[:120]}"
