"""Where a request's time went on the server, by the server's own clock: vLLM's request histograms over a cell's
window, as a mean per finished request in milliseconds. queue: from arrival to the start of its prefill (waiting
for a slot or a batch); prefill: from there to its first token; decode: from its first token to its last. The
builtin engine exports the same names (engine/serving/metrics_endpoint.py), so the two engines' first tokens split
alike: how long a request waited to be scheduled, and how long its prefill took once it was.
"""

from __future__ import annotations

PHASES = ("queue", "prefill", "decode")


def server_phases(delta: dict[str, float] | None) -> dict[str, float | None]:
    """CellSummary's `server_<phase>_ms`: the mean ms per request over the window's finished requests, from /metrics
    counters' `delta`; None where the server exports no such histogram or no request finished in the window."""
    out: dict[str, float | None] = {}
    for phase in PHASES:
        n = (delta or {}).get(f"vllm:request_{phase}_time_seconds_count")
        total = (delta or {}).get(f"vllm:request_{phase}_time_seconds_sum", 0.0)
        out[f"server_{phase}_ms"] = 1e3 * total / n if n else None
    return out
