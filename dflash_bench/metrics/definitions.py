"""The metric definitions of ARCHITECTURE.md, written once. Everything else calls these.

Over a cell's measured requests (warm-up excluded):

- output throughput = sum of output tokens of successful requests / (last completion - first dispatch).
  Output tokens come from the server's usage, never from counting chunks.
- request throughput = successful requests / the same window.
- an interleaved cell (--interleave: at concurrency 1 its requests alternate with its pair's, client/interleave.py)
  is measured over the time its own requests were in flight, the union of their send-to-end intervals, since
  its pair's requests ran in the gaps; output and request throughput divide by that instead.
- a steady stream (--steady-requests N, --steady-ramp R; client/loadgen.py keeps the concurrency constant, each
  finished request replaced at once) is measured over a window instead: it opens at the R-th completion and
  closes at the (R+N)-th (completions ordered by end time, failed ones included; R=0: at the first dispatch).
  Output throughput = output tokens of successful requests streamed inside the window / its length: a request
  that straddles an edge counts only its tokens whose chunks arrived inside (from its cumulative per-chunk
  counts; the final usage total counts at the stream's end). Request throughput and every latency figure
  are over the requests that ended inside the window (R < rank <= R+N); the ramp-up and the tail (requests
  ending after the window closed, sent before it did) are in no statistic. The server's counters (tau) and
  the GPU energy cover the whole stream; energy per token divides by the whole stream's tokens.
- TTFT = first content chunk - request written (after any TCP connect, which is its own figure: with
  --no-warmup the first request of each connection would otherwise count it). ttft_ms_later_turns: the same over
  a multi-turn suite's second and later turns only, whose prompts hold the conversation so far.
- connect_ms = a new connection's TCP handshake, SYN to SYN-ACK, as the kernel timed it (raw transport on
  Linux); connect_wait_ms = the rest of its wait for the connection, the client's event loop handing the
  socket over (at high concurrency, opening the other connections). Every measured request says whether
  its connection was "new" or "reused" (connections_reused counts the latter). The measured window opens at
  least one connection of its own (`Transport.fresh_connection`), so every cell times a handshake, or its
  `not_measured` says why not.
- TPOT = (E2E - TTFT) / (output tokens - 1), per request with more than one output token.
- tok/s/user = 1000 / TPOT (ms), per request, then percentiles.
- per-token latency (itl_ms) = each chunk gap divided over the tokens that chunk carries (from cumulative
  usage), one sample per token; chunk gaps are kept as their own metric (a verify step under SD).
  A server that sends no per-chunk usage gets its tokens spread over the chunks by the characters each
  carried (the final usage total is exact), as vLLM's bench serve and guidellm do; `not_measured` says so.
- tokens per chunk = tokens carried by each chunk after the first token chunk.
- E2E = stream end - request sent.
- acceptance length tau (TAU_DEFINITION) = tokens committed to the output per target verify step, counting
  nothing past the request's end: a verify step is a target forward that checked at least one draft position
  the request still had room for; it commits its accepted drafts plus the bonus token, cut at EOS, a stop
  or max_tokens. tau = 1 + accepted / verify steps (`acceptance_length`). A forward with no such draft
  position (an AR step, the anchor alone, a last step with room for one token) is no verify step. Each
  engine's profile says how its own counters differ from this (`EngineProfile.tau_counting`), and docs/
  acceptance.md how each is read; a client-side check (`metrics/acceptance.py` `client_tau`) computes the
  same quantity from the stream where the stream carries one verify step per chunk or says its drafts.
- the acceptance profile = per draft position i (0-based), the verify steps that checked positions 0..i and
  those that accepted positions 0..i. It does not depend on how many positions each step checked, so tau at
  any width w follows from it: tau(w) = 1 + sum over i < w - 1 of accepted_i / verified_i (`profile_tau`); at
  the full block it is what a cell's tau would have been had every step verified the whole block.
- speedup = per repeat, the DFlash cell's output throughput / its AR partner's, then the median over the cell's
  repeats: dflash_bench/speedup.py holds it, below every package that shows one.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any, Sequence

from dflash_bench.metrics.stats import describe, describe_weighted
from dflash_bench.store import RequestRecord


# The version of the tau definition above that a cell's tau follows (CellSummary.acceptance_definition). 2: drafts
# past the request's end count for nothing; before (absent), the builtin engine counted a last step's whole block.
TAU_DEFINITION = 2


def acceptance_length(accepted: float, verify_steps: float) -> float | None:
    """tau = 1 + accepted drafts / verify steps (None without a verify step: absent, never 1)."""
    return 1.0 + accepted / verify_steps if verify_steps and verify_steps > 0 else None


def profile_tau(profile: Sequence[Sequence[int]], positions: int | None = None) -> float | None:
    """tau from an acceptance profile over its first `positions` draft positions (all: the full block); None
    when one of them was never verified (nothing says how often it would be accepted)."""
    rows = list(profile)[: len(profile) if positions is None else positions]
    if not rows or any(v <= 0 for v, _ in rows):
        return None
    return 1.0 + sum(a / v for v, a in rows)


def ttft_ms(r: RequestRecord) -> float | None:
    start = r.t_write if r.t_write is not None else r.t_send
    return None if r.t_first_token is None else (r.t_first_token - start) * 1000.0


def e2e_ms(r: RequestRecord) -> float | None:
    return None if r.t_end is None else (r.t_end - r.t_send) * 1000.0


def tpot_ms(r: RequestRecord) -> float | None:
    if r.t_first_token is None or r.t_end is None or not r.output_tokens or r.output_tokens < 2:
        return None
    return (r.t_end - r.t_first_token) * 1000.0 / (r.output_tokens - 1)


def chunk_gaps(r: RequestRecord) -> list[tuple[float, int]]:
    """(gap ms, tokens carried) for each token chunk after the first; empty without per-chunk counts."""
    t, c = r.chunk_times, r.chunk_tokens
    if len(t) != len(c) or len(t) < 2:
        return []
    return [((t[i] - t[i - 1]) * 1000.0, c[i] - c[i - 1]) for i in range(1, len(t))]


def steady_window(records: Sequence[RequestRecord], ramp: int, count: int) -> tuple[float, float] | None:
    """(t_open, t_close) of a steady stream's window: the ramp-th and (ramp+count)-th measured completions by end
    time (t_open the first dispatch when ramp is 0); None when fewer requests than that ended."""
    measured = [r for r in records if not r.warmup]
    ends = sorted(r.t_end for r in measured if r.t_end is not None)
    if count < 1 or len(ends) < ramp + count:
        return None
    t_open = ends[ramp - 1] if ramp > 0 else min(r.t_send for r in measured)
    return t_open, ends[ramp + count - 1]


def tokens_between(r: RequestRecord, a: float, b: float) -> int:
    """Output tokens of `r` that streamed in (a, b]: from its cumulative per-chunk counts, and its usage total
    at its end (without per-chunk counts, all of them at its end)."""
    times, cum = list(r.chunk_times), list(r.chunk_tokens)
    if len(times) != len(cum):
        times, cum = [], []
    if r.t_end is not None and r.output_tokens is not None:
        times.append(max(r.t_end, times[-1]) if times else r.t_end)
        cum.append(max(r.output_tokens, cum[-1]) if cum else r.output_tokens)

    def upto(t: float) -> int:
        i = bisect_right(times, t)
        return cum[i - 1] if i else 0

    return upto(b) - upto(a)


def in_window(r: RequestRecord, window: tuple[float, float]) -> bool:
    """Whether `r` ended inside the window (its statistics count): t_open < t_end <= t_close."""
    return r.t_end is not None and window[0] < r.t_end <= window[1]


def busy_seconds(records: Sequence[RequestRecord]) -> float | None:
    """The length of the union of the records' [t_send, t_end] intervals: the time at least one was in flight."""
    spans = sorted((r.t_send, r.t_end) for r in records if r.t_end is not None)
    if not spans:
        return None
    total, (lo, hi) = 0.0, spans[0]
    for a, b in spans[1:]:
        if a > hi:
            total, lo = total + hi - lo, a
        hi = max(hi, b)
    return total + hi - lo


def summarize(records: Sequence[RequestRecord], window: tuple[float, float] | None = None,
              interleaved: bool = False) -> dict[str, Any]:
    """The CellSummary fields that depend only on the request records (acceptance is separate); with a steady
    stream's `window` (steady_window), over that window, and `interleaved`, over its requests' own time, as the
    module's docstring defines."""
    everything = [r for r in records if not r.warmup]
    measured = everything if window is None else [r for r in everything if in_window(r, window)]
    ok = [r for r in measured if r.ok]
    out: dict[str, Any] = {"num_requests": len(measured), "num_ok": len(ok), "num_failed": len(measured) - len(ok),
                           "num_warmup": len(records) - len(everything)}
    if window is not None:
        duration: float | None = window[1] - window[0]
        out_tokens = sum(tokens_between(r, *window) for r in everything if r.ok)
    elif measured and interleaved:
        duration, out_tokens = busy_seconds(measured), sum(r.output_tokens or 0 for r in ok)
    elif measured:
        first = min(r.t_send for r in measured)
        last = max((r.t_end for r in measured if r.t_end is not None), default=None)
        duration = None if last is None else last - first
        out_tokens = sum(r.output_tokens or 0 for r in ok)
    else:
        duration, out_tokens = None, 0
    out["duration_s"] = duration
    out["total_output_tokens"] = out_tokens
    out["total_prompt_tokens"] = sum(r.prompt_tokens or 0 for r in ok)
    if duration and duration > 0:
        out["output_throughput"] = out_tokens / duration
        out["request_throughput"] = len(ok) / duration
    tpots = [tpot_ms(r) for r in ok]
    gaps = [g for r in ok for g in chunk_gaps(r)]
    out["ttft_ms"] = describe([ttft_ms(r) for r in ok])
    out["ttft_ms_later_turns"] = describe([ttft_ms(r) for r in ok if r.turn > 0])
    out["tpot_ms"] = describe(tpots)
    out["e2e_ms"] = describe([e2e_ms(r) for r in ok])
    out["tok_s_user"] = describe([1000.0 / t for t in tpots if t])
    out["itl_ms"] = describe_weighted([(g / k, k) for g, k in gaps if k > 0])
    out["chunk_gap_ms"] = describe([g for g, _ in gaps])
    out["tokens_per_chunk"] = describe([k for _, k in gaps])
    out["connect_ms"] = describe([r.connect_ms for r in measured if r.connect_ms is not None])
    out["connect_wait_ms"] = describe([r.connect_wait_ms for r in measured if r.connect_wait_ms is not None])
    out["connections_reused"] = sum(r.connection == "reused" for r in measured)
    return out


CHUNK_METRICS = ("itl_ms", "chunk_gap_ms", "tokens_per_chunk")


def not_measured(records: Sequence[RequestRecord]) -> dict[str, str]:
    """The per-chunk figures that are missing or estimated, each with why (shown in tables and the report)."""
    ok = [r for r in records if not r.warmup and r.ok]
    if not ok:
        return {}
    out = _connect_not_measured(ok)
    if not any(chunk_gaps(r) for r in ok):
        if all(len(r.chunk_times) < 2 for r in ok):
            why = "every response came in one content chunk: there is no gap between chunks to measure"
        else:
            why = "the server sent no token counts per chunk and the chunks carried no text to spread them by"
        return {**out, **{m: why for m in CHUNK_METRICS}}
    estimated = sum(r.chunk_tokens_from == "text" for r in ok)
    if estimated:
        why = (f"derived for {estimated} of {len(ok)} requests: the server sent no per-chunk usage, so each "
               "response's token total is spread over its chunks (one per chunk where the counts match, else by "
               "the characters each carried)")
        out.update({"itl_ms": why, "tokens_per_chunk": why})
    return out


def _connect_not_measured(ok: Sequence[RequestRecord]) -> dict[str, str]:
    """Why no measured request has a connect_ms, where none has."""
    if any(r.connect_ms is not None for r in ok):
        return {}
    new = sum(r.connection == "new" for r in ok)
    if new:
        why = (f"{new} measured request(s) opened a new connection, but its TCP handshake was not timed: only the "
               "raw transport on Linux reads it from the kernel (connect_wait_ms holds the whole wait)")
    else:
        why = "every measured request reused a connection opened before the measured window"
    return {"connect_ms": why}


def failure_reasons(records: Sequence[RequestRecord]) -> dict[str, int]:
    """Count of measured failures by reason (the text before the first colon)."""
    counts: dict[str, int] = {}
    for r in records:
        if not r.warmup and r.error:
            key = r.error.split(":", 1)[0]
            counts[key] = counts.get(key, 0) + 1
    return counts
