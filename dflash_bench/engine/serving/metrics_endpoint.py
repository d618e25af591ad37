"""/metrics in Prometheus text format with vLLM's names, so the harness scrapes us as it scrapes vLLM."""

from __future__ import annotations

from typing import Iterator

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily

from dflash_bench.client.server_slots import SLOTS_GAUGE
from dflash_bench.engine.serving.loop import LoopCounters
from dflash_bench.metrics.phases import PHASES
from dflash_bench.metrics.prometheus import VERIFIED_PER_POS, WIDTH_POLICY


PHASE_DOCS = {
    "queue": "Seconds finished requests waited from arrival to the start of their prefill.",
    "prefill": "Seconds finished requests took from the start of their prefill to their first token (a prompt "
               "that rides in decode steps, --prefill mixed: from its admission, its wait to ride included).",
    "decode": "Seconds finished requests took from their first token to their last.",
}


class EngineCollector:
    """The loop's and its engine's counters as of the scrape (`EngineLoop.counters`, or what the engine's process
    sent with its last step)."""

    def __init__(self, counters: LoopCounters, model_name: str):
        self.c, self.model = counters, model_name

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=["model_name"])
        c.add_metric([self.model], value)
        return c

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=["model_name"])
        g.add_metric([self.model], value)
        return g

    def collect(self) -> Iterator[Metric]:
        c = self.c
        st = c.stats
        yield self._counter("vllm:prompt_tokens", "Prefill tokens processed.", st.prompt_tokens)
        yield self._counter("vllm:generation_tokens", "Generation tokens processed.", st.generation_tokens)
        yield self._counter("vllm:request_success", "Requests that finished (stop or length).", st.requests)
        # vLLM's prefix cache counters (metrics/cache.py reads a cell's hit rate from them where usage does not say)
        yield self._counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens "
                            "(every prefilled prompt token).", st.prompt_tokens)
        yield self._counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                            st.cached_prompt_tokens)
        yield self._counter("dflash_bench:prefix_cache_resets", "Times the engine forgot the prompts it keeps "
                            "(POST /reset_prefix_cache).", c.prefix_cache_resets)
        for phase in PHASES:  # vLLM's request histograms, as a sum and a count (no buckets: the harness reads means)
            m = SummaryMetricFamily(f"vllm:request_{phase}_time_seconds", PHASE_DOCS[phase], labels=["model_name"])
            m.add_metric([self.model], count_value=c.phased_requests, sum_value=c.phase_seconds.get(phase, 0.0))
            yield m
        yield self._gauge("vllm:num_requests_running", "Requests in the decode batch.", c.running)
        yield self._gauge("vllm:num_requests_waiting", "Requests waiting for a slot.", c.waiting)
        if (slots := c.slots) is not None:  # the harness refuses a concurrency beyond it before a cell (client/server_slots.py)
            yield self._gauge(SLOTS_GAUGE, "Most requests decoded together (the KV pool's slots).", slots)
        busy = CounterMetricFamily("dflash_bench:engine_thread_seconds", "Seconds the engine thread spent per "
                                   "phase: prefill, step (launch, GPU wait, bookkeeping), emit (hand-over to HTTP).",
                                   labels=["model_name", "phase"])
        for phase, seconds in c.seconds.items():
            busy.add_metric([self.model, phase], seconds)
        yield busy
        yield self._counter("dflash_bench:decode_steps", "Decode steps the engine thread ran (tokens / steps: rows "
                            "per step, times tau).", c.steps)
        yield self._counter("dflash_bench:prefill_groups", "Prefill groups the engine thread admitted (requests "
                            "admitted / groups: prompts per prefill forward).", c.groups)
        if (mixed := c.mixed_prefills) is not None:  # the fast path: prompts that rode in a decode step (`serve --prefill mixed`)
            yield self._counter("dflash_bench:mixed_prefills", "Prompts prefilled by the forward of a decode step "
                                "(the running rows' and the prompt's tokens in one forward).", mixed)
        if (synthetic := c.synthetic_acceptance) is not None:  # benchmarking only: acceptance below is drawn, not measured
            yield self._gauge("dflash_bench:synthetic_acceptance", "Mean acceptance length the verifier was told to "
                              "draw (tokens are not the target's).", synthetic)
        if c.block_size <= 1:
            return
        yield self._counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", st.drafts)
        yield self._counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", st.draft_tokens)
        yield self._counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", st.accepted)
        per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                      "Accepted tokens per draft position.", labels=["model_name", "position"])
        for i, n in enumerate(st.accepted_per_pos):
            per_pos.add_metric([self.model, str(i)], n)
        yield per_pos
        verified = CounterMetricFamily(VERIFIED_PER_POS, "Drafts that verified draft positions 0..position (with "
                                       "the accepted per position: the width-free acceptance profile).",
                                       labels=["model_name", "position"])
        for i, n in enumerate(st.verified_per_pos):
            verified.add_metric([self.model, str(i)], n)
        yield verified
        policy = GaugeMetricFamily(WIDTH_POLICY, "How each step's verify width is chosen (the label; 1): full, auto "
                                   "(by load) or w<N> (fixed).", labels=["model_name", "policy"])
        policy.add_metric([self.model, c.width_policy], 1)
        yield policy
        widths = CounterMetricFamily("dflash_bench:verify_width_row_steps", "Row-steps by tokens verified per row "
                                     "(the anchor and its drafts; the fast path chooses it by load).",
                                     labels=["model_name", "width"])
        for w, n in sorted(st.widths.items()):
            widths.add_metric([self.model, str(w)], n)
        yield widths


def render(counters: LoopCounters, model_name: str) -> bytes:
    reg = CollectorRegistry()
    reg.register(EngineCollector(counters, model_name))
    ProcessCollector(registry=reg)  # process_start_time_seconds, as vLLM's and SGLang's: who answers (launch/identity.py)
    return generate_latest(reg)
