"""Prometheus `/metrics` snapshots (parsed with prometheus_client's text parser) and their deltas.

A snapshot keeps counters (`*_total`) and histogram/summary sums and counts, summed over label sets
(vLLM with data parallelism exposes one set per engine), except labels that carry meaning for us:
`position` (per-position acceptance) stays in the key as `name{position="i"}`. Gauges are kept apart
(they are not differenced). `_created` series and histogram buckets are dropped.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from dflash_bench.metrics.definitions import acceptance_length

KEEP_LABELS = ("position",)


def parse(text: str) -> dict[str, dict[str, float]]:
    """{'counters': {key: value}, 'gauges': {key: value}} from Prometheus text exposition format.

    Raises ValueError on text that is not in that format."""
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            if name.endswith("_created") or name.endswith("_bucket"):
                continue
            kept = ",".join(f'{k}="{s.labels[k]}"' for k in KEEP_LABELS if k in s.labels)
            key = f"{name}{{{kept}}}" if kept else name
            if fam.type == "gauge":
                gauges[key] = gauges.get(key, 0.0) + s.value
            elif name.endswith(("_total", "_sum", "_count")):
                counters[key] = counters.get(key, 0.0) + s.value
    return {"counters": counters, "gauges": gauges}


def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """after - before for every counter in `after` (a counter absent before counts from zero)."""
    b, a = before.get("counters", {}), after.get("counters", {})
    return {k: v - b.get(k, 0.0) for k, v in a.items()}


# vLLM's spec-decode counter names; llama-server exports the same names under its own `llamacpp:` namespace
# (tools/server/server-task.cpp, to_metrics), so one reader serves both.
DRAFTS = "spec_decode_num_drafts_total"
DRAFT_TOKENS = "spec_decode_num_draft_tokens_total"
ACCEPTED = "spec_decode_num_accepted_tokens_total"
PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"


def vllm_acceptance(d: dict[str, float]) -> dict[str, Any] | None:
    return spec_acceptance(d, "vllm:")


def spec_acceptance(d: dict[str, float], namespace: str) -> dict[str, Any] | None:
    """tau = 1 + d(accepted)/d(drafts), rate = d(accepted)/d(draft tokens), per-position d(pos_i)/d(drafts),
    verify width = 1 + d(draft tokens)/d(drafts) (tokens verified per row and step: the block size, unless the
    engine verifies fewer drafts under load as the builtin fast path does),
    from the counters named `<namespace>spec_decode_*` (vLLM: "vllm:", llama.cpp: "llamacpp:").

    None when the server has no speculative counters or ran no verify step in the window (tau absent, not 1)."""
    drafts = d.get(namespace + DRAFTS)
    if not drafts or drafts <= 0 or namespace + ACCEPTED not in d:
        return None
    acc = d[namespace + ACCEPTED]
    draft_tokens = d.get(namespace + DRAFT_TOKENS)
    pos: dict[int, float] = {}
    prefix = namespace + PER_POS + '{position="'
    for k, v in d.items():
        if k.startswith(prefix):
            pos[int(k[len(prefix):].split('"', 1)[0])] = v
    per_pos = [pos[i] / drafts for i in sorted(pos)] if pos else None
    return {"acceptance_length": acceptance_length(acc, drafts), "acceptance_rate": acc / draft_tokens if draft_tokens else None,
            "acceptance_per_position": per_pos, "num_drafts": int(drafts),
            "verify_width": 1.0 + draft_tokens / drafts if draft_tokens is not None else None,
            "num_draft_tokens": None if draft_tokens is None else int(draft_tokens), "num_accepted_tokens": int(acc)}
