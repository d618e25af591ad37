"""The fast engine served (engine/fast/engine.py under engine/serving/loop.py and `serve --fast`): the decode loop like the
reference engine's, requests arriving mid-decode, first tokens from later steps, prefill before stepping, the
pipelined and the mixed-prefill engines serving what step by step serves; synthetic acceptance over HTTP."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from dflash_bench.engine.build import build  # noqa: E402
from dflash_bench.engine.reference.decode import generate as ref_generate  # noqa: E402
from dflash_bench.engine.sampling_params import SamplingParams  # noqa: E402
from dflash_bench.testing.tiny import make_tiny_pair  # noqa: E402
from fast_helpers import ARCHS, B, MAX_LEN, N, SLOTS, serve_requests, tiny_engines, tiny_prompts  # noqa: E402

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module", params=ARCHS)
def setup(request, tmp_path_factory):
    return tiny_engines(request.param, tmp_path_factory)


def test_fast_engine_serves_the_decode_loop_like_the_reference(setup, tmp_path):
    from dflash_bench.engine.config import EngineConfig

    ar, df = setup
    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    fast = build(EngineConfig.from_options(str(target), str(drafter), max_slots=SLOTS, max_model_len=MAX_LEN, dtype="float64", device="cpu", fast=True))
    ref = build(EngineConfig(str(target), mode="ar", max_slots=SLOTS, max_model_len=MAX_LEN, dtype="float64", device="cpu"))
    ps = tiny_prompts(ref.tok, 4)
    sp = SamplingParams(max_tokens=N, ignore_eos=True, logprobs=2)
    # the width chooser sees modelled step times, not the clock's (the machine's load must not decide the widths
    # asserted below): a CPU step that costs as much per verified token as an AR step
    observe = fast.core.probe.chooser.observe
    fast.core.probe.chooser.observe = lambda bucket, w, accepted, seconds: observe(bucket, w, accepted, 1e-3 * w)
    want, got = ref_generate(ref, ps, sp), ref_generate(fast, ps, sp)
    assert [s.out for s in got] == [s.out for s in want]
    assert fast.stats.drafts > 0 and fast.stats.generation_tokens == ref.stats.generation_tokens
    widths = fast.stats.widths  # tokens verified per row -> row-steps (the /metrics verify-width counter)
    # on a CPU a row-step of width 1 (the anchor alone) is no draft: a random drafter accepts ~nothing, so the
    # adaptive engine mostly stops drafting
    # (a last step's positions past max_tokens are verified but not drafts: metrics/definitions.py tau)
    assert sum(widths.values()) >= fast.stats.drafts + widths.get(1, 0) and set(widths) <= {1, 2, 3, 4, B}
    assert widths.get(1, 0) > fast.stats.drafts
    assert sum((w - 1) * n for w, n in widths.items()) >= fast.stats.draft_tokens
    assert fast.free_slots and sorted(fast.free_slots) == list(range(SLOTS))
    with pytest.raises(ValueError, match="greedily"):
        fast.add("x", ps[0], SamplingParams(temperature=0.7))


def test_synthetic_acceptance_needs_benchmark_only(tmp_path):
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.errors import UserError

    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    with pytest.raises(UserError, match="benchmark-only"):
        build(EngineConfig.from_options(str(target), str(drafter), max_slots=2, max_model_len=64, device="cpu", synthetic_acceptance=3.0, fast=True))
    eng = build(EngineConfig.from_options(str(target), str(drafter), max_slots=2, max_model_len=64, device="cpu", synthetic_acceptance=3.0,
                            benchmark_only=True, fast=True))
    assert eng.synthetic_acceptance == 3.0


@pytest.mark.slow
def test_serve_fast_labels_synthetic_acceptance_over_http(tmp_path):
    import subprocess
    import sys

    import httpx
    from test_engine_server import cli_server  # the same start/ready/terminate as the engine server tests

    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    base = [sys.executable, "-m", "dflash_bench", "serve", "--model", str(target), "--draft", str(drafter),
            "--device", "cpu", "--max-model-len", "256", "--max-slots", "4", "--served-model-name", "tiny", "--fast"]
    refused = subprocess.run(base + ["--synthetic-acceptance", "3"], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--benchmark-only" in refused.stderr + refused.stdout
    assert "Traceback" not in refused.stderr

    with cli_server("--model", str(target), "--draft", str(drafter), "--served-model-name", "tiny", "--fast",
                    "--synthetic-acceptance", "3", "--benchmark-only") as url:
        body = {"model": "tiny", "prompt": "the cat sat", "max_tokens": 24, "ignore_eos": True, "temperature": 0}
        r = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
        assert r["synthetic_acceptance"] == 3.0 and r["usage"]["completion_tokens"] == 24
        with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=60) as resp:
            chunks = [line for line in resp.iter_lines() if line.startswith("data: {")]
        assert chunks and all('"synthetic_acceptance":3.0' in c for c in chunks)
        text = httpx.get(url + "/metrics").text
        assert "dflash_bench:synthetic_acceptance{" in text
        drafts = sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("vllm:spec_decode_num_drafts_total{"))
        assert drafts > 0
        widths = {int(x.split('width="')[1].split('"')[0]): float(x.rsplit(" ", 1)[1]) for x in text.splitlines()
                  if x.startswith("dflash_bench:verify_width_row_steps_total{")}
        # --verify-width auto, the default; on a CPU width 1 (the anchor alone) too, which is no draft; a
        # request's last step with one token of room left verifies a block but drafts nothing
        # (bookkeeping.stepped), so at most one such step per request (two requests above)
        extra = sum(widths.values()) - drafts - widths.get(1, 0)
        assert 0 <= extra <= 2 and set(widths) <= {1, 2, 3, 4, B}
        bad = httpx.post(url + "/v1/completions", json={**body, "temperature": 0.7}, timeout=60)
        assert bad.status_code == 400 and "greedily" in bad.json()["message"]


def _submit(loop, req_id: str, prompt, sp, got: dict, done, then=None, after: int = 1) -> None:
    """Submit a request whose deltas go to `got[req_id]`; `then()` runs on the engine thread right after its
    `after`-th delta (so a request it submits arrives at a known point of the decode); `done` is set at the end."""
    seen = [0]

    def sink(d) -> None:
        if isinstance(d, Exception):
            got[req_id] = d
            done.set()
            return
        got.setdefault(req_id, []).extend(d.token_ids)
        seen[0] += 1
        if then is not None and seen[0] == after:
            then()
        if d.finish:
            done.set()
    loop.submit(req_id, prompt, sp, sink)


@pytest.mark.parametrize("mode", ["dflash", "ar-mixed"])
def test_serve_fast_gives_requests_arriving_mid_decode_what_they_get_alone(tmp_path, mode):
    """The server's batching thread over the stepping-ahead fast engine, two slots. Request 1 is submitted from
    request 0's second delta and request 2 from request 1's first, on the engine thread, so they arrive while
    0 decodes (2 when no slot is free), whatever the machine's load. The loop's event log proves when each
    joined; each request gets the very tokens it gets alone. `ar-mixed`: `serve --prefill mixed`, where both
    ride in request 0's steps."""
    import threading

    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.serving.loop import EngineLoop

    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    mixed = mode == "ar-mixed"
    engine = build(EngineConfig.from_options(str(target), None if mixed else str(drafter), mode=mode[:2] if mixed else mode,
                               max_slots=2, max_model_len=MAX_LEN, dtype="float64", device="cpu", prefill="mixed" if mixed else "first", fast=True))
    ps = tiny_prompts(engine.tok, 3)
    sps = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (37, 20, 28)]
    loop = EngineLoop(engine).start()
    alone: dict = {}
    together: dict = {}
    try:
        for i in range(3):
            done = threading.Event()
            _submit(loop, f"a{i}", ps[i], sps[i], alone, done)
            assert done.wait(120)
        dones = [threading.Event() for _ in range(3)]
        third = lambda: _submit(loop, "t2", ps[2], sps[2], together, dones[2])  # noqa: E731
        second = lambda: _submit(loop, "t1", ps[1], sps[1], together, dones[1], then=third)  # noqa: E731
        _submit(loop, "t0", ps[0], sps[0], together, dones[0], then=second, after=2)
        assert all(d.wait(120) for d in dones)
    finally:
        loop.stop()
    assert [together[f"t{i}"] for i in range(3)] == [alone[f"a{i}"] for i in range(3)]
    assert [len(alone[f"a{i}"]) for i in range(3)] == [sp.max_tokens for sp in sps]
    ev = {(e.kind, e.req_id): e for e in loop.events}
    t0, t1, t2 = (ev["admit", f"t{i}"] for i in range(3))
    assert t0.running == () and t1.running == ("t0",) and t1.step > t0.step  # 1 joined 0 mid-decode
    # 2, submitted at 1's first token, waited for the slot 1 left, then joined 0, still decoding
    assert t2.step >= ev["finish", "t1"].step > t1.step + 1 and t2.running == ("t0",)
    assert ev["finish", "t0"].step > t2.step
    assert engine.mixed_prefills == (2 if mixed else 0)


class _FirstTokensLater:
    """A fast engine whose prompts ride in later steps (`mixed`): `add_many` answers None for a request, and its
    first token comes out of a later `step`. Here the prefill is done at once and its delta held, for every mode."""

    def __init__(self, engine):
        self.engine, self.held = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def add_many(self, reqs):
        got = self.engine.add_many(reqs)
        self.held += [d for _, d in got]
        return [(s, None) for s, _ in got]

    def step(self, seqs):
        held, self.held = self.held, []
        waiting = {d.req_id for d in held}
        live = [s for s in seqs if s.req_id not in waiting and not s.finish]
        return held + (self.engine.step(live) if live else [])


def test_the_loop_takes_a_first_token_from_a_later_step(tmp_path):
    """An engine whose prompts ride in its steps answers None at admission: the loop keeps the request in the batch
    without emitting, sends its first token when a step brings it, and finishes a request whose first token is
    its last (max_tokens 1) without stepping it; every request gets what it gets alone."""
    import threading

    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.serving.loop import EngineLoop

    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    engine = build(EngineConfig.from_options(str(target), str(drafter), max_slots=3, max_model_len=MAX_LEN, dtype="float64", device="cpu", fast=True))
    ps = tiny_prompts(engine.tok, 3)
    sps = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (30, 1, 17)]
    alone = [ref_generate(engine, [p], sp)[0].out for p, sp in zip(ps, sps)]
    loop = EngineLoop(_FirstTokensLater(engine)).start()
    got: dict = {}
    dones = [threading.Event() for _ in ps]
    try:
        third = lambda: _submit(loop, "r2", ps[2], sps[2], got, dones[2])  # noqa: E731
        second = lambda: _submit(loop, "r1", ps[1], sps[1], got, dones[1], then=third)  # noqa: E731
        _submit(loop, "r0", ps[0], sps[0], got, dones[0], then=second, after=2)
        assert all(d.wait(120) for d in dones)
    finally:
        loop.stop()
    assert [got[f"r{i}"] for i in range(3)] == alone and [len(o) for o in alone] == [30, 1, 17]
    assert not loop.running and sorted(engine.free_slots) == [0, 1, 2]
    ev = {(e.kind, e.req_id): e for e in loop.events}
    assert ev["admit", "r1"].running == ("r0",)  # admitted mid-decode, its token a step later
    assert ev["finish", "r1"].step > ev["admit", "r1"].step


def _burst(tmp_path, monkeypatch, n: int):
    """A fast engine of 8 slots whose prefill groups hold two of the `n` 10-token prompts, the prompts, their
    sampling (12 tokens, ignore_eos) and what each gets alone."""
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.fast.scheduling import scheduler as scheduler_mod

    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    engine = build(EngineConfig.from_options(str(target), str(drafter), max_slots=8, max_model_len=MAX_LEN, dtype="float64", device="cpu", fast=True))
    ps = [list(range(40 + i, 50 + i)) for i in range(n)]
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    alone = [ref_generate(engine, [p], sp)[0].out for p in ps]
    monkeypatch.setattr(scheduler_mod, "PREFILL_TOKENS", 20)
    return engine, ps, sp, alone


def test_prefill_first_fills_the_batch_before_it_steps(tmp_path, monkeypatch):
    """Five requests waiting at once, prefill groups of two, and a sixth that arrives during the
    first group's prefill (submitted from r0's first token, on the engine thread): every group, the latecomer's
    too, is prefilled before the first step, and every request gets the tokens it gets alone."""
    import threading

    from dflash_bench.engine.serving.loop import EngineLoop

    engine, ps, sp, alone = _burst(tmp_path, monkeypatch, 6)
    loop = EngineLoop(engine)
    got: dict = {}
    dones = [threading.Event() for _ in ps]
    late = lambda: _submit(loop, "r5", ps[5], sp, got, dones[5])  # noqa: E731
    _submit(loop, "r0", ps[0], sp, got, dones[0], then=late)
    for i in range(1, 5):
        _submit(loop, f"r{i}", ps[i], sp, got, dones[i])
    loop.start()
    try:
        assert all(d.wait(120) for d in dones)
    finally:
        loop.stop()
    assert loop.groups == 3  # [r0 r1] [r2 r3] [r4 r5]: the latecomer shares the last group
    assert [got[f"r{i}"] for i in range(6)] == alone
    admits = [e for e in loop.events if e.kind == "admit"]
    assert [e.req_id for e in admits] == [f"r{i}" for i in range(6)] and {e.step for e in admits} == {0}


@pytest.mark.parametrize("mode", ["ar", "dflash"])
def test_the_pipelined_engine_serves_what_step_by_step_serves(tmp_path, mode):
    """The server's fast engine launches step k+1 before it reads step k. Requests arrive mid-flight, stop
    early on a stop token with a step ahead already launched (their slot is then taken by the next
    request), ask for logprobs (no step runs ahead while they run): the tokens and logprobs equal the
    step-by-step engine's, request by request."""
    from dflash_bench.engine.config import EngineConfig

    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    kw = dict(mode=mode, max_slots=3, max_model_len=MAX_LEN, dtype="float64", device="cpu")
    engines = [build(EngineConfig.from_options(str(target), str(drafter) if mode == "dflash" else None, step_ahead=ahead, **kw, fast=True))
               for ahead in (True, False)]
    ps = tiny_prompts(engines[0].tok, 12)
    # a prompt whose free-running output meets a token it has not produced before at position 3..20: that
    # token as a stop token ends it there, unforeseen, with a step ahead already in flight
    for p in ps[6:]:
        free = ref_generate(engines[1], [p], SamplingParams(max_tokens=N, ignore_eos=True))[0].out
        stop = next((i for i in range(3, 21) if free[i] not in free[:i]), None)
        if stop is not None:
            break
    assert stop is not None
    reqs = [(0, p, SamplingParams(max_tokens=N, ignore_eos=True, stop_token_ids=[free[stop]])),
            (0, ps[1], SamplingParams(max_tokens=N, ignore_eos=True)),
            (0, ps[2], SamplingParams(max_tokens=11, ignore_eos=True)),
            (0, ps[3], SamplingParams(max_tokens=N, ignore_eos=True)),  # waits, then takes a freed slot
            (3, ps[4], SamplingParams(max_tokens=N, ignore_eos=True, logprobs=2)),
            (9, ps[5], SamplingParams(max_tokens=7, ignore_eos=True)),
            (9, ps[0], SamplingParams(max_tokens=N, ignore_eos=True))]
    (piped, ahead), (plain, never) = (serve_requests(e, reqs) for e in engines)
    assert piped == plain
    assert len(piped[0][0]) == stop + 1 < N  # request 0 stopped early on its stop token
    assert max(ahead) == 1 and max(never) == 0  # the pipelined engine did run steps ahead
    for e in engines:
        assert sorted(e.free_slots) == [0, 1, 2] and not e.core.probe.running


def test_prompts_that_ride_in_steps_are_served_what_they_get_alone(tmp_path):
    """AR with `mixed`: prompts admitted while rows decode are prefilled by those rows' next steps (two that
    arrive together by one step; two steps in flight), a request that wants logprobs is prefilled alone, one
    stops early on a stop token: every request's tokens and logprobs equal the step-by-step engine's."""
    from dflash_bench.engine.config import EngineConfig

    target, _ = make_tiny_pair(tmp_path, seed=1, block_size=B)
    kw = dict(mode="ar", max_slots=8, max_model_len=MAX_LEN, dtype="float64", device="cpu")
    mixed = build(EngineConfig.from_options(str(target), prefill="mixed", **kw, fast=True))
    plain = build(EngineConfig.from_options(str(target), step_ahead=False, **kw, fast=True))
    carried: list[int] = []
    mixed.core.watch(lambda launch: carried.append(len(launch.plan.rides)) if launch.plan else None)
    ps = tiny_prompts(plain.tok, 8)
    free = ref_generate(plain, [ps[6]], SamplingParams(max_tokens=N, ignore_eos=True))[0].out
    stop = next(i for i in range(3, N) if free[i] not in free[:i])
    reqs = [(0, ps[0], SamplingParams(max_tokens=N, ignore_eos=True)),
            (2, ps[1], SamplingParams(max_tokens=9, ignore_eos=True)),
            (3, ps[2], SamplingParams(max_tokens=N, ignore_eos=True)),
            (3, ps[3], SamplingParams(max_tokens=N, ignore_eos=True, logprobs=2)),
            (5, ps[6], SamplingParams(max_tokens=N, ignore_eos=True, stop_token_ids=[free[stop]])),
            (6, ps[4], SamplingParams(max_tokens=12, ignore_eos=True)),
            (6, ps[7], SamplingParams(max_tokens=N, ignore_eos=True)),
            (20, ps[5], SamplingParams(max_tokens=N, ignore_eos=True))]
    (got, _), (want, _) = serve_requests(mixed, reqs), serve_requests(plain, reqs)
    assert got == want
    assert mixed.core.rode >= 5 and plain.core.rode == 0
    assert max(carried) == 2  # the two that arrived together rode in one step
    assert sorted(mixed.free_slots) == list(range(8)) and not mixed.core.probe.waiting
