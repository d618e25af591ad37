"""The builtin server's side of a prefix cache: each response's usage says the prompt tokens the engine read from its
cache (`prompt_tokens_details.cached_tokens`), in every response shape and across the engine's pipe.

In this process the server runs over the reference engine made to say it found a prompt's start cached
(`KeptPrompts`: only its bookkeeping is told, its prefill still computes the whole prompt), to reach every response
shape and hold the engine still; through `serve` it runs the fast path's own prefix cache (its engine in a process of
its own).
"""

from __future__ import annotations

import json
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


def test_reset_prefix_cache_runs_on_the_engine_thread_and_what_follows_computes_its_whole_prompt(target):
    """POST /reset_prefix_cache (vLLM's route): answered once the engine thread ran the engine's reset, after which
    the prompt it had kept is computed whole; /metrics counts the reset, and the prompt tokens looked up and found
    cached under vLLM's names; the sweep's client, posting the builtin profile's `cache_reset`, says it emptied the
    cache."""
    from dflash_bench import profiles
    from dflash_bench.client.server_cache import empty_prefix_cache
    from test_engine_server import metric

    state: dict = {}
    with inproc_server(target, wrap=lambda e: state.setdefault("kept", KeptPrompts(e))) as (url, _loop):
        kept: KeptPrompts = state["kept"]

        def cached() -> int:
            body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 2, "temperature": 0, "ignore_eos": True}
            return _cached(httpx.post(url + "/v1/completions", json=body, timeout=60).json()["usage"])

        assert (cached(), cached()) == (0, len(PROMPT) - 1)
        r = httpx.post(url + "/reset_prefix_cache", timeout=60)
        assert (r.status_code, r.json()) == (200, {"success": True})
        assert kept.resets == ["dflash-engine"]  # the loop's thread, the one that steps the engine
        assert cached() == 0
        assert metric(url, "dflash_bench:prefix_cache_resets_total") == 1
        assert metric(url, "vllm:prefix_cache_queries_total") == 3 * len(PROMPT)
        assert metric(url, "vllm:prefix_cache_hits_total") == len(PROMPT) - 1
        path = profiles.get("builtin").cache_reset  # what a sweep posts before each cell
        assert path is not None and empty_prefix_cache(url, path, 30) == f"emptied (POST {path})"
        assert kept.resets == ["dflash-engine"] * 2 and cached() == 0


def test_a_reset_queued_while_a_step_runs_waits_for_it_and_precedes_what_is_submitted_after(target):
    """The engine held inside a decode step: a reset and a request queued meanwhile run after that step ends, the
    reset first, and never inside a step or a prefill (the engine is not thread-safe)."""
    from dflash_bench.engine.build import build
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.sampling_params import SamplingParams
    from dflash_bench.engine.serving.loop import EngineLoop

    engine = build(EngineConfig(str(target), mode="ar", device="cpu", max_slots=4, max_model_len=128,
                                dtype="float64"))
    kept = KeptPrompts(engine)
    entered, gate, step = threading.Event(), threading.Event(), engine.step

    def held_step(seqs):
        kept.calls.append("step")
        entered.set()
        gate.wait()
        out = step(seqs)
        kept.calls.append("stepped")
        return out

    engine.step = held_step
    loop = EngineLoop(engine).start()
    finished: dict[str, threading.Event] = {r: threading.Event() for r in ("a", "b")}
    told: list = []
    reset_ran = threading.Event()

    def sink(req_id):
        return lambda d: finished[req_id].set() if isinstance(d, Exception) or d.finish else None

    try:
        loop.submit("a", PROMPT, SamplingParams(max_tokens=3, ignore_eos=True), sink("a"))
        assert entered.wait(60)
        loop.reset_prefix_cache(lambda err: (told.append((err, threading.current_thread().name)), reset_ran.set()))
        loop.submit("b", PROMPT, SamplingParams(max_tokens=3, ignore_eos=True), sink("b"))
        assert not reset_ran.is_set()  # the engine is inside a step: nothing else touches it
        gate.set()
        assert reset_ran.wait(60) and finished["a"].wait(60) and finished["b"].wait(60)
    finally:
        gate.set()
        loop.stop()
    assert told == [(None, "dflash-engine")]
    first_reset = kept.calls.index("reset")
    assert kept.calls[:first_reset] == ["prefill", "step", "stepped"]  # a's prefill and the held step, whole
    assert kept.calls[first_reset + 1] == "prefill"  # b's, after the reset: it found nothing kept
    assert loop.counters().prefix_cache_resets == 1 and engine.stats.cached_prompt_tokens == 0


def test_a_reset_that_fails_is_a_500_the_sweep_records_and_the_server_goes_on(target, monkeypatch):
    """An engine whose reset raises: the route answers 500 with {"success": false} and the reason, the sweep's
    client tries again and then records why the cache was not emptied, and the server still serves."""
    from dflash_bench.client import server_cache

    monkeypatch.setattr(server_cache, "RETRY_S", 0.0)

    def refuse(engine) -> None:
        def reset() -> None:
            raise RuntimeError("a slot is still held")
        engine.reset_prefix_cache = reset

    with inproc_server(target, wrap=refuse) as (url, loop):
        r = httpx.post(url + "/reset_prefix_cache", timeout=60)
        assert r.status_code == 500 and r.json() == {"success": False,
                                                     "message": "the prefix cache was not reset: a slot is still held"}
        said = server_cache.empty_prefix_cache(url, "/reset_prefix_cache", 30)
        assert said.startswith("not emptied: POST /reset_prefix_cache answered HTTP 500") and "still held" in said
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 2, "temperature": 0, "ignore_eos": True}
        assert httpx.post(url + "/v1/completions", json=body, timeout=60).status_code == 200
        assert loop.counters().prefix_cache_resets == 0



@pytest.mark.slow
def test_the_fast_paths_prefix_cache_and_its_reset_through_serve(target, tmp_path):
    """`serve --fast` runs its engine in a process of its own with the fast path's prefix cache: a prompt sent again
    resumes the slot the first left (all but its last token read from the cache, in usage and in /metrics); the
    route's reset crosses the pipe, runs on that process's engine thread (its loop counts it) and the same prompt is
    computed whole again."""
    from dflash_bench.engine.fast.scheduling.prefix import PREFIX_MIN_TOKENS
    from test_engine_server import cli_server, metric

    prompt = [(7 * i + 3) % 200 + 3 for i in range(PREFIX_MIN_TOKENS + 6)]
    with cli_server("--model", str(target), "--mode", "ar", "--served-model-name", "tiny", "--dtype", "float64",
                    "--fast") as url:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": True}

        def cached() -> int:
            usage = httpx.post(url + "/v1/completions", json=body, timeout=60).json()["usage"]
            assert usage["prompt_tokens"] == len(prompt)
            return _cached(usage)

        assert (cached(), cached()) == (0, len(prompt) - 1)
        for n in (1, 2):
            r = httpx.post(url + "/reset_prefix_cache", timeout=60)
            assert (r.status_code, r.json()) == (200, {"success": True})
            assert metric(url, "dflash_bench:prefix_cache_resets_total") == n
        assert cached() == 0
        assert metric(url, "vllm:prefix_cache_queries_total") == 3 * len(prompt)
        assert metric(url, "vllm:prefix_cache_hits_total") == len(prompt) - 1


@pytest.mark.slow
def test_a_builtin_sweep_empties_the_servers_prefix_cache_before_each_cell(target, tmp_path, data_dir):
    """Through the CLI: a sweep of the builtin engine (the server it launches, its engine in a process of its own)
    posts the profile's `cache_reset` before each of its cells, and each cell records that the cache was emptied
    (the reference engine keeps no prompts: no cell read any from the cache)."""
    import subprocess
    import sys

    from dflash_bench.launch import free_port
    from sweep_helpers import only_sweep, results

    out = tmp_path / "reports"
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", str(target), "--engine",
                           "builtin", "--modes", "ar", "--suites", "gsm8k", "--concurrency", "1,2", "-n", "2",
                           "--max-tokens", "4", "--port", str(free_port()), "--out", str(out), "--data-dir",
                           str(data_dir)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    folder = only_sweep(out)
    rows = results(folder)
    assert set(rows) == {"builtin-ar-gsm8k-c1", "builtin-ar-gsm8k-c2"}
    for cid in rows:
        summary = json.loads((folder / "cells" / cid / "summary.json").read_text())
        assert summary["prefix_cache_reset"] == "emptied (POST /reset_prefix_cache)", cid
        assert (summary["prefix_cache_hit_rate"], summary["prefix_cache_source"]) == (0.0, "usage")


@pytest.mark.slow
def test_a_sweep_of_random_weights_sends_later_turns_the_same_history_whatever_the_engine_answered(target, tmp_path,
                                                                                                   data_dir):
    """With random weights (--load-format dummy) each engine's answers are noise of its own (the builtin engine's
    decode to newlines, vLLM's and SGLang's to nothing), so a multi-turn suite's later turns carry them as empty
    text: every engine gets the same second turns. The cell records it; a sweep of real weights sends the answers."""
    import subprocess
    import sys

    from dflash_bench.launch import free_port
    from sweep_helpers import only_sweep

    for n, extra in enumerate((["--engine-arg=--load-format=dummy"], [])):
        out = tmp_path / f"reports{n}"
        proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", str(target), "--engine",
                               "builtin", "--modes", "ar", "--suites", "mt-bench", "--concurrency", "1", "-n", "1",
                               "--max-tokens", "4", "--port", str(free_port()), "--out", str(out), "--data-dir",
                               str(data_dir), *extra], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        folder = only_sweep(out)
        summary = json.loads((folder / "cells" / "builtin-ar-mt-bench-c1" / "summary.json").read_text())
        assert summary["settings"]["history"] == ("blank" if extra else "answers")
