"""The builtin engine's HTTP server: real `dflash-bench serve` processes and in-process uvicorn on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import httpx
import pytest

pytest.importorskip("transformers")

from dflash_bench.launch import free_port  # noqa: E402
from dflash_bench.testing.tiny import PREDICTED_TOKEN, make_tiny_pair  # noqa: E402
from launch_helpers import stop_harness  # noqa: E402

pytestmark = pytest.mark.engine
B = 4


def wait_ready(url: str, proc=None, timeout: float = 90.0) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.stdout.read()}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("server did not become ready")


@contextmanager
def cli_server(*args: str):
    """`python -m dflash_bench serve ...` as a real process; always terminated."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dflash_bench", "serve", "--port", str(port), "--device", "cpu",
                             "--max-model-len", "512", "--max-slots", "8", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc)
        yield url
    finally:
        stop_harness(proc)


@contextmanager
def inproc_server(target, draft=None, mode="ar", name="tiny", step_delay: float = 0.0, before_step=None, wrap=None):
    """The same app in this process (uvicorn on a thread): cheaper when a test needs two servers.

    `step_delay` seconds are added to every decode step (a slow GPU, to widen a timing window in a test);
    `before_step()` runs before each (a test holds the engine still); `wrap(engine)` runs on the built engine
    before its loop starts (a test adds to what it does).
    """
    import uvicorn

    from dflash_bench.engine.build import build
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.serving.loop import EngineLoop
    from dflash_bench.engine.serving.api_server import build_app

    engine = build(EngineConfig(str(target), draft and str(draft), mode=mode, device="cpu", max_slots=8, max_model_len=512, dtype="float64"))
    if step_delay or before_step is not None:
        real_step = engine.step
        engine.step = lambda seqs: (time.sleep(step_delay), before_step and before_step(), real_step(seqs))[2]
    if wrap is not None:
        wrap(engine)
    loop = EngineLoop(engine).start()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(loop, name), host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    try:
        wait_ready(f"http://127.0.0.1:{port}")
        yield f"http://127.0.0.1:{port}", loop
    finally:
        server.should_exit = True
        th.join(timeout=10)
        loop.stop()


@pytest.fixture(scope="module")
def predictable(tmp_path_factory):
    return make_tiny_pair(tmp_path_factory.mktemp("pred"), predictable=True, block_size=B)


@pytest.fixture(scope="module")
def random_pair(tmp_path_factory):
    return make_tiny_pair(tmp_path_factory.mktemp("rand"), seed=1, block_size=B)


@pytest.fixture(scope="module")
def dflash_url(predictable):
    target, drafter = predictable
    with cli_server("--model", str(target), "--draft", str(drafter), "--served-model-name", "tiny") as url:
        yield url


def sse(resp) -> list[dict]:
    events = []
    for line in resp.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append("[DONE]" if data == "[DONE]" else json.loads(data))
    return events


def stream_chat(url, **body):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi there"}], "stream": True, **body}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        return sse(r)


def metric(url: str, name: str, where: str = "") -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and where in line)


@pytest.mark.slow
def test_stream_carries_cumulative_usage_and_whole_blocks(dflash_url):
    drafts0 = metric(dflash_url, "vllm:spec_decode_num_drafts_total")
    busy0 = {p: metric(dflash_url, "dflash_bench:engine_thread_seconds_total", f'phase="{p}"')
             for p in ("prefill", "step", "emit")}
    steps0, groups0 = (metric(dflash_url, f"dflash_bench:{n}_total") for n in ("decode_steps", "prefill_groups"))
    events = stream_chat(dflash_url, max_tokens=1 + 3 * B, temperature=0,
                         stream_options={"include_usage": True, "continuous_usage_stats": True},
                         logprobs=True, top_logprobs=2, return_tokens_as_token_ids=True,
                         chat_template_kwargs={"enable_thinking": False})
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e["choices"]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    # cumulative usage in whole blocks: the prefill's token, then B tokens a step. Deltas of one request that wait in
    # the server's queue together go out as one chunk (api_server.coalesce), so on a loaded machine the prefill's
    # token may ride with the first block
    counts = [c["usage"]["completion_tokens"] for c in chunks[1:]]
    assert counts[-1] == 1 + 3 * B and counts == sorted(set(counts)) and all(n % B == 1 for n in counts), counts
    sizes = [len(c["choices"][0]["delta"]["content"]) for c in chunks[1:]]
    assert sizes == [n - m for m, n in zip([0, *counts], counts)], (sizes, counts)
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks)
    assert text == chr(PREDICTED_TOKEN) * (1 + 3 * B)
    ids = [e["token"] for c in chunks[1:] for e in c["choices"][0]["logprobs"]["content"]]
    assert ids == [f"token_id:{PREDICTED_TOKEN}"] * (1 + 3 * B)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    tail = events[-2]
    assert tail["choices"] == [] and tail["usage"]["completion_tokens"] == 1 + 3 * B
    assert tail["metrics"]["speculative_decoding"]["mean_acceptance_length"] == B
    # tau from /metrics, as the harness computes it for vLLM: 1 + accepted / drafts
    assert metric(dflash_url, "vllm:spec_decode_num_drafts_total") - drafts0 == 3
    assert metric(dflash_url, "dflash_bench:decode_steps_total") - steps0 == 3  # one prefill, then three steps
    assert metric(dflash_url, "dflash_bench:prefill_groups_total") - groups0 == 1
    acc = metric(dflash_url, "vllm:spec_decode_num_accepted_tokens_total")
    drafts = metric(dflash_url, "vllm:spec_decode_num_drafts_total")
    assert 1 + acc / drafts == B
    assert metric(dflash_url, 'vllm:spec_decode_num_accepted_tokens_per_pos_total') == acc
    assert metric(dflash_url, "dflash_bench:verify_width_row_steps_total", f'width="{B}"') == drafts
    assert metric(dflash_url, "vllm:generation_tokens_total") >= 1 + 3 * B
    for phase, before in busy0.items():  # where the engine thread's time went: every phase ran
        assert metric(dflash_url, "dflash_bench:engine_thread_seconds_total", f'phase="{phase}"') > before, phase


def test_non_streaming_chat_and_completions(dflash_url):
    r = httpx.post(dflash_url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 6, "temperature": 0})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == "a" * 6 and body["usage"]["completion_tokens"] == 6
    r = httpx.post(dflash_url + "/v1/completions", timeout=60, json={
        "prompt": "abc", "max_tokens": 5, "temperature": 0, "logprobs": 1, "stop": ["aaa"]})
    c = r.json()["choices"][0]
    assert c["text"] == "" and c["finish_reason"] == "stop"
    r = httpx.post(dflash_url + "/v1/completions", timeout=60, json={"prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0.7, "top_k": 1})
    assert r.json()["choices"][0]["text"] == "aaa"


def test_models_health_and_bad_requests(dflash_url):
    assert httpx.get(dflash_url + "/v1/models").json()["data"][0]["id"] == "tiny"
    cases = [
        ({"prompt": "x", "max_tokens": 100000}, "longer than this server's limit"),
        ({"prompt": "x", "temperature": -1}, "temperature"),
        ({"prompt": "x", "top_p": 0}, "top_p"),
        ({"prompt": "x", "n": 2}, "n=1"),
        ({"prompt": ""}, "empty"),
        ({"max_tokens": 3}, "prompt"),
        ({"prompt": [99999]}, "outside the vocabulary"),
    ]
    for body, msg in cases:
        r = httpx.post(dflash_url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 400, body
        assert msg in r.json()["message"], (body, r.json())
    r = httpx.post(dflash_url + "/v1/completions", json={"model": "other", "prompt": "x"}, timeout=30)
    assert r.status_code == 404
    r = httpx.post(dflash_url + "/v1/completions", content=b'{"prompt": "x",', timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["message"].startswith("the request body is not valid JSON")


def test_concurrent_requests_share_batches_and_disconnects_free_slots(dflash_url):
    import concurrent.futures as cf

    def one(n):
        return stream_chat(dflash_url, max_tokens=n, temperature=0, stream_options={"include_usage": True})

    with cf.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, [3, 9, 17, 5, 30, 12]))
    for n, events in zip([3, 9, 17, 5, 30, 12], results):
        assert events[-2]["usage"]["completion_tokens"] == n
    # a client that goes away mid-stream: its slot comes back
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 400}
    with httpx.stream("POST", dflash_url + "/v1/chat/completions", json=body, timeout=60) as r:
        next(r.iter_lines())
    end = time.time() + 20
    while metric(dflash_url, "vllm:num_requests_running") and time.time() < end:
        time.sleep(0.1)
    assert metric(dflash_url, "vllm:num_requests_running") == 0


def test_ar_and_dflash_servers_return_the_same_token_ids(random_pair):
    target, drafter = random_pair
    prompts = ["the quick brown fox", "a", "numbers 1 2 3 4 5 6 7 8 9 and more words here"]
    got = {}
    for mode in ("ar", "dflash"):
        with inproc_server(target, drafter, mode=mode) as (url, _):
            ids = []
            for p in prompts:
                r = httpx.post(url + "/v1/completions", timeout=60, json={
                    "prompt": p, "max_tokens": 25, "temperature": 0, "ignore_eos": True, "logprobs": 0,
                    "return_tokens_as_token_ids": True})
                ids.append(r.json()["choices"][0]["logprobs"]["tokens"])
            got[mode] = ids
            has_spec = "spec_decode_num_drafts" in httpx.get(url + "/metrics").text
            assert has_spec == (mode == "dflash")
    assert got["ar"] == got["dflash"] and all(len(x) == 25 for x in got["ar"])


@pytest.mark.slow
def test_serve_errors_are_one_sentence(random_pair, tmp_path):
    target, _ = random_pair
    out = subprocess.run([sys.executable, "-m", "dflash_bench", "serve", "--model", str(target), "--mode", "dflash",
                          "--device", "cpu", "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "needs a drafter" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "dflash_bench", "serve", "--model", str(tmp_path / "nope"),
                          "--device", "cpu", "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "error:" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "dflash_bench", "serve", "--model", str(target), "--no-step-ahead",
                          "--device", "cpu", "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "fast path only" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "dflash_bench", "serve", "--model", str(target), "--prefill", "beside",
                          "--device", "cpu", "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--prefill must be one of" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "dflash_bench", "serve", "--model", str(target), "--prefill", "mixed",
                          "--device", "cpu", "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--prefill mixed applies to the fast path" in out.stderr


@pytest.mark.slow
def test_harness_run_measures_the_builtin_server(dflash_url, tmp_path, data_dir):
    out = subprocess.run([sys.executable, "-m", "dflash_bench", "run", "--url", dflash_url, "--suite", "gsm8k",
                          "--concurrency", "2", "--num-prompts", "4", "--max-tokens", "12", "--engine", "builtin",
                          "--label", "dflash", "--save-token-ids", "--out", str(tmp_path), "--name", "s",
                          "--data-dir", str(data_dir)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    cell = tmp_path / "s" / "cells" / "builtin-dflash-gsm8k-c2"
    summary = json.loads((cell / "summary.json").read_text())
    assert summary["num_ok"] == 4 and summary["total_output_tokens"] == 4 * 12
    # tau counts committed tokens per verify step (metrics/definitions.py): whole blocks accepted, the 11 tokens
    # after the prefill's in ceil(11 / B) steps, the last one cut at max_tokens
    assert summary["acceptance_length"] == pytest.approx(11 / -(-11 // B))
    assert summary["acceptance_source"] == "builtin-metrics"
    # the server's own split of each request's time (vLLM's histograms' names): read for the four measured requests
    assert summary["server_queue_ms"] >= 0 and summary["server_prefill_ms"] > 0 and summary["server_decode_ms"] > 0
    # the reference engine verifies the whole block every step; positions past max_tokens are not counted
    assert summary["verify_width"] == pytest.approx(11 / -(-11 // B))
    rows = [json.loads(line) for line in (cell / "requests.jsonl").read_text().splitlines()]
    measured = [r for r in rows if not r["warmup"]]
    assert all(r["token_ids"] == [PREDICTED_TOKEN] * 12 for r in measured)


def test_a_non_streaming_client_that_goes_away_frees_its_slot(random_pair):
    target, _ = random_pair
    with inproc_server(target, step_delay=0.05) as (url, loop):
        body = {"prompt": "the cat", "max_tokens": 200, "ignore_eos": True, "temperature": 0}  # ~10 s of steps
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json=body, timeout=0.5)
        end = time.time() + 5
        while loop.num_running and time.time() < end:
            time.sleep(0.05)
        assert loop.num_running == 0 and len(loop.engine.free_slots) == 8
        r = httpx.post(url + "/v1/completions", json={**body, "max_tokens": 3}, timeout=30)  # still serves
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_the_outbox_wakes_the_event_loop_once_per_flush():
    import asyncio

    from dflash_bench.engine.serving.api_server import Outbox

    async def main():
        box, aloop = Outbox(), asyncio.get_running_loop()
        queues = [asyncio.Queue() for _ in range(5)]
        sinks = [box.sink(q) for q in queues]
        wakeups = []
        real = aloop.call_soon_threadsafe
        aloop.call_soon_threadsafe = lambda fn, *a: (wakeups.append(fn.__name__), real(fn, *a))[1]
        try:
            for step in range(3):  # on the engine thread: every request's delta of a step, then one flush
                await asyncio.to_thread(lambda: [sink(step) for sink in sinks] and box.flush())
            await asyncio.to_thread(box.flush)  # nothing pending: no wake-up
            got = [[await q.get() for _ in range(3)] for q in queues]
        finally:
            del aloop.call_soon_threadsafe
        return got, wakeups.count("_deliver")  # to_thread's own futures also wake the loop

    got, wakeups = asyncio.run(main())
    assert got == [[0, 1, 2]] * 5 and wakeups == 3


@pytest.mark.parametrize("fast,mode,device,want", [
    (True, "ar", "cuda", "mixed"), (True, "ar", "cuda:1", "mixed"), (True, "dflash", "cuda", "first"),
    (False, "ar", "cuda", "first"), (True, "ar", "cpu", "first")])
def test_prefill_auto_rides_only_for_ar_on_the_fast_path_on_a_gpu(fast, mode, device, want):
    from dflash_bench.engine.config import resolve_prefill

    assert resolve_prefill("auto", fast=fast, mode=mode, device=device) == want
    assert resolve_prefill("first", fast=fast, mode=mode, device=device) == "first"  # a choice stands


def test_metrics_split_each_requests_time_as_vllm_does(random_pair):
    """/metrics gives finished requests' seconds by phase under vLLM's names (queue, prefill, decode), which the
    harness reads for every engine alike. Twelve requests on eight slots, the engine held still inside a step
    while all twelve are in: each of them is then waiting for a slot (queue) or decoding after its first token
    (decode), at least four of them waiting, for at least as long as the engine is held."""
    import concurrent.futures as cf

    from dflash_bench.metrics.phases import PHASES

    target, _ = random_pair
    entered, gate, held = threading.Event(), threading.Event(), 0.3
    with inproc_server(target, before_step=lambda: (entered.set(), gate.wait())) as (url, loop):
        def one(_):
            body = {"model": "tiny", "prompt": "hello there", "max_tokens": 6, "ignore_eos": True, "temperature": 0}
            return httpx.post(url + "/v1/completions", json=body, timeout=120).status_code

        with cf.ThreadPoolExecutor(12) as pool:
            sent = [pool.submit(one, i) for i in range(12)]
            end = time.time() + 60  # held in a step, with all twelve in the server
            while not (entered.is_set() and loop.num_running + loop.num_waiting + loop.inbox.qsize() == 12):
                assert time.time() < end, "the twelve requests never reached the server"
                time.sleep(0.02)
            time.sleep(held)
            gate.set()
            assert [f.result() for f in sent] == [200] * 12
        count = {p: metric(url, f"vllm:request_{p}_time_seconds_count") for p in PHASES}
        seconds = {p: metric(url, f"vllm:request_{p}_time_seconds_sum") for p in PHASES}
    assert count == dict.fromkeys(PHASES, 12)
    assert seconds["queue"] >= 4 * held and seconds["queue"] + seconds["decode"] >= 12 * held
    assert seconds["prefill"] > 0
