"""A timing emulator of an AR or speculative (DFlash) LLM server with known ground truth.

It speaks enough of vLLM's OpenAI API (streaming chat and completions, /metrics with vLLM's speculative
counter names) and of SGLang's native `/generate` (cumulative events, `meta_info` spec fields) for the
harness to measure it exactly as it measures a real server. Because its timing is known, tests can check
that the harness measures right:

- the first token leaves `ttft_ms` after the request arrives;
- then one verification step every `itl_ms` (+ `batch_slope_ms` per other running request), each step
  emitting one token (ar) or `k` tokens (dflash), k = 1 + Binomial(block_size - 1, p) so that E[k] is
  exactly `acceptance_length` (or, given `acceptance_rates`, 1 + the run a synthetic acceptance profile draws:
  E[k] = 1 + the rates' sum), the last step cut at the output length (counters still count the whole
  step, as vLLM's do);
- output length and token ids are a deterministic function of (seed, prompt), identical in both modes,
  so an AR and a DFlash emulator are "lossless" with respect to each other;
- with `prefix_cache`, vLLM's automatic prefix caching as its counters show it (`lookup`): the prompt tokens
  each request finds cached, whole blocks of 16 tokens, under `vllm:prefix_cache_*`, and with
  `prompt_tokens_details` in `usage.prompt_tokens_details.cached_tokens` (the first token still comes
  `ttft_ms` after the request).

Fault injection (`fail_every`/`fail_kind`, `crash_after_requests`) lets tests plant the failures a real
server shows. The HTTP side is `server.py`.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import time
from dataclasses import dataclass, field

from dflash_bench.synthetic import SyntheticProfile

FAIL_KINDS = ("error", "stream-error", "drop", "malformed", "hang")
PREFIX_BLOCK = 16  # tokens per prefix-cache block (vLLM's default block size); a token is 4 prompt bytes (`plan`)


@dataclass
class EmulatorConfig:
    mode: str = "ar"  # "ar" or "dflash"
    ttft_ms: float = 50.0
    itl_ms: float = 10.0
    block_size: int = 16
    acceptance_length: float = 6.5
    # a synthetic acceptance profile instead (dflash_bench/synthetic.py): per draft position the share of steps that
    # accept that far, each step's run drawn position by position with the conditional rates; tau = 1 + sum
    acceptance_rates: tuple[float, ...] | None = None
    output_len: int = 128  # mean natural output length (EOS), drawn uniformly in [0.5, 1.5] x this
    batch_slope_ms: float = 0.0  # extra step time per other running request
    seed: int = 0
    model: str = "emulator"
    vocab_size: int = 32000
    per_request_spec_metrics: bool = False  # vLLM --per-request-spec-decode-metrics summary
    fail_every: int = 0  # every k-th generation request fails with fail_kind (0 = never)
    fail_kind: str = "error"
    crash_after_requests: int = 0  # exit(3) once this many generation requests have completed
    prefix_cache: bool = False  # vLLM's automatic prefix caching, on its counters (see EmulatorModel.lookup)
    prompt_tokens_details: bool = False  # vLLM's --enable-prompt-tokens-details: usage says the cached tokens

    def __post_init__(self) -> None:
        if self.mode not in ("ar", "dflash"):
            raise ValueError(f"mode must be 'ar' or 'dflash', not {self.mode!r}")
        if self.mode == "dflash" and not 1.0 <= self.acceptance_length <= self.block_size:
            raise ValueError("acceptance_length must lie between 1 and block_size")
        if self.acceptance_rates is not None and len(self.acceptance_rates) != self.block_size - 1:
            raise ValueError(f"acceptance_rates needs one rate per draft position ({self.block_size - 1} for a block "
                             f"of {self.block_size}), not {len(self.acceptance_rates)}")
        if self.fail_kind not in FAIL_KINDS:
            raise ValueError(f"fail_kind must be one of {', '.join(FAIL_KINDS)}")


@dataclass
class Counters:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_ok: int = 0
    running: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: list[int] = field(default_factory=list)
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0  # and found there


@dataclass
class Plan:
    """What one request will produce: token ids, finish reason, and tokens emitted per verify step."""

    ids: list[int]
    finish: str
    steps: list[int]  # tokens accepted+bonus per verify step (the first token is not a step)
    prompt_tokens: int
    cached_tokens: int | None = None  # of the prompt's, found in the prefix cache (None: no cache; `lookup`)


class EmulatorModel:
    def __init__(self, cfg: EmulatorConfig):
        self.cfg = cfg
        self.c = Counters(per_pos=[0] * max(cfg.block_size - 1, 0))
        self.n_gen = 0
        self.n_done = 0
        self.created = time.time()
        self.blocks: set[bytes] = set()  # the prefix cache: a key per cached block and everything before it
        rates = cfg.acceptance_rates
        self.conditional = SyntheticProfile(rates=rates).conditional() if rates is not None else None

    # ---- the model ---------------------------------------------------------------------------------
    def plan(self, prompt: str, max_tokens: int, ignore_eos: bool = False) -> Plan:
        cfg = self.cfg
        h = int.from_bytes(hashlib.blake2b(f"{cfg.seed}\0{prompt}".encode(), digest_size=8).digest(), "big")
        rng = random.Random(h)
        natural = max(1, round(rng.uniform(0.5, 1.5) * cfg.output_len))
        if ignore_eos:  # the answer's natural end is not a stop: it runs to max_tokens
            natural = max_tokens + 1
        n = min(natural, max_tokens)
        ids = [rng.randrange(cfg.vocab_size) for _ in range(n)]
        finish = "stop" if natural <= max_tokens else "length"
        steps: list[int] = []
        if cfg.mode == "ar":
            steps = [1] * (n - 1)
        else:
            acc = random.Random(h ^ 0x5DEECE66D)
            k_max = cfg.block_size - 1
            p = (cfg.acceptance_length - 1.0) / k_max if k_max else 0.0
            conditional = self.conditional
            left = n - 1
            while left > 0:
                if conditional is None:
                    k = 1 + sum(acc.random() < p for _ in range(k_max))
                else:  # the accepted run of a synthetic profile: position by position until one is rejected
                    k = 1
                    while k <= k_max and acc.random() < conditional[k - 1]:
                        k += 1
                steps.append(k)
                left -= k
        return Plan(ids, finish, steps, max(1, len(prompt.encode()) // 4))

    def lookup(self, prompt: str, prompt_tokens: int) -> int | None:
        """The prefix cache (None when off): how many of the prompt's tokens are cached, in whole blocks of
        PREFIX_BLOCK tokens from the start, each block keyed by every byte up to its end, and at most all but the
        last token (which a server computes anyway); then the prompt's blocks are cached, never evicted. Counted
        as vLLM counts it: every prompt token a query, every cached one a hit."""
        if not self.cfg.prefix_cache:
            return None
        data, step = prompt.encode(), 4 * PREFIX_BLOCK
        h = hashlib.blake2b(digest_size=16)
        keys = []
        for i in range(prompt_tokens // PREFIX_BLOCK):
            h.update(data[i * step:(i + 1) * step])
            keys.append(h.copy().digest())
        hit = 0
        while hit < (prompt_tokens - 1) // PREFIX_BLOCK and keys[hit] in self.blocks:
            hit += 1
        self.blocks.update(keys)
        self.c.prefix_queries += prompt_tokens
        self.c.prefix_hits += hit * PREFIX_BLOCK
        return hit * PREFIX_BLOCK

    def reset_prefix_cache(self) -> None:
        """Forget every cached block, as vLLM's POST /reset_prefix_cache does (its counters keep counting)."""
        self.blocks.clear()

    def reported(self, plan: Plan) -> int | None:
        """The cached tokens a response's usage says (None: it says nothing, vLLM's default)."""
        return (plan.cached_tokens or 0) if self.cfg.prompt_tokens_details else None

    def count_step(self, k: int) -> None:
        """Record one verify step in the vLLM-style counters (the whole step, even past EOS)."""
        if self.cfg.mode != "dflash":
            return
        c = self.c
        c.drafts += 1
        c.draft_tokens += self.cfg.block_size - 1
        c.accepted += k - 1
        for i in range(k - 1):
            c.per_pos[i] += 1

    def step_s(self) -> float:
        return (self.cfg.itl_ms + self.cfg.batch_slope_ms * max(self.c.running - 1, 0)) / 1000.0

    def fault(self) -> str | None:
        self.n_gen += 1
        every = self.cfg.fail_every
        return self.cfg.fail_kind if every and self.n_gen % every == 0 else None

    def finished(self) -> None:
        self.n_done += 1
        if self.cfg.crash_after_requests and self.n_done >= self.cfg.crash_after_requests:
            sys.stdout.flush()
            os._exit(3)  # a planted crash: streams in flight are cut

    # ---- /metrics ----------------------------------------------------------------------------------
    def metrics_text(self) -> str:
        lab = f'engine="0",model_name="{self.cfg.model}"'
        c = self.c
        out: list[str] = []

        def counter(name: str, value: float, help_: str, extra: str = "") -> None:
            out.append(f"# HELP {name}_total {help_}\n# TYPE {name}_total counter")
            out.append(f"{name}_total{{{lab}{extra}}} {float(value)}")
            out.append(f"# HELP {name}_created {help_}\n# TYPE {name}_created gauge")
            out.append(f"{name}_created{{{lab}{extra}}} {self.created}")

        counter("vllm:prompt_tokens", c.prompt_tokens, "Number of prefill tokens processed.")
        counter("vllm:generation_tokens", c.generation_tokens, "Number of generation tokens processed.")
        counter("vllm:request_success", c.requests_ok, "Count of successfully processed requests.", ',finished_reason="stop"')
        out.append("# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.")
        out.append(f"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {self.created}")
        out.append("# HELP vllm:num_requests_running Number of requests in model execution batches.")
        out.append(f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{lab}}} {float(c.running)}")
        if self.cfg.prefix_cache:
            counter("vllm:prefix_cache_queries", c.prefix_queries, "Prefix cache queries, in terms of number of queried tokens.")
            counter("vllm:prefix_cache_hits", c.prefix_hits, "Prefix cache hits, in terms of number of cached tokens.")
        if self.cfg.mode == "dflash":
            counter("vllm:spec_decode_num_drafts", c.drafts, "Number of spec decoding drafts.")
            counter("vllm:spec_decode_num_draft_tokens", c.draft_tokens, "Number of draft tokens.")
            counter("vllm:spec_decode_num_accepted_tokens", c.accepted, "Number of accepted tokens.")
            name = "vllm:spec_decode_num_accepted_tokens_per_pos"
            out.append(f"# HELP {name}_total Accepted tokens per draft position.\n# TYPE {name}_total counter")
            for i, v in enumerate(c.per_pos):
                out.append(f'{name}_total{{{lab},position="{i}"}} {float(v)}')
        return "\n".join(out) + "\n"


def token_text(tid: int) -> str:
    return f" w{tid}"


def logprob_entry(tid: int) -> dict:
    """vLLM chat logprobs entry with return_tokens_as_token_ids: the chosen token and a runner-up."""
    alt = (tid * 7919 + 1) % 32000
    top = [{"token": f"token_id:{tid}", "logprob": -0.1}, {"token": f"token_id:{alt}", "logprob": -2.5}]
    return {"token": f"token_id:{tid}", "logprob": -0.1, "bytes": None, "top_logprobs": top}
