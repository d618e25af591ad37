"""A cell's prompt tokens read from the server's prefix cache (`metrics/cache.py`), measured against the emulator's
vLLM-style prefix cache, which logs what each request found: through the usage a response carries, and without
it through vLLM's counters; read from SGLang's meta_info; and said in the report."""

from __future__ import annotations

import json
import subprocess

import httpx
import pytest

from dflash_bench.client import measure_cell
from dflash_bench.client.server_cache import empty_prefix_cache
from dflash_bench.client.protocol import Stream
from dflash_bench.emulator import EmulatorProcess
from dflash_bench.metrics.cache import prefix_cache
from dflash_bench.store import RequestRecord
from benchmarks.fixtures.emulator_truth import P
from sweep_helpers import only_sweep, results, sweep_argv

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


def test_a_sweep_empties_the_cache_before_each_cell_so_no_cell_reads_an_earlier_ones_prompts(tmp_path, data_dir):
    """Through the CLI: the c=1 and c=4 cells send the same 6 prompts to one emulated vLLM server with its prefix
    cache on. The sweep empties the cache (vLLM's POST /reset_prefix_cache) before each cell, so the c=4 cell finds
    none of the c=1 cell's prompts cached, and each cell says the cache was emptied."""
    out = tmp_path / "reports"
    proc = subprocess.run(sweep_argv(out, "--data-dir", str(data_dir), "--modes", "ar", "--engine-arg=--prefix-cache",
                                     suites="gsm8k"), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = only_sweep(out)
    rows = results(folder)
    assert set(rows) == {"emulator-ar-gsm8k-c1", "emulator-ar-gsm8k-c4"}
    for cid in rows:
        summary = json.loads((folder / "cells" / cid / "summary.json").read_text())
        assert summary["prefix_cache_reset"] == "emptied (POST /reset_prefix_cache)"
        assert (summary["prefix_cache_hit_rate"], summary["prefix_cache_source"]) == (0.0, "vllm-metrics")


def test_the_same_prompts_after_emptying_find_nothing_and_a_server_without_the_route_says_so(tmp_path):
    """Against the emulator's vLLM-style cache: a resend finds the prompts cached until the cache is emptied; a
    path the server does not serve is a sentence, not an exception (the cell is then measured as it is)."""
    ps = cell_prompts(4)
    with EmulatorProcess(mode="ar", ttft_ms=1, itl_ms=1, output_len=6, prefix_cache=True) as em:
        measure_cell(em.url, ps, concurrency=2, cell_dir=tmp_path / "s" / "cells" / "a", warmup=False)
        again = measure_cell(em.url, ps, concurrency=2, cell_dir=tmp_path / "s" / "cells" / "b", warmup=False)
        assert empty_prefix_cache(em.url, "/reset_prefix_cache", 10) == "emptied (POST /reset_prefix_cache)"
        emptied = measure_cell(em.url, ps, concurrency=2, cell_dir=tmp_path / "s" / "cells" / "c", warmup=False)
        missing = empty_prefix_cache(em.url, "/flush_cache", 10)
    assert again.prefix_cache_hit_rate > 0.5 and emptied.prefix_cache_hit_rate == 0.0
    assert missing == "not emptied: the server has no POST /flush_cache (HTTP 404)"


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
