"""How much of a cell's prompts the server read from its prefix cache instead of computing them.

vLLM's automatic prefix caching and SGLang's radix cache are on by default, and llama.cpp keeps each slot's last
prompt (and, unless a sweep launched it, earlier ones in host memory): a prompt sent before (a sweep's cell at 32
re-sends the prompts of its cell at 8, the first N of the suite's order) is prefilled for free, its first token
comes sooner and its cell runs faster than a cold one, on those servers only. The share is read per request where the response says it (OpenAI's
`usage.prompt_tokens_details.cached_tokens`: llama.cpp always, vLLM with --enable-prompt-tokens-details, SGLang
with --enable-cache-report; SGLang's /generate `meta_info.cached_tokens`), else from vLLM's counters over the
measured window.
"""

from __future__ import annotations

from typing import Any, Sequence

from dflash_bench.store import RequestRecord

HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"


def prefix_cache(records: Sequence[RequestRecord], delta: dict[str, float] | None) -> dict[str, Any]:
    """`prefix_cache_hit_rate` (cached prompt tokens / prompt tokens, over the measured requests that succeeded)
    and where it was read (`prefix_cache_source`); both None when no request and no counter says."""
    said = [r for r in records if r.ok and not r.warmup and r.cached_prompt_tokens is not None and r.prompt_tokens]
    if said:
        rate = sum(r.cached_prompt_tokens or 0 for r in said) / sum(r.prompt_tokens or 0 for r in said)
        return {"prefix_cache_hit_rate": rate, "prefix_cache_source": "usage"}
    queries = (delta or {}).get(QUERIES)
    if queries:
        return {"prefix_cache_hit_rate": (delta or {}).get(HITS, 0.0) / queries, "prefix_cache_source": "vllm-metrics"}
    return {"prefix_cache_hit_rate": None, "prefix_cache_source": None}
