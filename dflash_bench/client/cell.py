"""Measure one cell: warm up, scrape /metrics, run the load, scrape again. Nothing is written here.

`measure` returns a `Measurement` (the records and counter snapshots); `client.summary.summarize_cell`
turns it into a CellSummary and `client.summary.write_cell` writes both through the caller's SweepDir.
`client.summary.measure_cell` composes the three for callers that hold only a cell folder (tests, scripts).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Sequence

import orjson

from dflash_bench.client.loadgen import LoadGenerator, LoadSettings, ProgressFn
from dflash_bench.client.protocol import APIS, RequestSettings, chat_renderer
from dflash_bench.client.transport import TRANSPORTS, Transport, make_transport, with_timeout
from dflash_bench.errors import UserError
from dflash_bench.http_limits import BodyTooLong
from dflash_bench.metrics import prometheus
from dflash_bench.store import CellSettings, RequestRecord, ServerMetrics, SteadyPlan, now_iso

if TYPE_CHECKING:
    from dflash_bench.suites import Prompt
    from dflash_bench.telemetry import TelemetrySampler


@dataclass
class Measurement:
    """What one cell's load produced, before any aggregation."""

    url: str
    records: list[RequestRecord]
    settings: CellSettings  # how the client measured (the request and load settings, the served model)
    started_at: str
    finished_at: str
    t0: float  # perf_counter origin of the records' times (this host's monotonic clock)
    snaps: ServerMetrics  # /metrics before, after, delta, error
    telemetry: TelemetrySampler | None = None  # the GPU sampler that covered the measured window, if any


def measure(url: str, prompts: Sequence[Prompt], request: RequestSettings, load: LoadSettings,
            telemetry: TelemetrySampler | None = None, on_progress: ProgressFn | None = None) -> Measurement:
    """`measure_async` run to its end on a fresh event loop."""
    return asyncio.run(measure_async(url, prompts, request, load, telemetry, on_progress))


async def measure_async(url: str, prompts: Sequence[Prompt], request: RequestSettings, load: LoadSettings,
                        telemetry: TelemetrySampler | None = None,
                        on_progress: ProgressFn | None = None) -> Measurement:
    """One cell: warm-up, /metrics before, the measured load (GPU telemetry over it), /metrics after.

    Every request, the /v1/models and /metrics ones included, obeys `load.timeout` (seconds; None: none).
    `request.model` empty: the first model /v1/models lists. With api="generate" (SGLang native),
    `request.tokenizer` (a Hugging Face id or folder) renders the model's chat template on the client;
    without it the raw prompt text is sent and the settings say so."""
    check_options(request.api, load.transport, load.concurrency, prompts)
    check_steady(load)
    try:
        tr = make_transport(load.transport, url, load.concurrency + 2)
    except ValueError as err:  # e.g. the raw transport asked for an https:// URL
        raise UserError(str(err)) from None
    started = now_iso()
    snaps = ServerMetrics(url=url.rstrip("/") + "/metrics")
    try:
        model = request.model or await served_model(tr, url, request.api, load.timeout)
        req = replace(request, model=model or "", render=request.render or renderer_for(request))

        async def before() -> None:
            snaps.before, snaps.error = await scrape_metrics(tr, load.timeout)
            if telemetry is not None:  # GPU samples cover the measured window only
                telemetry.start()

        gen = LoadGenerator(tr, req, load, on_progress, between=before)
        try:
            result = await gen.run(prompts)
        finally:
            if telemetry is not None:
                telemetry.stop()
        snaps.after, late = await scrape_metrics(tr, load.timeout)
        snaps.error = snaps.error or late
    finally:
        await tr.close()
    if snaps.before and snaps.after:
        snaps.delta = prometheus.delta(snaps.before, snaps.after)
    settings = cell_settings(request, load, model, len(prompts))
    settings.prompt_passes = result.passes
    return Measurement(url=url, records=result.records, settings=settings,
                       started_at=started, finished_at=now_iso(), t0=result.t0, snaps=snaps, telemetry=telemetry)


def cell_settings(request: RequestSettings, load: LoadSettings, model: str | None, num_prompts: int) -> CellSettings:
    """What summary.json keeps of how the cell was measured."""
    rendering = None
    if request.api != "chat":
        rendering = f"chat template of {request.tokenizer}" if request.tokenizer else "raw text (no chat template)"
    return CellSettings(api=request.api, model=model, max_tokens=request.max_tokens, temperature=request.temperature,
                        save_token_ids=request.save_token_ids, enable_thinking=request.enable_thinking,
                        warmup=load.warmup, request_rate=load.request_rate, timeout_s=load.timeout, seed=load.seed,
                        transport=load.transport, num_prompts=num_prompts, ignore_eos=request.ignore_eos,
                        prompt_rendering=rendering, min_seconds=load.min_seconds or None, history=load.history,
                        steady=SteadyPlan(ramp=load.ramp, requests=load.steady_requests)
                        if load.steady_requests else None)


def check_steady(load: LoadSettings) -> None:
    """A steady stream's options, or the one sentence on why they cannot be measured."""
    if load.steady_requests is None:
        if load.steady_ramp is not None:
            raise UserError("--steady-ramp needs --steady-requests (the window it comes before)")
        return
    if load.steady_requests < 1 or load.ramp < 0:
        raise UserError("a steady stream needs --steady-requests of at least 1 and a --steady-ramp of 0 or more")
    if load.steady_requests < load.concurrency:
        raise UserError(f"--steady-requests {load.steady_requests} is smaller than the concurrency "
                        f"{load.concurrency}: the window must hold at least one completion per request in flight, so "
                        f"pass --steady-requests {load.concurrency} or more")
    if load.request_rate:
        raise UserError("--steady-requests keeps the concurrency constant (a closed loop); it cannot be combined "
                        "with --request-rate (Poisson arrivals)")
    if load.min_seconds:
        raise UserError("--steady-requests sets the window's length by completions; it cannot be combined with "
                        "--min-cell-seconds")


def check_options(api: str, transport: str, concurrency: int, prompts: Sequence[Prompt]) -> None:
    if api not in APIS:
        raise UserError(f"unknown api {api!r}; choose one of {', '.join(APIS)}")
    if transport not in TRANSPORTS:
        raise UserError(f"unknown transport {transport!r}; choose one of {', '.join(TRANSPORTS)}")
    if concurrency < 1:
        raise UserError("concurrency must be at least 1")
    if not prompts:
        raise UserError("no prompts to send")


def renderer_for(request: RequestSettings) -> Callable[[list[dict[str, str]]], str] | None:
    """/generate or /v1/completions with a tokenizer: the model's chat template, rendered here."""
    if request.api == "chat" or not request.tokenizer:
        return None
    try:
        return chat_renderer(request.tokenizer, request.enable_thinking)
    except ValueError as err:
        raise UserError(str(err)) from None


async def served_model(tr: Transport, url: str, api: str, timeout: float | None) -> str | None:
    """The first served model name from /v1/models; a server that cannot be reached is a UserError."""
    try:
        status, body = await with_timeout(tr.get("/v1/models"), timeout)
    except TimeoutError:
        raise UserError(f"the server at {url} accepted the connection but did not answer GET /v1/models "
                        f"within {timeout:g} s (--timeout); is it ready?") from None
    except BodyTooLong as err:
        raise UserError(f"GET /v1/models: {err}") from None
    except Exception as err:  # noqa: BLE001 - OS and aiohttp/httpx connection errors alike
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


async def scrape_metrics(tr: Transport, timeout: float | None) -> tuple[dict[str, dict[str, float]] | None, str | None]:
    try:
        status, body = await with_timeout(tr.get("/metrics"), timeout)
    except TimeoutError:
        return None, f"/metrics did not answer within {timeout:g} s"
    except ValueError as err:  # an answer the client refuses (malformed, or past MAX_BODY_BYTES)
        return None, f"/metrics: {str(err)[:160]}"
    except Exception as err:  # noqa: BLE001 - any failure means "no counters", recorded with its reason
        return None, f"/metrics unreachable: {type(err).__name__}"
    if status != 200:
        return None, f"/metrics answered HTTP {status}"
    try:
        return prometheus.parse(body.decode("utf-8", "replace")), None
    except ValueError as err:
        return None, f"/metrics is not Prometheus text: {str(err)[:120]}"
