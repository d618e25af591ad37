"""Prometheus `/metrics` snapshots (parsed with prometheus_client's text parser) and their deltas.

A snapshot keeps counters (`*_total`) and histogram/summary sums and counts, summed over label sets
(vLLM with data parallelism exposes one set per engine), except labels that carry meaning for us:
`position` (per-position acceptance), `width` (the builtin engine's widths) and `policy` (its width policy)
stay in the key, as `name{position="i"}`. Gauges are kept apart
(they are not differenced). `_created` series and histogram buckets are dropped.
"""

from __future__ import annotations

import math
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from dflash_bench.metrics.definitions import acceptance_length

KEEP_LABELS = ("position", "width", "policy")


def parse(text: str) -> dict[str, dict[str, float]]:
    """{'counters': {key: value}, 'gauges': {key: value}} from Prometheus text exposition format.

    Raises ValueError on text that is not in that format."""
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            if name.endswith("_created") or name.endswith("_bucket") or not math.isfinite(s.value):
                continue  # a NaN gauge (SGLang's idle fwd_occupancy) says nothing, and JSON cannot hold it
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
# the builtin engine's own: drafts that verified positions 0..i (with PER_POS, the width-free acceptance profile),
# row-steps per verify width, and how the width is chosen (a gauge whose `policy` label says it)
VERIFIED_PER_POS = "dflash_bench:spec_decode_num_verified_per_pos"
WIDTHS = "dflash_bench:verify_width_row_steps"
WIDTH_POLICY = "dflash_bench:verify_width_policy"


def labelled(d: dict[str, float], name: str, label: str) -> dict[int, float]:
    """The values of `name{label="i"}` keys of a snapshot's counters or deltas, by integer label."""
    prefix = f'{name}{{{label}="'
    return {int(k[len(prefix):].split('"', 1)[0]): v for k, v in d.items() if k.startswith(prefix)}


def width_policy(gauges: dict[str, float]) -> str | None:
    """The builtin engine's width policy from a snapshot's gauges (None: the server does not say)."""
    prefix = WIDTH_POLICY + '{policy="'
    return next((k[len(prefix):].split('"', 1)[0] for k, v in gauges.items() if k.startswith(prefix) and v), None)


def profile(d: dict[str, float], namespace: str) -> list[tuple[int, int]] | None:
    """The acceptance profile over the window: per draft position i, (drafts that verified positions 0..i, drafts
    that accepted positions 0..i). The builtin engine counts the first; an engine that verifies every position of
    every draft (vLLM's num_draft_tokens = num_drafts x positions) gets num_drafts at each. None otherwise."""
    accepted = labelled(d, namespace + PER_POS, "position")
    drafts, draft_tokens = d.get(namespace + DRAFTS), d.get(namespace + DRAFT_TOKENS)
    if not accepted or not drafts:
        return None
    positions = range(max(accepted) + 1)
    verified = labelled(d, VERIFIED_PER_POS + "_total", "position")
    if verified:
        return [(int(verified.get(i, 0)), int(accepted.get(i, 0))) for i in positions]
    if draft_tokens == drafts * len(positions):
        return [(int(drafts), int(accepted.get(i, 0))) for i in positions]
    return None


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
    pos = labelled(d, namespace + PER_POS, "position")
    widths = {w: int(n) for w, n in sorted(labelled(d, WIDTHS + "_total", "width").items()) if n > 0}
    per_pos = [pos[i] / drafts for i in sorted(pos)] if pos else None
    return {"acceptance_length": acceptance_length(acc, drafts), "acceptance_rate": acc / draft_tokens if draft_tokens else None,
            "acceptance_per_position": per_pos, "num_drafts": int(drafts),
            "verify_width": 1.0 + draft_tokens / drafts if draft_tokens is not None else None,
            "num_draft_tokens": None if draft_tokens is None else int(draft_tokens), "num_accepted_tokens": int(acc),
            "acceptance_profile": profile(d, namespace), "verify_widths": widths or None}
