"""One tau (metrics/definitions.py): every engine's profile says how its counters differ, the client checks the
same quantity from the stream where it can, and every cell names its source and the definition it follows."""

from __future__ import annotations

import json

import pytest

from dflash_bench import profiles
from dflash_bench.client.protocol import Stream
from dflash_bench.metrics.acceptance import cell_acceptance, client_tau
from dflash_bench.metrics.definitions import TAU_DEFINITION, acceptance_length
from dflash_bench.store import RequestRecord


def _record(i: int, chunk_tokens: list[int], **kw) -> RequestRecord:
    return RequestRecord(request_id=f"r{i}", prompt_id=str(i), t_send=0.0, t_end=1.0, output_tokens=chunk_tokens[-1],
                         chunk_times=[0.1 * k for k in range(len(chunk_tokens))], chunk_tokens=chunk_tokens,
                         chunk_tokens_from="usage", **kw)


def test_tau_is_defined_once():
    assert acceptance_length(30, 10) == 4.0
    assert acceptance_length(0, 0) is None  # no verify step: absent, never 1


def test_the_stream_gives_tau_where_each_chunk_is_one_step():
    # first chunk: the prefill's token; then steps of 4, 3 and 5 tokens (request 0) and 2, 2 (request 1)
    records = [_record(0, [1, 5, 8, 13]), _record(1, [1, 3, 5]),
               _record(2, [1, 9], warmup=True), _record(3, [1, 2], error="HTTP 500: x")]
    assert client_tau(records, "chunks") == pytest.approx((12 + 4) / 5)
    assert client_tau(records, None) is None
    # text-derived chunk counts say nothing about steps
    assert client_tau([_record(0, [1, 5, 8]).model_copy(update={"chunk_tokens_from": "text"})], "chunks") is None


def test_llamacpps_timings_give_tau_over_its_decode_steps():
    # 64 tokens: the prefill's, then 63 over decode steps that accepted 49 drafts: 14 steps, 4.5 tokens each
    records = [_record(0, list(range(1, 65)), spec_accepted_tokens=49, spec_draft_tokens=60),
               _record(1, list(range(1, 65)), spec_accepted_tokens=None)]  # no timings: not counted
    assert client_tau(records, "timings") == pytest.approx(63 / 14)


def test_the_client_reads_llamacpps_timings():
    s = Stream("chat", want_ids=False)
    s.feed(0.0, json.dumps({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}).encode())
    s.feed(0.1, json.dumps({"choices": [], "usage": {"completion_tokens": 2, "prompt_tokens": 5},
                            "timings": {"predicted_n": 2, "draft_n": 15, "draft_n_accepted": 1}}).encode())
    assert (s.spec_drafted, s.spec_accepted) == (15, 1)


def test_every_cell_names_its_tau_source_definition_and_client_check():
    delta = {"vllm:spec_decode_num_drafts_total": 4.0, "vllm:spec_decode_num_draft_tokens_total": 60.0,
             "vllm:spec_decode_num_accepted_tokens_total": 12.0}
    records = [_record(0, [1, 5, 8, 13, 17])]
    out = cell_acceptance("builtin", delta, records)
    assert out["acceptance_length"] == 4.0 and out["acceptance_source"] == "builtin-metrics"
    assert out["acceptance_definition"] == TAU_DEFINITION
    assert out["acceptance_length_client"] == 4.0 and out["acceptance_client_source"] == "chunks"
    assert cell_acceptance("builtin", {}, records) == {}  # AR: no tau, no source, no check


@pytest.mark.parametrize("engine", sorted(profiles.PROFILES))
def test_every_engine_says_how_it_counts_tau(engine):
    p = profiles.get(engine)
    assert p.client_tau in (None, "chunks", "timings")
    if engine != "builtin":  # the builtin engine counts as defined; every other engine says how it differs
        assert p.tau_counting
