"""`Engine`: what the decode loop (`serving/loop.py`), the HTTP server (`serving/api_server.py`) and /metrics call.

Two engines implement it: `decode.ReferenceEngine` (any HF model, sampling, the numbers z-lab's code gives)
and `fast.engine.FastEngine` (Qwen3/Llama, greedy, CUDA graphs). Both keep their requests in a
`bookkeeping.Bookkeeping`.
"""

from __future__ import annotations

from typing import Iterable, Protocol, Sequence

from dflash_bench.engine.bookkeeping import Delta, Seq, Stats
from dflash_bench.engine.sampling_params import SamplingParams


class Engine(Protocol):
    B: int  # tokens per verify step (1: AR)
    tok: object  # the Hugging Face tokenizer
    max_model_len: int  # the context limit: tokens per slot (prompt + output + one block)
    vocab_size: int
    greedy_only: bool  # the server answers 400 to sampling requests
    synthetic_acceptance: float | None  # benchmarking only: acceptance is drawn, not measured (labelled in every response)

    @property
    def stats(self) -> Stats: ...

    @property
    def free_slots(self) -> list[int]: ...

    def check(self, n_prompt: int, max_tokens: int) -> str | None:
        """Why a request cannot be served (None when it can)."""

    def admission(self, prompts: Iterable[Sequence[int]]) -> int:
        """How many of the waiting prompts (oldest first; read no further than needed) the next `add_many` takes:
        the engine's own cut (the free slots, what one prefill forward holds: of a prompt that resumes a cached
        prefix, what is left of it); at least one when a slot is free and a prompt waits."""

    def add_many(self, reqs: list[tuple[str, list[int], SamplingParams]]) -> list[tuple[Seq, Delta | None]]:
        """Prefill new requests, all or nothing; their first tokens, in input order (None: the prefill runs on,
        and the first token comes from a later `step`)."""

    def step(self, seqs: list[Seq]) -> list[Delta]:
        """One decode step; a delta per request it stepped (a pipelined engine may skip one just admitted), or
        whose first token is ready since."""

    def release(self, seq: Seq) -> None:
        """Give the sequence's slot back (after it finished or was aborted)."""

    def reset_prefix_cache(self) -> None:
        """Forget every prompt kept for reuse (vLLM's /reset_prefix_cache): the next requests compute their whole
        prompts. An engine that keeps none does nothing."""
