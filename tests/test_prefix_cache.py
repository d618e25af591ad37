"""A cell's prompt tokens read from the server's prefix cache (`metrics/cache.py`), measured against the emulator's
vLLM-style prefix cache, which logs what each request found: through the usage a response carries, and without
it through vLLM's counters; read from SGLang's meta_info; and said in the report."""

from __future__ import annotations

import httpx
import pytest

from dflash_bench.client import measure_cell
from dflash_bench.client.protocol import Stream
from dflash_bench.emulator import EmulatorProcess
from dflash_bench.metrics.cache import prefix_cache
from dflash_bench.store import RequestRecord
from benchmarks.fixtures.emulator_truth import P

BODY = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. " * 3


def cell_prompts(n: int) -> list[P]:
    """Prompts of a few 16-token blocks each (the emulator counts 4 bytes a token), none sharing a first block."""
    return [P(f"synthetic/c{i}", [f"Question {i:03d}. {BODY}"]) for i in range(n)]


@pytest.mark.parametrize("usage_details", [True, False])
def test_a_cell_that_resends_an_earlier_cells_prompts_reads_them_from_the_cache(tmp_path, usage_details):
    """Cell 1 sends 4 prompts, cell 2 sends those 4 and 4 new ones, as a sweep's cells of rising concurrency do:
    cell 1 finds nothing cached, cell 2 what the emulator logged as found, read from each response's usage or,
    where usage does not say (vLLM's default, no --enable-prompt-tokens-details), from its counters."""
    ps = cell_prompts(8)
    with EmulatorProcess(mode="ar", ttft_ms=1, itl_ms=1, output_len=6, prefix_cache=True,
                         prompt_tokens_details=usage_details) as em:
        first = measure_cell(em.url, ps[:4], concurrency=2, cell_dir=tmp_path / "s" / "cells" / "a", warmup=False)
        seen = len(httpx.get(em.url + "/emulator/requests").json())
        second = measure_cell(em.url, ps, concurrency=4, cell_dir=tmp_path / "s" / "cells" / "b", warmup=False)
        log = httpx.get(em.url + "/emulator/requests").json()[seen:]
    cached = sum(e["cached_tokens"] for e in log)  # what the emulator found, request by request
    prompt = sum(len(p.turns[0].encode()) // 4 for p in ps)  # its tokens: 4 bytes each
    assert cached > 0 and len(log) == 8
    source = "usage" if usage_details else "vllm-metrics"
    assert (first.prefix_cache_hit_rate, first.prefix_cache_source) == (0.0, source)
    assert second.prefix_cache_source == source
    assert second.prefix_cache_hit_rate == pytest.approx(cached / prompt)
    assert second.total_prompt_tokens == prompt
    if usage_details:
        recs = {r.prompt_id: r.cached_prompt_tokens for r in _records(tmp_path / "s" / "cells" / "b")}
        assert sum(recs.values()) == cached and all(recs[p.id] == 0 for p in ps[4:])


def _records(cell_dir) -> list[RequestRecord]:
    lines = (cell_dir / "requests.jsonl").read_text().splitlines()
    return [RequestRecord.model_validate_json(line) for line in lines]


def test_sglang_meta_info_says_the_cached_tokens():
    st = Stream("generate", False)
    st.feed(0.1, b'{"text": "a", "output_ids": [5], "meta_info": {"prompt_tokens": 40, "completion_tokens": 1, '
                 b'"cached_tokens": 32, "finish_reason": null}}')
    assert (st.prompt_tokens, st.cached_tokens) == (40, 32)


def test_usage_beats_counters_and_nothing_said_is_none():
    rec = lambda cached, warm=False: RequestRecord(request_id="r", prompt_id="p", t_send=0.0, warmup=warm,  # noqa: E731
                                                   prompt_tokens=100, cached_prompt_tokens=cached)
    counters = {"vllm:prefix_cache_queries_total": 400.0, "vllm:prefix_cache_hits_total": 100.0}
    assert prefix_cache([rec(50), rec(0), rec(100, warm=True)], counters) == \
        {"prefix_cache_hit_rate": 0.25, "prefix_cache_source": "usage"}  # the warm-up's left out
    assert prefix_cache([rec(None)], counters) == {"prefix_cache_hit_rate": 0.25, "prefix_cache_source": "vllm-metrics"}
    assert prefix_cache([rec(None)], {"vllm:prompt_tokens_total": 100.0}) == \
        {"prefix_cache_hit_rate": None, "prefix_cache_source": None}
