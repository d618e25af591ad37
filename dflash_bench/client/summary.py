"""Summarise a measured cell (records and counters -> CellSummary) and write it through the SweepDir.

Kept apart from measuring so that the caller decides the verdict: a sweep whose server died mid-cell
still summarises what was measured, with the cell marked failed and the reason from the server's log.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from dflash_bench.client.cell import Measurement, measure
from dflash_bench.client.loadgen import LoadSettings, ProgressFn
from dflash_bench.client.protocol import RequestSettings
from dflash_bench.metrics.acceptance import cell_acceptance, counter_namespace
from dflash_bench.metrics.cache import prefix_cache
from dflash_bench.metrics.definitions import failure_reasons, not_measured, steady_window, summarize
from dflash_bench.metrics.phases import server_phases
from dflash_bench.metrics.prometheus import ACCEPTED, DRAFTS
from dflash_bench.store import (
    TELEMETRY, CellSummary, RequestRecord, ServerMetrics, SteadyPlan, SteadyWindow, SweepDir,
)
from dflash_bench.store.cells import History

if TYPE_CHECKING:
    from dflash_bench.suites import Prompt
    from dflash_bench.telemetry import TelemetrySampler

SYNTHETIC_GAUGE = "dflash_bench:synthetic_acceptance"  # the builtin engine's benchmarking-only label
TAU_FALLBACK = 1.05  # a DFlash cell whose tau is below this accepted (almost) no drafted token


def summarize_cell(m: Measurement, *, cell_id: str, engine: str, mode: str, suite: str, concurrency: int,
                   repeat: int = 0, failure: str | None = None, input_len: int | None = None,
                   thinking_asked: bool | None = None) -> CellSummary:
    """The cell's summary from what was measured; `failure` (e.g. the server died) fails it regardless."""
    snaps = m.snaps
    summary = summarize_records(m.records, cell_id=cell_id, engine=engine, mode=mode, suite=suite,
                                concurrency=concurrency, repeat=repeat, delta=snaps.delta, failure=failure,
                                input_len=input_len, thinking_asked=thinking_asked, steady=m.settings.steady,
                                interleaved=bool(m.settings.interleaved), gauges=(snaps.after or {}).get("gauges"))
    summary.url, summary.started_at, summary.finished_at = m.url, m.started_at, m.finished_at
    summary.settings = m.settings.model_copy()
    if m.telemetry is not None:  # energy covers the whole stream (a steady stream's ramp and tail too)
        tokens = summary.steady.stream_output_tokens if summary.steady else summary.total_output_tokens
        energy = m.telemetry.summarize(tokens)
        for key, value in (energy.summary_fields() | energy.extra_fields()).items():
            setattr(summary, key, value)
    summary.synthetic_acceptance = (snaps.after or {}).get("gauges", {}).get(SYNTHETIC_GAUGE)
    # the records' time origin on this host's monotonic clock (time.perf_counter), to line them up with
    # server-side logs or other samples taken on the same host
    summary.clock_origin_monotonic_s = m.t0
    summary.server_metrics_error = snaps.error or None
    if (why := no_room_for_verify(summary)) is not None:
        summary.not_measured["acceptance_length"] = why
    summary.dflash_warning = dflash_warning(summary, snaps)
    return summary


def summarize_records(records: list[RequestRecord], *, cell_id: str, engine: str, mode: str, suite: str,
                      concurrency: int, repeat: int = 0, delta: dict[str, float] | None = None,
                      failure: str | None = None, input_len: int | None = None,
                      thinking_asked: bool | None = None, steady: SteadyPlan | None = None,
                      interleaved: bool = False, gauges: dict[str, float] | None = None) -> CellSummary:
    """Counts, latencies and acceptance of `records`; failed when `failure` is given or nothing succeeded.
    `steady`: a steady stream, measured over its window (steady_window_of); `interleaved`: its requests alternated
    with its pair's (client/interleave.py), measured over their own time; `gauges`: /metrics gauges after it."""
    window, block = steady_window_of(records, steady) if steady else (None, None)
    summary = CellSummary(cell_id=cell_id, engine=engine, mode=mode, suite=suite, concurrency=concurrency,
                          repeat=repeat, input_len=input_len, thinking_asked=thinking_asked,
                          **summarize(records, window, interleaved), steady=block,
                          **cell_acceptance(engine, delta, records, gauges), **prefix_cache(records, delta),
                          **server_phases(delta))
    if steady and window is None and failure is None:
        failure = (f"the steady stream ended before its window closed: {block.ramp + block.requests if block else 0}"
                   " completions were needed")
    summary.not_measured = not_measured(records)
    reasons = failure_reasons(records)
    summary.failures = reasons
    if failure is None and summary.num_ok == 0:
        failure = "every measured request failed: " + (", ".join(f"{k} ({v})" for k, v in reasons.items())
                                                       or "no measured request was sent")
    if failure is not None:
        summary.status, summary.failure_reason = "failed", " ".join(failure.split())[:2000]
    elif summary.num_failed:
        summary.status, summary.failure_reason = "partial", partial_reason(summary)
    return summary


def partial_reason(s: CellSummary) -> str:
    """A partial cell in one sentence: how many measured requests failed, why, and what its figures cover."""
    why = ", ".join(f"{k} ({v})" for k, v in s.failures.items()) or "no reason recorded"
    return (f"{s.num_failed} of {s.num_requests} measured requests failed: {why}; throughput and latencies cover "
            f"the {s.num_ok} that succeeded")


def steady_window_of(records: list[RequestRecord], steady: SteadyPlan
                     ) -> tuple[tuple[float, float] | None, SteadyWindow]:
    """A steady stream's window (metrics/definitions.py steady_window) and what the summary keeps of it."""
    ramp, count = steady.ramp, steady.requests
    measured = [r for r in records if not r.warmup]
    block = SteadyWindow(ramp=ramp, requests=count,
                         stream_output_tokens=sum(r.output_tokens or 0 for r in measured if r.ok))
    window = steady_window(records, ramp, count)
    if window is None:
        return None, block
    t_open, t_close = window
    ends = [(r.t_send, r.t_end) for r in measured if r.t_end is not None]
    block.t_open, block.t_close = t_open, t_close
    block.ramp_requests = sum(e <= t_open for _, e in ends)
    block.cooldown_requests = sum(e > t_close for _, e in ends)
    block.straddling_open = sum(s < t_open < e <= t_close for s, e in ends)
    block.straddling_close = sum(s <= t_close < e for s, e in ends)
    return window, block


def no_room_for_verify(s: CellSummary) -> str | None:
    """Why no request of a DFlash cell had room for a verify step (metrics/definitions.py tau), or None when one had:
    the first token comes from the prefill, so a verify step needs max_tokens of at least 3 (the anchor's step
    commits a draft and the bonus token) and a request that did not end at its first token."""
    if s.mode != "dflash" or s.num_ok == 0:
        return None
    max_tokens = s.settings.max_tokens
    if max_tokens is not None and max_tokens < 3:
        return (f"max_tokens {max_tokens} leaves no room for a verify step (the first token comes from the prefill, "
                "and a verify step commits at least a draft and the bonus token): no tau")
    if s.total_output_tokens <= s.num_ok:
        return "every request ended at its first token (from the prefill): no verify step, no tau"
    return None


def dflash_warning(s: CellSummary, snaps: ServerMetrics) -> str | None:
    """Why a DFlash cell looks like plain AR decoding (the silent fallback users report), or None (also where no
    request had room for a verify step: nothing could have speculated)."""
    if s.mode != "dflash" or s.num_ok == 0 or no_room_for_verify(s):
        return None
    drafts = f"{counter_namespace(s.engine)}{DRAFTS}"
    if s.acceptance_length is None:
        delta = snaps.delta or {}
        if drafts in delta and not delta[drafts]:
            return (f"no speculation: the server's draft counters did not move over the cell ({drafts} "
                    "+0); it decoded without its drafter (a silent fallback to AR?)")
        why = snaps.error or "/metrics carries no speculative-decoding counters"
        return (f"no acceptance source: {why}, and no response carried per-request speculative fields; "
                "nothing shows that this server speculated (a silent fallback to AR?)")
    if s.acceptance_length < TAU_FALLBACK:
        accepted = s.num_accepted_tokens if s.num_accepted_tokens is not None else (snaps.delta or {}).get(
            f"{counter_namespace(s.engine)}{ACCEPTED}")
        return (f"tau {s.acceptance_length:.2f}: the drafter's tokens were (almost) never accepted "
                f"({accepted} accepted over {s.num_drafts} drafts); this is AR decoding with extra work")
    return None


def write_cell(sweep: SweepDir, summary: CellSummary, m: Measurement | None) -> None:
    """requests.jsonl, server_metrics.json, telemetry.csv, then summary.json last (it marks the cell done)."""
    cid = summary.cell_id
    if m is not None:
        sweep.write_requests(cid, m.records)
        sweep.write_server_metrics(cid, m.snaps)
        if m.telemetry is not None:
            m.telemetry.write_csv(sweep.cell_dir(cid) / TELEMETRY)
    sweep.write_summary(summary)


def measure_cell(url: str, prompts: Sequence[Prompt], *, cell_dir: Path, concurrency: int, engine: str = "vllm",
                 mode: str = "ar", suite: str | None = None, repeat: int = 0, api: str = "chat", model: str = "",
                 max_tokens: int = 2048, temperature: float = 0.0, save_token_ids: bool = False,
                 enable_thinking: bool | None = None, ignore_eos: bool = False, tokenizer: str | None = None,
                 warmup: bool = True, request_rate: float | None = None, timeout: float | None = 600.0,
                 seed: int = 0, transport: str = "auto", on_progress: ProgressFn | None = None,
                 telemetry: TelemetrySampler | None = None, steady_requests: int | None = None,
                 steady_ramp: int | None = None, history: History = "answers") -> CellSummary:
    """Measure, summarise and write one cell into `cell_dir` (a `<sweep>/cells/<cell-id>` folder).

    The options are RequestSettings' and LoadSettings' fields. Raises UserError when the server cannot be
    reached at all; request failures during the cell are recorded (with their reasons) and counted instead."""
    cell_dir = Path(cell_dir)
    request = RequestSettings(api=api, model=model, max_tokens=max_tokens, temperature=temperature,
                              save_token_ids=save_token_ids, enable_thinking=enable_thinking, ignore_eos=ignore_eos,
                              tokenizer=tokenizer)
    load = LoadSettings(concurrency=concurrency, request_rate=request_rate, warmup=warmup, timeout=timeout, seed=seed,
                        transport=transport, steady_requests=steady_requests, steady_ramp=steady_ramp, history=history)
    m = measure(url, prompts, request, load, telemetry, on_progress)
    summary = summarize_cell(m, cell_id=cell_dir.name, engine=engine, mode=mode,
                             suite=suite or prompts[0].suite, concurrency=concurrency, repeat=repeat)
    write_cell(SweepDir(cell_dir.parent.parent), summary, m)
    return summary
