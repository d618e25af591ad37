"""Acceptance length tau (mean tokens per target verification step, bonus included: 1 <= tau <= block size).

Each engine profile names its source (`EngineProfile.acceptance`, one of READERS); within it, in order:
- vLLM, the builtin engine and llama.cpp: /metrics counter deltas over the measured window
  (`prometheus.spec_acceptance`; llama-server's counters carry vLLM's names under `llamacpp:`).
- SGLang: sum(completion_tokens) / sum(spec_verify_ct) over the cell's requests (native /generate
  meta_info), never the server-cumulative `avg_spec_accept_length`.
- vLLM per-request `metrics.speculative_decoding` (v0.29+, --per-request-spec-decode-metrics), which also
  gives the request-weighted mean.

Token-weighted = pooled over verify steps (what the counters give); request-weighted = mean of each
request's own tau. A server without speculative counters gets tau None, never 1.

What tau means is metrics/definitions.py's (TAU_DEFINITION); each profile's `tau_counting` says how its
engine's own counters differ. Where the stream allows (`EngineProfile.client_tau`), `client_tau` computes the
same quantity from the client's side as a check (acceptance_length_client):
- "chunks": each token chunk after the first carries one step's tokens: tokens after the first chunk / chunks
  after it (steps without a draft count too, so it may read a little below the counters);
- "timings": llama.cpp's per-response timings.draft_n_accepted: (output - 1) / (output - 1 - accepted), every
  decode step counted (a final one-token step too).
"""

from __future__ import annotations

from typing import Any, Sequence

from dflash_bench import profiles
from dflash_bench.metrics.definitions import TAU_DEFINITION, acceptance_length, profile_tau
from dflash_bench.metrics.prometheus import spec_acceptance, width_policy
from dflash_bench.store import RequestRecord

# acceptance source -> the /metrics namespace of its counters (None: per-request SGLang meta_info).
READERS: dict[str, str | None] = {"vllm-metrics": "vllm:", "builtin-metrics": "vllm:",
                                  "llamacpp-metrics": "llamacpp:", "sglang-meta": None}


def per_request(records: Sequence[RequestRecord], sglang: bool) -> dict[str, Any] | None:
    """Token- and request-weighted tau from per-request spec fields of successful measured requests."""
    rows = [(r.output_tokens, r.spec_verify_ct, r.spec_accepted_tokens) for r in records
            if not r.warmup and r.ok and r.spec_verify_ct and r.output_tokens]
    if not rows:
        return None
    steps = sum(ct for _, ct, _ in rows)
    accepted = [a for _, _, a in rows if a is not None]
    if sglang:  # completion_tokens / verify_ct (includes the prefill-sampled first token, as SGLang does)
        token_w = sum(n for n, _, _ in rows) / steps
        req_w = sum(n / ct for n, ct, _ in rows) / len(rows)
    elif len(accepted) < len(rows):
        return None
    else:
        token_w = 1.0 + sum(accepted) / steps
        req_w = sum(1.0 + a / ct for (_, ct, _), a in zip(rows, accepted)) / len(rows)
    out: dict[str, Any] = {"token_weighted": token_w, "request_weighted": req_w, "num_drafts": steps}
    if len(accepted) == len(rows):
        out["num_accepted_tokens"] = sum(accepted)
    return out


def client_tau(records: Sequence[RequestRecord], how: str | None) -> float | None:
    """tau from the stream as the client saw it (the module docstring says how), pooled over the cell's
    successful measured requests; None where the stream does not allow it."""
    ok = [r for r in records if not r.warmup and r.ok and r.output_tokens]
    tokens = steps = 0
    if how == "chunks":
        for r in ok:
            if r.chunk_tokens_from == "usage" and len(r.chunk_tokens) >= 2:
                tokens += r.chunk_tokens[-1] - r.chunk_tokens[0]
                steps += len(r.chunk_tokens) - 1
    elif how == "timings":
        for r in ok:
            n = r.output_tokens or 0
            if r.spec_accepted_tokens is not None and n > 1:
                tokens += r.spec_accepted_tokens
                steps += n - 1 - r.spec_accepted_tokens
        return acceptance_length(tokens, steps) if tokens else None
    else:
        return None
    return tokens / steps if steps and tokens > steps else None


def counter_namespace(engine: str) -> str:
    """The /metrics prefix of the engine's speculative counters ("" when it reports them per request)."""
    return READERS[profiles.get(engine).acceptance] or ""


def cell_acceptance(engine: str, metrics_delta: dict[str, float] | None,
                    records: Sequence[RequestRecord], gauges: dict[str, float] | None = None) -> dict[str, Any]:
    """The CellSummary acceptance fields (all None when the server did no speculative decoding); `gauges`: the
    /metrics gauges after the cell (the builtin engine's width policy)."""
    profile = profiles.get(engine)
    source = profile.acceptance
    namespace = READERS[source]
    out: dict[str, Any] = {}
    counters = spec_acceptance(metrics_delta, namespace) if metrics_delta and namespace else None
    sglang = per_request(records, sglang=True) if namespace is None else None
    req = per_request(records, sglang=False) if namespace is not None else None
    if counters:
        out.update(counters)
        out["acceptance_source"] = source
        out["acceptance_length_token_weighted"] = counters["acceptance_length"]
        if req:
            out["acceptance_length_req_weighted"] = req["request_weighted"]
    elif (pr := sglang or req) is not None:
        out["acceptance_length"] = pr["token_weighted"]
        out["acceptance_length_token_weighted"] = pr["token_weighted"]
        out["acceptance_length_req_weighted"] = pr["request_weighted"]
        out["num_drafts"] = pr["num_drafts"]
        out["num_accepted_tokens"] = pr.get("num_accepted_tokens")
        out["acceptance_source"] = "sglang-meta" if sglang else "vllm-per-request"
    if out.get("acceptance_profile"):
        out["acceptance_length_full_block"] = profile_tau(out["acceptance_profile"])
    if out:
        out["acceptance_definition"] = TAU_DEFINITION
        out["width_policy"] = width_policy(gauges or {})
        client = client_tau(records, profile.client_tau)
        if client is not None:
            out["acceptance_length_client"] = client
            out["acceptance_client_source"] = profile.client_tau
    return out
