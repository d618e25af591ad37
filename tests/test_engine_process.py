"""`serve` with its engine in a process of its own (engine/serving/engine_process.py): a real server over a tiny real
pair streams what the reference engine decodes, /metrics hears the engine's counters across the pipe, and no
process outlives the server, whether it is stopped or killed; the event loop's coalescing of a request's waiting
deltas into one chunk."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("transformers")

from dflash_bench.engine.bookkeeping import Delta  # noqa: E402
from dflash_bench.engine.serving.api_server import coalesce  # noqa: E402
from dflash_bench.testing.tiny import make_tiny_pair  # noqa: E402
from launch_helpers import stop_harness  # noqa: E402
from dflash_bench.launch import free_port  # noqa: E402
from test_engine_server import metric, wait_ready  # noqa: E402

pytestmark = pytest.mark.engine
B, N = 4, 25
PROMPTS = [[5, 17, 33, 2], [9], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50], [7, 7, 7]]


# a greedy stream long enough to be cut or killed mid-way
LONG_STREAM = {"model": "tiny", "prompt": [5, 6], "max_tokens": 200, "ignore_eos": True, "stream": True, "temperature": 0}


def alive(pid: int) -> bool:
    """The process runs (a zombie, waiting for its parent to reap it, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def descendants(pid: int) -> set[int]:
    """Every process below `pid`, now."""
    out: set[int] = set()
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            kids = {int(k) for k in children.read_text().split()}
        except OSError:
            continue
        for k in kids:
            out |= {k} | descendants(k)
    return out


def gone_within(pids: set[int], seconds: float) -> set[int]:
    """Those of `pids` still running after up to `seconds` (a liveness bound, not a speed one)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and any(alive(p) for p in pids):
        time.sleep(0.2)
    return {p for p in pids if alive(p)}


def start(target: Path, drafter: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dflash_bench", "serve", "--model", str(target), "--draft",
                             str(drafter), "--port", str(port), "--device", "cpu", "--max-model-len", "256",
                             "--max-slots", "4", "--dtype", "float64", "--served-model-name", "tiny", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
    except BaseException:
        stop_harness(proc)
        raise
    return proc, url


def stream_ids(url: str, prompt: list[int]) -> list[int]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": N, "temperature": 0, "ignore_eos": True, "stream": True,
            "logprobs": 0, "return_tokens_as_token_ids": True}
    ids: list[int] = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[len("data: "):])["choices"][0]
                ids += [int(t.removeprefix("token_id:")) for t in (choice.get("logprobs") or {}).get("tokens", [])]
    return ids


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_tiny_pair(tmp_path_factory.mktemp("proc"), seed=1, block_size=B)


@pytest.fixture(scope="module")
def reference_ids(pair) -> list[list[int]]:
    from dflash_bench.engine.build import build
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.reference.decode import generate
    from dflash_bench.engine.sampling_params import SamplingParams

    target, _ = pair
    ref = build(EngineConfig(str(target), mode="ar", max_slots=4, max_model_len=256, dtype="float64", device="cpu"))
    return [s.out for s in generate(ref, PROMPTS, SamplingParams(max_tokens=N, ignore_eos=True))]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ar", "dflash"])
def test_served_engine_process_streams_what_the_reference_decodes_and_stops_with_the_server(pair, reference_ids,
                                                                                            mode):
    """Four requests at once through the HTTP server and the engine's process (the fast path, the reference engine
    AR at greedy as truth); /metrics counts what the engine's process did; SIGTERM (what launch/ and Ctrl-C send the
    group) ends the server and, through it, every process it started."""
    target, drafter = pair
    proc, url = start(target, drafter, "--fast", "--mode", mode)
    try:
        below = descendants(proc.pid)
        assert below, "the engine runs in a process of the server's"
        with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
            got = list(pool.map(lambda p: stream_ids(url, p), PROMPTS))
        assert got == reference_ids
        assert metric(url, "vllm:generation_tokens_total") == len(PROMPTS) * N
        assert metric(url, "dflash_bench:decode_steps_total") > 0
        assert metric(url, "vllm:num_requests_running") == 0
        assert ("vllm:spec_decode_num_drafts_total" in httpx.get(url + "/metrics").text) == (mode == "dflash")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
    finally:
        stop_harness(proc)
    assert not gone_within(below, 30), "a process the server started outlived it"


@pytest.mark.slow
def test_the_engine_process_ends_by_itself_when_the_server_is_killed(pair):
    """SIGKILL leaves the server no way to stop its engine: the engine's process sees its requests pipe close and
    ends, with nothing left running; a stream cut mid-way frees its slot first."""
    target, drafter = pair
    proc, url = start(target, drafter, "--fast", "--mode", "ar")
    try:
        below = descendants(proc.pid)
        assert below
        with httpx.stream("POST", url + "/v1/completions", json=LONG_STREAM, timeout=60) as r:
            assert r.status_code == 200
            next(r.iter_lines())
        end = time.monotonic() + 30
        while metric(url, "vllm:num_requests_running") and time.monotonic() < end:
            time.sleep(0.1)
        assert metric(url, "vllm:num_requests_running") == 0  # the abort crossed the pipe, its drop came back
        proc.kill()
        proc.wait(timeout=30)
    finally:
        stop_harness(proc)
    assert not gone_within(below, 60), "the engine's process outlived a killed server"


@pytest.mark.slow
def test_a_stream_in_flight_ends_with_a_sentence_when_the_engine_process_dies(pair):
    """The engine's process killed mid-stream: the request's stream ends with an error event (not a wait forever)
    and the server stops by itself, non-zero, leaving nothing behind."""
    target, drafter = pair
    proc, url = start(target, drafter, "--fast", "--mode", "ar")
    try:
        [engine] = [p for p in descendants(proc.pid) if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text()]
        events = []
        with httpx.stream("POST", url + "/v1/completions", json=LONG_STREAM, timeout=60) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    if not events:
                        os.kill(engine, signal.SIGKILL)
                    events.append(line[len("data: "):])
        assert events[-1] == "[DONE]" and "the engine's process ended by itself" in events[-2]
        below = descendants(proc.pid)
        assert proc.wait(timeout=90) != 0
    finally:
        stop_harness(proc)
    assert not gone_within(below, 30)


def test_serve_refuses_what_the_engine_process_cannot_build_in_one_sentence(pair, tmp_path):
    """A failure inside the engine's process (a drafter folder that holds no model) reaches the user as the server's
    one sentence, exit code 2, and no process is left."""
    target, _ = pair
    (tmp_path / "empty").mkdir()
    out = subprocess.run([sys.executable, "-m", "dflash_bench", "serve", "--model", str(target), "--draft",
                          str(tmp_path / "empty"), "--mode", "dflash", "--fast", "--device", "cpu", "--port",
                          str(free_port())], capture_output=True, text=True, timeout=180)
    assert out.returncode == 2 and "error:" in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]


def test_coalesce_merges_the_deltas_waiting_and_keeps_an_error_for_after():
    def delta(ids: list[int], n: int, finish: str | None = None) -> Delta:
        return Delta("r", ids, "".join(f"<{i}>" for i in ids), 3, n, finish, logprobs=[(i, -0.5, []) for i in ids])

    q: asyncio.Queue = asyncio.Queue()
    first = delta([1], 1)
    assert coalesce(first, q) == (first, None)  # nothing waits: the delta as it came
    for d in (delta([2, 3], 3), delta([4], 4)):
        q.put_nowait(d)
    err = RuntimeError("boom")
    q.put_nowait(err)
    q.put_nowait(delta([5], 5))
    got, error = coalesce(first, q)
    assert got.token_ids == [1, 2, 3, 4] and got.text == "<1><2><3><4>" and got.completion_tokens == 4
    assert [e[0] for e in got.logprobs or []] == [1, 2, 3, 4] and error is err and q.qsize() == 1
    q = asyncio.Queue()
    end, after = delta([6], 6, finish="length"), delta([7], 7)
    q.put_nowait(end)
    q.put_nowait(after)
    got, error = coalesce(delta([5], 5), q)  # nothing past the finish is taken
    assert got.token_ids == [5, 6] and got.finish == "length" and error is None and q.get_nowait() is after


def test_a_steps_results_cross_the_pipe_as_they_were():
    """What the engine's process writes for a step (`encode`) reads back (`decode`) as the same deltas, logprobs
    and an error's sentence included."""
    from dflash_bench.engine.serving.engine_process import decode, encode

    a = Delta("a", [5, 6], "héllo", 3, 2, None, logprobs=[(5, -0.25, [(5, -0.25), (9, -2.5)]), (6, -1.0, [])],
              steps=1, accepted=1, drafted=3, cached_tokens=7)
    b = Delta("b", [2], "", 7, 9, "length")
    got = decode(encode([("a", a), ("b", b), ("c", ValueError("the prompt is empty"))]))
    assert [rid for rid, _ in got] == ["a", "b", "c"]
    (_, ga), (_, gb), (_, gc) = got
    assert isinstance(ga, Delta) and isinstance(gb, Delta) and gb == b
    assert (ga.token_ids, ga.text, ga.finish, ga.steps, ga.accepted, ga.drafted, ga.cached_tokens) == (
        [5, 6], "héllo", None, 1, 1, 3, 7)
    assert [(t, lp, [tuple(x) for x in top]) for t, lp, top in ga.logprobs or []] == a.logprobs
    assert isinstance(gc, RuntimeError) and str(gc) == "the prompt is empty"


def test_every_field_of_a_delta_crosses_the_pipe():
    """A field added to Delta must be added to `encode` too: a Delta whose every field differs from its default
    (each a value of its own) reads back equal, so a field `encode` leaves out fails here, not in a served usage."""
    import dataclasses

    from dflash_bench.engine.serving.engine_process import decode, encode

    values = {"req_id": "r", "token_ids": [3, 4], "text": "ab", "finish": "stop", "logprobs": [[3, -0.5, [[3, -0.5]]]]}
    ints = iter(range(11, 100))
    d = Delta(**{f.name: values[f.name] if f.name in values else next(ints) for f in dataclasses.fields(Delta)})
    assert all(getattr(d, f.name) != f.default for f in dataclasses.fields(Delta) if f.default is not dataclasses.MISSING)
    [(rid, got)] = decode(encode([("r", d)]))
    assert rid == "r" and got == d


def test_the_counters_cross_the_pipe_when_a_request_ends_when_idle_and_every_interval():
    """A step's results carry the loop's counters only when /metrics must see them: a request finished or failed
    in it, nothing runs any more, or COUNTERS_EVERY_S has passed; a step of unfinished rows soon after leaves them."""
    from dflash_bench.engine.serving.engine_process import COUNTERS_EVERY_S, counters_due

    going, done = Delta("a", [5], "x", 3, 1, None), Delta("b", [2], "", 7, 9, "length")
    soon = COUNTERS_EVERY_S / 10
    assert not counters_due([("a", going)], running=2, since_s=soon)
    assert not counters_due([], running=2, since_s=soon)
    assert counters_due([("a", going), ("b", done)], running=1, since_s=soon)
    assert counters_due([("c", RuntimeError("the prompt is empty"))], running=1, since_s=soon)
    assert counters_due([], running=0, since_s=soon)  # an abort dropped the last request
    assert counters_due([("a", going)], running=2, since_s=COUNTERS_EVERY_S)
