"""`SamplingParams`: what a request asks of its decoding (the server's request fields, read by both engines'
bookkeeping; the reference engine samples with them, the fast path decodes greedily)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: int | None = None  # None: off; n >= 0: the chosen token's logprob plus the top n
    seed: int | None = None  # a request's own random stream (the engine makes `generator` from it)
    generator: torch.Generator | None = field(default=None, repr=False, compare=False)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0
