"""Measure one cell: warm up, scrape /metrics, run the load, scrape again. Nothing is written here.

`measure` returns a `Measurement` (the records and counter snapshots); `client.summary.summarize_cell`
turns it into a CellSummary and `client.summary.write_cell` writes both through the caller's SweepDir.
`client.summary.measure_cell` composes the three for callers that hold only a cell folder (tests, scripts).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Sequence

import orjson

from dflash_bench.client.loadgen import LoadGenerator, LoadSettings, ProgressFn
from dflash_bench.client.protocol import APIS, RequestSettings, chat_renderer
from dflash_bench.client.transport import TRANSPORTS, Transport, make_transport, with_timeout
from dflash_bench.errors import UserError
from dflash_bench.metrics import prometheus
from dflash_bench.store import RequestRecord, now_iso


@dataclass
class Measurement:
    """What one cell's load produced, before any aggregation."""

    url: str
    records: list[RequestRecord]
    settings: dict[str, Any]
    started_at: str
    finished_at: str
    t0: float  # perf_counter origin of the records' times (this host's monotonic clock)
    snaps: dict[str, Any] = field(default_factory=dict)  # /metrics before, after, delta, error
    telemetry: Any = None  # the GPU sampler that covered the measured window, if any


def measure(url: str, prompts: Sequence, **options: Any) -> Measurement:
    return asyncio.run(measure_async(url, prompts, **options))


async def measure_async(url: str, prompts: Sequence, *, concurrency: int, max_tokens: int = 2048,
                        temperature: float = 0.0, api: str = "chat", model: str | None = None,
                        save_token_ids: bool = False, enable_thinking: bool | None = None, warmup: bool = True,
                        request_rate: float | None = None, timeout: float | None = 600.0, seed: int = 0,
                        transport: str = "auto", on_progress: ProgressFn | None = None, telemetry=None,
                        tokenizer: str | None = None, ignore_eos: bool = False) -> Measurement:
    """One cell: warm-up, /metrics before, the measured load (GPU telemetry over it), /metrics after.

    Every request, the /v1/models and /metrics ones included, obeys `timeout` (seconds; None: none).
    With api="generate" (SGLang native), `tokenizer` (a Hugging Face id or folder) renders the model's
    chat template on the client; without it the raw prompt text is sent and the settings say so."""
    _check_options(api, transport, concurrency, prompts)
    settings = {"api": api, "max_tokens": max_tokens, "temperature": temperature, "save_token_ids": save_token_ids,
                "enable_thinking": enable_thinking, "warmup": warmup, "request_rate": request_rate,
                "timeout_s": timeout, "seed": seed, "transport": transport, "num_prompts": len(prompts),
                "ignore_eos": ignore_eos}
    try:
        tr = make_transport(transport, url, concurrency + 2)
    except ValueError as err:  # e.g. the raw transport asked for an https:// URL
        raise UserError(str(err)) from None
    started = now_iso()
    snaps: dict[str, Any] = {"url": url.rstrip("/") + "/metrics"}
    try:
        settings["model"] = model or await served_model(tr, url, api, timeout)
        req = RequestSettings(api=api, model=settings["model"] or "", max_tokens=max_tokens, temperature=temperature,
                              save_token_ids=save_token_ids, enable_thinking=enable_thinking, ignore_eos=ignore_eos,
                              render=_renderer(api, tokenizer, enable_thinking, settings))
        load = LoadSettings(concurrency=concurrency, request_rate=request_rate, warmup=warmup, timeout=timeout, seed=seed)

        async def before() -> None:
            snaps["before"], snaps["error"] = await _scrape(tr, timeout)
            if telemetry is not None:  # GPU samples cover the measured window only
                telemetry.start()

        gen = LoadGenerator(tr, req, load, on_progress, between=before)
        try:
            result = await gen.run(prompts)
        finally:
            if telemetry is not None:
                telemetry.stop()
        snaps["after"], err = await _scrape(tr, timeout)
        snaps["error"] = snaps.get("error") or err
    finally:
        await tr.close()
    if snaps.get("before") and snaps.get("after"):
        snaps["delta"] = prometheus.delta(snaps["before"], snaps["after"])
    return Measurement(url=url, records=result.records, settings=settings, started_at=started, finished_at=now_iso(),
                       t0=result.t0, snaps=snaps, telemetry=telemetry)


def _check_options(api: str, transport: str, concurrency: int, prompts: Sequence) -> None:
    if api not in APIS:
        raise UserError(f"unknown api {api!r}; choose one of {', '.join(APIS)}")
    if transport not in TRANSPORTS:
        raise UserError(f"unknown transport {transport!r}; choose one of {', '.join(TRANSPORTS)}")
    if concurrency < 1:
        raise UserError("concurrency must be at least 1")
    if not prompts:
        raise UserError("no prompts to send")


def _renderer(api: str, tokenizer: str | None, enable_thinking: bool | None, settings: dict[str, Any]):
    if api != "generate":
        return None
    settings["prompt_rendering"] = f"chat template of {tokenizer}" if tokenizer else "raw text (no chat template)"
    if not tokenizer:
        return None
    try:
        return chat_renderer(tokenizer, enable_thinking)
    except ValueError as err:
        raise UserError(str(err)) from None


async def served_model(tr: Transport, url: str, api: str, timeout: float | None) -> str | None:
    """The first served model name from /v1/models; a server that cannot be reached is a UserError."""
    try:
        status, body = await with_timeout(tr.get("/v1/models"), timeout)
    except TimeoutError:
        raise UserError(f"the server at {url} accepted the connection but did not answer GET /v1/models "
                        f"within {timeout:g} s (--timeout); is it ready?") from None
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


async def _scrape(tr: Transport, timeout: float | None) -> tuple[dict | None, str | None]:
    try:
        status, body = await with_timeout(tr.get("/metrics"), timeout)
    except TimeoutError:
        return None, f"/metrics did not answer within {timeout:g} s"
    except Exception as err:  # noqa: BLE001 - any failure means "no counters", recorded with its reason
        return None, f"/metrics unreachable: {type(err).__name__}"
    if status != 200:
        return None, f"/metrics answered HTTP {status}"
    try:
        return prometheus.parse(body.decode("utf-8", "replace")), None
    except ValueError as err:
        return None, f"/metrics is not Prometheus text: {str(err)[:120]}"
