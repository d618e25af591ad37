"""The builtin server's side of a prefix cache: each response's usage says the prompt tokens the engine read from its
cache (`prompt_tokens_details.cached_tokens`), in every response shape and across the engine's pipe.

The engines keep no prompts yet, so the server is tested over the reference engine made to say it found a prompt's
start cached (`KeptPrompts`): only its bookkeeping is told, its prefill still computes the whole prompt.
"""

from __future__ import annotations

import threading

import httpx
import pytest

pytest.importorskip("transformers")

from dflash_bench.testing.tiny import make_tiny_pair  # noqa: E402
from test_engine_server import inproc_server, sse  # noqa: E402

pytestmark = pytest.mark.engine
B = 4
PROMPT = [5, 17, 33, 2, 9, 11]


class KeptPrompts:
    """The reference engine made to say it found a prompt's start in a prefix cache: a new prompt's longest common
    start with a prompt sent before (all but its last token at most, as a prefix cache leaves the last one to
    compute) becomes its `Seq.cached`, which its bookkeeping puts in every Delta and in `Stats`;
    `reset_prefix_cache` forgets the prompts, noting the thread it ran on."""

    def __init__(self, engine) -> None:
        self.kept: list[list[int]] = []
        self.resets: list[str] = []  # the name of the thread each reset ran on
        self.calls: list[str] = []  # "reset" and "prefill", in the order the engine was asked
        opened, add_many = engine.book.open, engine.add_many

        def open_(req_id, prompt, params):
            seq = opened(req_id, prompt, params)
            seq.cached = max((_common(prompt, k) for k in self.kept), default=0)
            self.kept.append(list(prompt))
            return seq

        def add(reqs):
            self.calls.append("prefill")
            return add_many(reqs)

        engine.book.open, engine.add_many, engine.reset_prefix_cache = open_, add, self.reset

    def reset(self) -> None:
        self.calls.append("reset")
        self.resets.append(threading.current_thread().name)
        self.kept.clear()


def _common(prompt: list[int], kept: list[int]) -> int:
    n = 0
    while n < min(len(prompt) - 1, len(kept)) and prompt[n] == kept[n]:
        n += 1
    return n


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_tiny_pair(tmp_path_factory.mktemp("prefix"), seed=1, block_size=B)[0]


def _cached(usage: dict) -> int:
    return usage["prompt_tokens_details"]["cached_tokens"]


def test_usage_says_the_cached_prompt_tokens_in_every_response_shape(target):
    """A prompt sent a second time finds all but its last token cached: the non-streamed body's usage, every
    continuous-usage chunk and the closing usage chunk say so, for completions and chat alike; a new prompt
    sharing nothing says 0."""
    state: dict = {}
    with inproc_server(target, wrap=lambda e: state.setdefault("kept", KeptPrompts(e))) as (url, _loop):
        def complete(prompt, **extra) -> httpx.Response:
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 3, "temperature": 0, "ignore_eos": True, **extra}
            return httpx.post(url + "/v1/completions", json=body, timeout=60)

        first = complete(PROMPT).json()["usage"]
        assert (first["prompt_tokens"], _cached(first)) == (len(PROMPT), 0)
        again = complete(PROMPT).json()["usage"]
        assert (again["prompt_tokens"], _cached(again)) == (len(PROMPT), len(PROMPT) - 1)
        assert _cached(complete([40, 41, 42]).json()["usage"]) == 0
        stream = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        with httpx.stream("POST", url + "/v1/completions", timeout=60, json={
                "model": "tiny", "prompt": PROMPT[:4] + [7], "max_tokens": 3, "temperature": 0, "ignore_eos": True,
                **stream}) as r:
            events = [e for e in sse(r) if e != "[DONE]"]
        assert len(events) >= 2 and [_cached(e["usage"]) for e in events] == [4] * len(events)

        messages = [{"role": "user", "content": "hi there"}]
        chat = {"model": "tiny", "messages": messages, "max_tokens": 3, "temperature": 0, "ignore_eos": True}
        cold = httpx.post(url + "/v1/chat/completions", json=chat, timeout=60).json()["usage"]
        warm = httpx.post(url + "/v1/chat/completions", json=chat, timeout=60).json()["usage"]
        assert _cached(cold) < cold["prompt_tokens"] - 1 and _cached(warm) == warm["prompt_tokens"] - 1
        with httpx.stream("POST", url + "/v1/chat/completions", json={**chat, **stream}, timeout=60) as r:
            events = [e for e in sse(r) if e != "[DONE]"]
        assert [_cached(e["usage"]) for e in events if e.get("usage")] == [warm["prompt_tokens"] - 1] * (len(events) - 1)
        assert events[-1]["usage"] == warm  # the closing chunk: the whole request's usage
