"""Two cells measured together, request by request (`sweep --interleave`): at concurrency 1, each prompt is sent
to one server and then to the other, the order swapped every prompt (A B, B A, A B, ...), so that a change of the
machine's speed lasting a second or more lands on both cells alike. A small or shared machine's speed moves
within seconds; two cells measured one after the other then differ by that move even when nothing else does,
while their requests interleaved see the same moments.

Each cell keeps its own records, its own /metrics deltas (each server serves only its own requests) and its own
settings, marked `interleaved`; metrics/definitions.py then measures its throughput over the time its own
requests were in flight, not over the window the two shared. No GPU telemetry: the window is shared, so energy
cannot be told apart. Nothing is written here.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

from dflash_bench.client.cell import (Measurement, cell_settings, check_options, check_steady, renderer_for,
                                      scrape_metrics, served_model)
from dflash_bench.client.loadgen import LoadGenerator, LoadSettings, ProgressFn
from dflash_bench.client.transport import Transport, make_transport
from dflash_bench.errors import UserError
from dflash_bench.metrics import prometheus
from dflash_bench.store import ServerMetrics, now_iso

if TYPE_CHECKING:
    from dflash_bench.client.protocol import RequestSettings
    from dflash_bench.suites import Prompt


def check_interleave(load: LoadSettings) -> None:
    """Interleaving alternates single requests: the load must be one request at a time, sent once."""
    if load.concurrency != 1:
        raise UserError(f"--interleave alternates single requests, so it measures concurrency 1 only, not "
                        f"{load.concurrency}")
    if load.request_rate or load.steady_requests or load.min_seconds:
        raise UserError("--interleave sends each prompt once to each server in turn; it cannot be combined with "
                        "--request-rate, --steady-requests or --min-cell-seconds")


def measure_pair(urls: tuple[str, str], prompts: Sequence[Prompt], requests: tuple[RequestSettings, RequestSettings],
                 load: LoadSettings, on_progress: ProgressFn | None = None) -> tuple[Measurement, Measurement]:
    """`measure_pair_async` run to its end on a fresh event loop."""
    return asyncio.run(measure_pair_async(urls, prompts, requests, load, on_progress))


async def measure_pair_async(urls: tuple[str, str], prompts: Sequence[Prompt],
                             requests: tuple[RequestSettings, RequestSettings], load: LoadSettings,
                             on_progress: ProgressFn | None = None) -> tuple[Measurement, Measurement]:
    """Both cells: each server warmed up, both /metrics scraped, the prompts sent A B, B A, ..., both scraped
    again. `on_progress` counts the requests of both cells."""
    for request in requests:
        check_options(request.api, load.transport, load.concurrency, prompts)
    check_steady(load)
    check_interleave(load)
    trs: list[Transport] = []
    try:
        for url in urls:
            trs.append(make_transport(load.transport, url, 3))
    except ValueError as err:
        for tr in trs:
            await tr.close()
        raise UserError(str(err)) from None
    started = now_iso()
    snaps = [ServerMetrics(url=url.rstrip("/") + "/metrics") for url in urls]
    total = 2 * sum(len(p.turns) for p in prompts)
    done = [0]  # measured requests of both cells, for on_progress

    def progress(gen_done: int, _total: int, _tokens: int, elapsed: float) -> None:
        done[0] += 1
        if on_progress is not None:
            on_progress(done[0], total, sum(g.output_tokens for g in gens), elapsed)

    try:
        gens: list[LoadGenerator] = []
        models = []
        for tr, url, request in zip(trs, urls, requests):
            model = request.model or await served_model(tr, url, request.api, load.timeout)
            models.append(model)
            req = replace(request, model=model or "", render=request.render or renderer_for(request))
            gens.append(LoadGenerator(tr, req, load, progress))
        for gen in gens:
            await gen.warm_up(prompts)
        for tr, snap in zip(trs, snaps):
            snap.before, snap.error = await scrape_metrics(tr, load.timeout)
        for gen in gens:
            gen.open_window(total)
        for i, p in enumerate(prompts):
            for gen in (gens if i % 2 == 0 else gens[::-1]):
                await gen.conversation(p.id, p.turns)
        for tr, snap in zip(trs, snaps):
            snap.after, late = await scrape_metrics(tr, load.timeout)
            snap.error = snap.error or late
    finally:
        for tr in trs:
            await tr.close()
    finished = now_iso()
    out = []
    for url, request, load_gen, snap, model in zip(urls, requests, gens, snaps, models):
        if snap.before and snap.after:
            snap.delta = prometheus.delta(snap.before, snap.after)
        settings = cell_settings(request, load, model, len(prompts))
        settings.prompt_passes, settings.interleaved = 1, True
        out.append(Measurement(url=url, records=load_gen.records, settings=settings, started_at=started,
                               finished_at=finished, t0=load_gen.t0, snaps=snap))
    return out[0], out[1]
