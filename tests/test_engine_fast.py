"""The fast path (engine/fast): greedy AR == DFlash == the reference engine, on real tiny models, on the CPU.

The same code runs under CUDA graphs on a GPU (benchmarks/engine_speed.py checks it there too).
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402

from dflash_bench.engine.build import build_engine  # noqa: E402
from dflash_bench.engine.decode import generate as ref_generate  # noqa: E402
from dflash_bench.engine.fast.draft import FastDrafter  # noqa: E402
from dflash_bench.engine.fast.model import FastTarget  # noqa: E402
from dflash_bench.engine.fast.accept import synthetic_rate  # noqa: E402
from dflash_bench.engine.fast.drive import decode, generate  # noqa: E402
from dflash_bench.engine.fast.runner import FastRunner  # noqa: E402
from dflash_bench.engine.fast.timer import StepTimer  # noqa: E402
from dflash_bench.engine.sampling import SamplingParams  # noqa: E402
from dflash_bench.engine.tiny import make_tiny_pair  # noqa: E402

pytestmark = pytest.mark.engine
B, N, SLOTS, MAX_LEN = 6, 40, 8, 256


def _prompts(tok, n):
    rng = random.Random(n)
    words = "the cat sat on a mat while seven dogs ran past quickly".split()
    return [tok(" ".join(rng.choice(words) for _ in range(rng.randint(1, 30)))).input_ids for _ in range(n)]


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def setup(request, tmp_path_factory):
    target, drafter = make_tiny_pair(tmp_path_factory.mktemp(request.param), arch=request.param, seed=1, block_size=B)
    ar = build_engine(str(target), mode="ar", max_slots=SLOTS, max_len=MAX_LEN, dtype="float64")
    df = build_engine(str(target), str(drafter), mode="dflash", max_slots=SLOTS, max_len=MAX_LEN, dtype="float64")
    return ar, df


def _fast(df, *, drafter=True, kernels=None, **kw):
    """kernels None: the CPU kernels where a C compiler builds them (else the torch path); False: the torch path."""
    t = FastTarget(df.target.model, max_slots=SLOTS, max_len=MAX_LEN, kernels=kernels)
    d = FastDrafter(df.proposer.drafter, t.embed, t.head, max_slots=SLOTS, max_len=MAX_LEN,
                    kernels=kernels) if drafter else None
    runner = FastRunner(t, d, kv_block=16, **kw)
    StepTimer().attach(runner)  # its counts: tau, drafts verified, row-steps
    return runner


# the two ways a CPU runs a step: the C kernels (engine/fast/cpu_kernels.c) and plain torch ops
PATHS = [pytest.param("cpu", id="cpu-kernels"), pytest.param(False, id="torch-ops")]


def _path(kernels):
    if kernels == "cpu":
        from dflash_bench.engine.fast import cpu_kernels

        if cpu_kernels.load() is None:
            pytest.skip("no C compiler builds the CPU kernels")
    return kernels


@pytest.mark.parametrize("kernels", PATHS)
def test_fast_ar_and_dflash_equal_the_reference_engine(setup, kernels):
    kernels = _path(kernels)
    ar, df = setup
    prompts = _prompts(ar.tok, 5)
    ref = [s.out for s in ref_generate(ar, prompts, SamplingParams(max_tokens=N, ignore_eos=True))]
    d0, a0 = df.stats.drafts, df.stats.accepted
    ref_generate(df, prompts, SamplingParams(max_tokens=N, ignore_eos=True))
    ref_tau = 1 + (df.stats.accepted - a0) / (df.stats.drafts - d0)

    fast_ar = _fast(df, drafter=False, kernels=kernels)
    assert (fast_ar.t.kernels is not None) == (kernels == "cpu")
    assert generate(fast_ar, prompts, N) == ref
    fast_df = _fast(df, kernels=kernels)
    assert generate(fast_df, prompts, N) == ref
    # same drafts as the reference drafter, step by step: the per-step acceptance matches exactly, as the
    # bookkeeping both engines share counts it (metrics/definitions.py's tau: nothing past a request's end)
    from dflash_bench.engine.build import eos_ids
    from dflash_bench.engine.fast.engine import FastEngine

    engine = FastEngine(df.target.model, df.tok, df.proposer.drafter, eos_ids=eos_ids(df.target.model, df.tok),
                        max_slots=SLOTS, max_len=MAX_LEN, kv_block=16, adaptive=False, kernels=kernels is not False)
    assert [s.out for s in ref_generate(engine, prompts, SamplingParams(max_tokens=N, ignore_eos=True))] == ref
    assert 1 + engine.stats.accepted / engine.stats.drafts == pytest.approx(ref_tau)
    assert (engine.stats.drafts, engine.stats.accepted) == (df.stats.drafts - d0, df.stats.accepted - a0)


@pytest.mark.parametrize("kernels", PATHS)
def test_adaptive_width_keeps_the_targets_greedy_output(setup, kernels):
    """Verifying fewer drafts per step (chosen by load, or fixed narrow) commits only the target's own tokens."""
    kernels = _path(kernels)
    ar, df = setup
    prompts = _prompts(ar.tok, 5)
    ref = [s.out for s in ref_generate(ar, prompts, SamplingParams(max_tokens=N, ignore_eos=True))]
    auto = _fast(df, adaptive=True, kernels=kernels)
    assert auto.sched.widths == [1, 2, 3, 4, B]  # on a CPU: 1 (the anchor alone, no draft) and 3 too
    assert generate(auto, prompts, N) == ref
    assert set(auto.chooser.chosen) == {1, 2, 3, 4, B}  # every width ran (each is timed before the choice trusts it)
    assert auto.timer.drafted < auto.timer.row_steps * (B - 1)  # some steps verified fewer than the whole block
    narrow = _fast(df, width=2, kernels=kernels)
    assert generate(narrow, prompts, N) == ref
    assert narrow.timer.drafted == narrow.timer.row_steps and 1 <= narrow.timer.tau <= 2


@pytest.mark.parametrize("kernels", PATHS)
def test_a_step_of_the_anchor_alone_still_writes_the_drafters_context(setup, kernels):
    """Width 1 (a CPU's adaptive runner may take it under load) runs no draft and verifies the anchor alone: the
    target's tokens, no drafts counted, and the drafter's context K/V written as a drafting step writes it, so
    that a later draft reads what it would have read."""
    kernels = _path(kernels)
    ar, df = setup
    prompts = _prompts(ar.tok, 2)
    ref = [s.out for s in ref_generate(ar, prompts, SamplingParams(max_tokens=N, ignore_eos=True))]
    alone, drafting = _fast(df, width=1, kernels=kernels), _fast(df, width=4, kernels=kernels)
    for p, want in zip(prompts, ref):  # one at a time: no step runs after the slot is released
        assert generate(alone, [p], N) == [want] == generate(drafting, [p], N)
        n = len(p) + N - B  # positions both runners committed
        for a, b in zip(alone.d.cache.k + alone.d.cache.v, drafting.d.cache.k + drafting.d.cache.v):
            torch.testing.assert_close(a[0, :n], b[0, :n], rtol=1e-9, atol=1e-9)
    assert alone.timer.drafted == 0 and alone.timer.tau == 1 and alone.timer.row_steps == 2 * (N - 1)


@pytest.mark.parametrize("kernels", PATHS)
@pytest.mark.parametrize("w", [2, 4])
def test_a_cut_draft_drafts_what_the_reference_drafts_on_a_block_of_that_length(tmp_path, w, kernels):
    """`cut_draft`: a step of width w drafts only the w positions it verifies. Its drafts, step by step, are
    those of the reference drafter run on blocks of w (the same weights, block_size w), not those of the whole
    block cut after w - 1 drafts; the target's greedy output is unchanged."""
    import json
    import shutil

    kernels = _path(kernels)
    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    short = tmp_path / "short"
    shutil.copytree(drafter, short)
    cfg = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**cfg, "block_size": w}))
    kw = dict(max_slots=SLOTS, max_len=MAX_LEN, dtype="float64")
    ar = build_engine(str(target), mode="ar", **kw)
    ref = build_engine(str(target), str(short), mode="dflash", **kw)
    df = build_engine(str(target), str(drafter), mode="dflash", **kw)
    ref_drafts: list[list[int]] = []
    propose = ref.proposer.propose

    def recorded(seqs):
        tokens, logits = propose(seqs)
        ref_drafts.append(logits.argmax(-1)[0].tolist())
        return tokens, logits
    ref.proposer.propose = recorded

    def fast_drafts(runner: FastRunner, prompt: list[int]) -> tuple[list[int], list[list[int]]]:
        out, drafts = [runner.add(0, prompt)], []
        while len(out) < N:
            out += runner.step([0])[0]
            drafts.append(runner.state.out[0, 1:w].tolist())
        runner.release(0)
        return out[:N], drafts

    differs = False
    for p in _prompts(ar.tok, 3):
        want = ref_generate(ar, [p], SamplingParams(max_tokens=N, ignore_eos=True))[0].out
        ref_drafts.clear()
        assert ref_generate(ref, [p], SamplingParams(max_tokens=N, ignore_eos=True))[0].out == want
        out, drafts = fast_drafts(_fast(df, width=w, cut_draft=True, kernels=kernels), p)
        assert out == want
        assert drafts == ref_drafts
        whole = fast_drafts(_fast(df, width=w, kernels=kernels), p)
        assert whole[0] == want
        differs |= whole[1] != drafts
    assert differs  # the whole block's first drafts are not the cut block's


def test_synthetic_acceptance_of_a_narrow_verify_follows_the_same_curve(setup):
    """Synthetic acceptance is geometric by position: verifying w - 1 drafts gives 1 + sum_{k<w} a^k, not tau."""
    _, df = setup
    runner = _fast(df, synthetic_tau=3.5, seed=3, width=3)
    generate(runner, _prompts(df.tok, 8), 2 * N)
    a = runner.bodies.rate
    assert runner.timer.tau <= 3
    assert runner.timer.tau == pytest.approx(1 + a + a * a, abs=0.12)  # ~180 row-steps drawn from a seeded table


def test_ragged_batches_reuse_slots_and_cross_kv_buckets(setup):
    ar, df = setup
    runner = _fast(df)
    first = _prompts(ar.tok, 7)
    ref = [s.out for s in ref_generate(ar, first, SamplingParams(max_tokens=N, ignore_eos=True))]
    assert generate(runner, first, N) == ref
    # a second, smaller batch in the same slots: stale state of freed slots (now padding) must not leak in
    second = _prompts(ar.tok, 3)
    ref2 = [s.out for s in ref_generate(ar, second, SamplingParams(max_tokens=N, ignore_eos=True))]
    assert generate(runner, second, N) == ref2


@pytest.mark.parametrize("budget,way", [(8192, "eager"), (48, "eager"), (8192, "graph")])
def test_batched_prefill_equals_one_prompt_at_a_time(setup, monkeypatch, budget, way):
    """Prompts of different lengths prefilled together (right-padded, in any slot order; with a small token
    budget in several groups; or as the graphs of 2 and 3 rows a GPU runs, here run eagerly) leave the slots
    as one-by-one prefills do: first tokens, logits, the target's and the drafter's K/V over each prompt, and
    every token decoded after."""
    from dflash_bench.engine.fast import scheduler as scheduler_mod

    monkeypatch.setattr(scheduler_mod, "PREFILL_TOKENS", budget)
    ar, df = setup
    prompts = _prompts(ar.tok, 5)
    assert len({len(p) for p in prompts}) > 2
    ref = [s.out for s in ref_generate(ar, prompts, SamplingParams(max_tokens=N, ignore_eos=True))]
    slots = [3, 0, 4, 1, 2]
    alone, together = _fast(df, keep_logits=True), _fast(df, keep_logits=True)
    firsts = [alone.add(s, p) for s, p in zip(slots, prompts)]
    if way == "graph":  # the staged k-row inputs, as the captured graphs read them
        got = (together.prefill(slots[:2], prompts[:2], graphed=True)
               + together.prefill(slots[2:], prompts[2:], graphed=True))
    else:
        got = together.add_many(slots, prompts)
    assert got == firsts == [o[0] for o in ref]
    close = dict(rtol=1e-9, atol=1e-9)  # float64: other padding, other reduction order, nothing more
    for s, p in zip(slots, prompts):
        n = len(p)
        torch.testing.assert_close(together.logits[s, 0], alone.logits[s, 0], **close)
        for a, b in ((alone.t.cache, together.t.cache), (alone.d.cache, together.d.cache)):
            for i in range(len(a.k)):
                torch.testing.assert_close(b.k[i][s, :n], a.k[i][s, :n], **close)
                torch.testing.assert_close(b.v[i][s, :n], a.v[i][s, :n], **close)
    outs: list[list[int]] = [[] for _ in slots]
    for s, f in zip(slots, firsts):
        outs[s] = [f]
    decode(together, outs, N)
    assert [outs[s][:N] for s in slots] == ref


def test_new_prompt_lengths_leave_no_index_tensors_behind(setup):
    """The steps' index tensors are kept per shape (a graph reads them); prefills' are not, so serving prompts
    of ever new lengths does not grow memory (the GPU soak in engine_speed measures the same)."""
    from dflash_bench.engine.fast import model

    ar, df = setup
    runner = _fast(df)
    generate(runner, _prompts(ar.tok, 3), 12)
    kept = len(model._INDEX)
    assert kept > 0
    again = _prompts(ar.tok, 4)[1:]  # three other prompts, of other lengths
    assert {len(p) for p in again} - {len(p) for p in _prompts(ar.tok, 3)}
    generate(runner, again, 12)
    assert len(model._INDEX) == kept


def test_pipelined_decode_matches_step_by_step_up_to_the_cache_bound(setup):
    ar, df = setup
    p = _prompts(ar.tok, 2)
    n = MAX_LEN - max(map(len, p)) - B  # up to the last step the cache has room for
    ref = [s.out for s in ref_generate(ar, p, SamplingParams(max_tokens=n, ignore_eos=True))]
    runner = _fast(df)
    assert generate(runner, p, n) == ref
    tau = runner.timer.tau
    sync = _fast(df)
    assert generate(sync, p, n, pipeline=False) == ref
    assert tau == pytest.approx(sync.timer.tau)  # the steps run ahead for finished rows are not counted
    assert not runner.inflight and not runner.sched.lengths


def test_launch_declines_a_step_ahead_that_could_pass_the_cache(setup):
    _, df = setup
    runner = _fast(df)
    runner.add(0, [ord("a")] * (MAX_LEN - 2 * B + 1))
    assert runner.launch([0])  # room for one more block
    assert not runner.launch([0])  # a second could pass the cache if the first accepted a whole block
    assert len(runner.inflight) == 1
    got = runner.collect()
    assert 1 <= len(got[0]) <= B and not runner.inflight
    runner.release(0)


def test_predictable_pair_accepts_whole_blocks(tmp_path):
    target, drafter = make_tiny_pair(tmp_path, seed=2, block_size=B, predictable=True)
    df = build_engine(str(target), str(drafter), mode="dflash", max_slots=SLOTS, max_len=MAX_LEN, dtype="float32")
    runner = _fast(df)
    out = generate(runner, _prompts(df.tok, 2), N)
    assert runner.timer.tau == B
    assert all(o == [ord("a")] * N for o in out)


def test_synthetic_acceptance_hits_the_asked_mean(setup):
    _, df = setup
    runner = _fast(df, synthetic_tau=3.5, seed=3)
    draws = (runner.bodies.uniforms < runner.bodies.rate).long().cumprod(-1).sum(-1)  # what each (step, row) would accept
    assert draws.max() <= B - 1
    assert 1 + draws.double().mean() == pytest.approx(3.5, abs=0.05)
    generate(runner, _prompts(df.tok, 4), N)
    assert 2.5 < runner.timer.tau < 4.5  # the engine really took the drawn counts (real acceptance here is ~1.2)
    with pytest.raises(ValueError):
        synthetic_rate(B + 0.5, B)
    assert synthetic_rate(float(B), B) == pytest.approx(1.0)



def test_fast_engine_serves_the_decode_loop_like_the_reference(setup, tmp_path):
    from dflash_bench.engine.fast.engine import build_fast_engine

    ar, df = setup
    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    fast = build_fast_engine(str(target), str(drafter), max_slots=SLOTS, max_len=MAX_LEN, dtype="float64", device="cpu")
    ref = build_engine(str(target), mode="ar", max_slots=SLOTS, max_len=MAX_LEN, dtype="float64")
    ps = _prompts(ref.tok, 4)
    sp = SamplingParams(max_tokens=N, ignore_eos=True, logprobs=2)
    # the width chooser sees modelled step times, not the clock's (the machine's load must not decide the widths
    # asserted below): a CPU step that costs as much per verified token as an AR step
    observe = fast.runner.chooser.observe
    fast.runner.chooser.observe = lambda bucket, w, accepted, seconds: observe(bucket, w, accepted, 1e-3 * w)
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
    from dflash_bench.engine.fast.engine import build_fast_engine
    from dflash_bench.errors import UserError

    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    with pytest.raises(UserError, match="benchmark-only"):
        build_fast_engine(str(target), str(drafter), max_slots=2, max_len=64, device="cpu", synthetic_tau=3.0)
    eng = build_fast_engine(str(target), str(drafter), max_slots=2, max_len=64, device="cpu", synthetic_tau=3.0,
                            benchmark_only=True)
    assert eng.synthetic_tau == 3.0


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

    from dflash_bench.engine.fast.engine import build_fast_engine
    from dflash_bench.engine.loop import EngineLoop

    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    mixed = mode == "ar-mixed"
    engine = build_fast_engine(str(target), None if mixed else str(drafter), mode=mode[:2] if mixed else mode,
                               max_slots=2, max_len=MAX_LEN, dtype="float64", device="cpu", mixed=mixed)
    ps = _prompts(engine.tok, 3)
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

    from dflash_bench.engine.fast.engine import build_fast_engine
    from dflash_bench.engine.loop import EngineLoop

    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    engine = build_fast_engine(str(target), str(drafter), max_slots=3, max_len=MAX_LEN, dtype="float64", device="cpu")
    ps = _prompts(engine.tok, 3)
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


def _burst(tmp_path, n: int):
    """A fast engine of 8 slots whose prefill groups hold two of the `n` 10-token prompts, the prompts, their
    sampling (12 tokens, ignore_eos) and what each gets alone."""
    from dflash_bench.engine.fast.engine import build_fast_engine

    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    engine = build_fast_engine(str(target), str(drafter), max_slots=8, max_len=MAX_LEN, dtype="float64", device="cpu")
    ps = [list(range(40 + i, 50 + i)) for i in range(n)]
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    alone = [ref_generate(engine, [p], sp)[0].out for p in ps]
    engine.prefill_tokens = 20
    return engine, ps, sp, alone


def test_prefill_first_fills_the_batch_before_it_steps(tmp_path):
    """Five requests waiting at once, prefill groups of two, and a sixth that arrives during the
    first group's prefill (submitted from r0's first token, on the engine thread): every group, the latecomer's
    too, is prefilled before the first step, and every request gets the tokens it gets alone."""
    import threading

    from dflash_bench.engine.loop import EngineLoop

    engine, ps, sp, alone = _burst(tmp_path, 6)
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


def test_a_paused_row_resumes_where_it_stopped(setup):
    """Rows of the batch bucket that are not stepped (padding, paused) keep anchor, position and context."""
    ar, df = setup
    ps = _prompts(ar.tok, 3)
    ref = [s.out for s in ref_generate(ar, ps, SamplingParams(max_tokens=N, ignore_eos=True))]
    for runner in (_fast(df, drafter=False), _fast(df)):
        outs = [[runner.add(i, p)] for i, p in enumerate(ps)]
        for step in range(200):
            live = [i for i in range(3) if len(outs[i]) < N and not (i == 1 and 2 <= step < 6)]
            if not live:
                break
            got = runner.step(live)
            for i in live:
                outs[i].extend(got[i])
        assert [o[:N] for o in outs] == ref


def _serve(engine, reqs: list[tuple[int, list[int], SamplingParams]]) -> tuple[dict, list[int]]:
    """A decode loop like the server's: request i arrives at step `at` (when a slot is free), finished
    requests give their slot back at once. Returns (tokens and logprobs per request, steps in flight after
    each step() call)."""
    pending = sorted(enumerate(reqs), key=lambda r: r[1][0])
    running, seqs, lps, inflight, t = [], {}, {}, [], 0
    while pending or running:
        while pending and pending[0][1][0] <= t and engine.free_slots:
            i, (_, prompt, sp) = pending.pop(0)
            seq, d = engine.add(str(i), prompt, sp)  # d None: its first token comes from a step
            seqs[i], lps[i] = seq, list(d.logprobs or []) if d else []
            running.append(seq)
        for d in engine.step(running) if running else []:
            lps[int(d.req_id)] += d.logprobs or []
        inflight.append(len(engine.runner.inflight))
        for seq in [q for q in running if q.finish]:
            engine.release(seq)
            running.remove(seq)
        t += 1
    return {i: (seqs[i].out, lps[i]) for i in seqs}, inflight


@pytest.mark.parametrize("mode", ["ar", "dflash"])
def test_the_pipelined_engine_serves_what_step_by_step_serves(tmp_path, mode):
    """The server's fast engine launches step k+1 before it reads step k. Requests arrive mid-flight, stop
    early on a stop token with a step ahead already launched (their slot is then taken by the next
    request), ask for logprobs (no step runs ahead while they run): the tokens and logprobs equal the
    step-by-step engine's, request by request."""
    from dflash_bench.engine.fast.engine import build_fast_engine

    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    kw = dict(mode=mode, max_slots=3, max_len=MAX_LEN, dtype="float64", device="cpu")
    engines = [build_fast_engine(str(target), str(drafter) if mode == "dflash" else None, step_ahead=ahead, **kw)
               for ahead in (True, False)]
    ps = _prompts(engines[0].tok, 12)
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
    (piped, ahead), (plain, never) = (_serve(e, reqs) for e in engines)
    assert piped == plain
    assert len(piped[0][0]) == stop + 1 < N  # request 0 stopped early on its stop token
    assert max(ahead) == 1 and max(never) == 0  # the pipelined engine did run steps ahead
    for e in engines:
        assert sorted(e.free_slots) == [0, 1, 2] and not e.runner.sched.lengths


def test_prompts_that_ride_in_steps_are_served_what_they_get_alone(tmp_path):
    """AR with `mixed`: prompts admitted while rows decode are prefilled by those rows' next steps (two that
    arrive together by one step; two steps in flight), a request that wants logprobs is prefilled alone, one
    stops early on a stop token: every request's tokens and logprobs equal the step-by-step engine's."""
    from dflash_bench.engine.fast.engine import build_fast_engine

    target, _ = make_tiny_pair(tmp_path, seed=1, block_size=B)
    kw = dict(mode="ar", max_slots=8, max_len=MAX_LEN, dtype="float64", device="cpu")
    mixed = build_fast_engine(str(target), mixed=True, **kw)
    plain = build_fast_engine(str(target), step_ahead=False, **kw)
    carried, run = [], mixed.runner.run
    mixed.runner.run = lambda plan: carried.append(len(plan.rides)) or run(plan)
    ps = _prompts(plain.tok, 8)
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
    (got, _), (want, _) = _serve(mixed, reqs), _serve(plain, reqs)
    assert got == want
    assert mixed.runner.sched.rode >= 5 and plain.runner.sched.rode == 0
    assert max(carried) == 2  # the two that arrived together rode in one step
    assert sorted(mixed.free_slots) == list(range(8)) and not mixed.runner.sched.queue and not mixed.runner.sched.riding


def test_only_a_few_prompts_at_a_time_ride(tmp_path, monkeypatch):
    """While rows decode, prompts wait to ride, a few a step, up to RIDE_QUEUE waiting; a burst of more, or a
    prompt behind a queue that long, is prefilled at once in one forward (riding, the rows of a long queue
    would start steps apart)."""
    from dflash_bench.engine.fast.engine import build_fast_engine

    RIDE_QUEUE = 3
    FEW = RIDE_QUEUE + 1
    target, _ = make_tiny_pair(tmp_path, seed=1, block_size=B)
    n = 2 + FEW + RIDE_QUEUE
    engine = build_fast_engine(str(target), mode="ar", max_slots=n, max_len=MAX_LEN, dtype="float64",
                               device="cpu", mixed=True)
    queue = engine.runner.sched.queue
    monkeypatch.setattr(engine.runner.sched, "ride_queue", RIDE_QUEUE)
    ps = _prompts(engine.tok, n)
    sp = SamplingParams(max_tokens=N, ignore_eos=True)
    [(_, first)] = engine.add_many([("0", ps[0], sp)])
    assert first is not None  # nothing decodes yet: prefilled at once
    burst = engine.add_many([(str(i), ps[i], sp) for i in range(1, 1 + FEW)])
    assert all(d is not None for _, d in burst) and not queue
    for i in range(1 + FEW, 1 + FEW + RIDE_QUEUE):  # one at a time: each waits to ride
        [(_, d)] = engine.add_many([(str(i), ps[i], sp)])
        assert d is None
    assert len(queue) == RIDE_QUEUE
    [(_, d)] = engine.add_many([("last", ps[-1], sp)])
    assert d is not None and len(queue) == RIDE_QUEUE  # behind a queue that long: at once


@pytest.mark.parametrize("kernels", PATHS)
def test_prompts_that_ride_in_a_step_decode_as_if_prefilled_alone(setup, kernels):
    """Prompts prefilled by the forward of the running rows' AR step: one into a slot that step's batch bucket
    covers as padding (slot 1 beside rows 0 and 2), later two of different lengths together, one inside the
    bucket and one past it, each time with a second step in flight behind: every row's tokens are greedy
    decoding's of its prompt alone."""
    ar, df = setup
    ps = _prompts(ar.tok, 5)
    ref = [s.out for s in ref_generate(ar, ps, SamplingParams(max_tokens=N, ignore_eos=True))]
    runner = _fast(df, drafter=False, kernels=_path(kernels), mixed=True)
    outs = {0: [runner.add(0, ps[0])], 2: [runner.add(2, ps[1])]}
    rides = {3: [(1, ps[2])], 7: [(3, ps[3]), (5, ps[4])]}
    assert len(ps[3]) != len(ps[4])
    for step in range(3 * N):
        live = [s for s in outs if len(outs[s]) < N]
        if not live:
            break
        assert runner.launch(live, rides.get(step, []))
        if step in rides:  # a second step behind it, before its first token is read
            assert runner.launch(live)
        for _ in range(len(runner.inflight)):
            for s, toks in runner.collect().items():
                outs[s].extend(toks)
            for s, tok in runner.sched.took.items():
                outs[s] = [tok]
    assert runner.sched.rode == 3
    assert [outs[s][:N] for s in (0, 2, 1, 3, 5)] == ref


def test_a_failing_prefill_gives_every_slot_back(tmp_path):
    """add_many is all or nothing: a prompt the cache cannot hold fails, and no slot stays taken."""
    from dflash_bench.engine.fast.engine import build_fast_engine

    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    fast = build_fast_engine(str(target), str(drafter), max_slots=4, max_len=64, dtype="float32", device="cpu")
    sp = SamplingParams(max_tokens=4, ignore_eos=True)
    with pytest.raises(IndexError):
        fast.add_many([("ok", [1, 2, 3], sp), ("too-long", list(range(1, 100)), sp)])
    assert sorted(fast.free_slots) == [0, 1, 2, 3] and fast.runner.state.active.sum() == 0
    with pytest.raises(IndexError):
        fast.add("too-long", list(range(1, 100)), sp)
    assert sorted(fast.free_slots) == [0, 1, 2, 3]
    seqs = ref_generate(fast, [[1, 2, 3]] * 4, sp)  # every slot still serves
    assert all(len(s.out) == 4 for s in seqs)


@pytest.mark.parametrize("arch", ["qwen3", "mistral"])
def test_fast_target_applies_sliding_windows(tmp_path, arch):
    """Qwen3 with use_sliding_window (windowed upper layers) and Mistral (every layer): same tokens as HF."""
    import torch
    from transformers import AutoModelForCausalLM, MistralConfig, Qwen3Config

    from dflash_bench.engine.tiny import VOCAB_SIZE, make_tokenizer

    shape = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                 bos_token_id=None, eos_token_id=None, pad_token_id=256)
    if arch == "qwen3":
        cfg = Qwen3Config(**shape, use_sliding_window=True, sliding_window=6, max_window_layers=2)
    else:
        cfg = MistralConfig(**shape, sliding_window=6)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float64)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(25.0)
    model.save_pretrained(tmp_path)
    make_tokenizer().save_pretrained(tmp_path)
    ref = build_engine(str(tmp_path), mode="ar", max_slots=SLOTS, max_len=MAX_LEN, dtype="float64")
    prompts = _prompts(ref.tok, 3)
    want = [s.out for s in ref_generate(ref, prompts, SamplingParams(max_tokens=24, ignore_eos=True))]
    runner = FastRunner(FastTarget(ref.target.model, max_slots=SLOTS, max_len=MAX_LEN), kv_block=16)
    assert generate(runner, prompts, 24) == want


def test_fast_target_refuses_biases_it_would_drop():
    """Llama with attention_bias has an o_proj bias the fused forward does not add: refused, not run wrong."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from dflash_bench.errors import UserError

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, attention_bias=True)
    with pytest.raises(UserError, match="without --fast"):
        FastTarget(AutoModelForCausalLM.from_config(cfg), max_slots=1, max_len=16)

    from dflash_bench.engine.drafter import DFlashDrafter, DrafterConfig
    from dflash_bench.engine.tiny import drafter_config

    raw = drafter_config(cfg, layers=1, block_size=4, target_layer_ids=[0])
    drafter = DFlashDrafter(DrafterConfig.from_dict({**raw, "attention_bias": True, "dflash_config": {
        "mask_token_id": 63, "target_layer_ids": [0]}}))
    head = torch.zeros(64, 32)
    with pytest.raises(UserError, match="without --fast"):
        FastDrafter(drafter, head, head, max_slots=1, max_len=16)


@pytest.mark.parametrize("mode", ["ar", "dflash"])
def test_a_batched_steps_logprobs_are_each_rows_own(tmp_path, mode):
    """Rows of one step that want logprobs (top 0, 2 and 3, beside a row that wants none) get them in one pass
    over the step (`step_logprobs`); each token's logprob and top alternatives equal transformers' own
    forward over that request's prompt and output, position by position."""
    import torch
    from transformers import AutoModelForCausalLM

    from dflash_bench.engine.fast.engine import build_fast_engine

    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    engine = build_fast_engine(str(target), str(drafter) if mode == "dflash" else None, mode=mode, max_slots=4,
                               max_len=MAX_LEN, dtype="float64", device="cpu")
    ps = _prompts(engine.tok, 4)
    tops = [None, 0, 2, 3]
    got, _ = _serve(engine, [(0, p, SamplingParams(max_tokens=12, ignore_eos=True, logprobs=k)) for p, k in zip(ps, tops)])
    hf = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float64).eval()
    for i, (p, k) in enumerate(zip(ps, tops)):
        out, lps = got[i]
        if k is None:
            assert lps == []
            continue
        assert [t for t, _, _ in lps] == out and len(out) == 12
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([p + out])).logits[0, len(p) - 1: -1].double(), -1)
        for pos, (tok, lp, top) in enumerate(lps):
            assert lp == pytest.approx(ref[pos, tok].item(), abs=1e-5)
            assert len(top) == k
            if k:
                vals, idx = ref[pos].topk(k)
                assert [t for t, _ in top] == idx.tolist()
                assert [v for _, v in top] == pytest.approx(vals.tolist(), abs=1e-5)


def test_a_step_of_the_anchor_alone_is_no_draft_in_the_counters(setup):
    """vLLM's counters count drafts: a step that verified the anchor alone (width 1) adds a row-step of width 1
    and nothing to drafts, draft tokens or acceptance, so tau is the speculative steps' own."""
    from dflash_bench.engine.bookkeeping import Bookkeeping

    _, df = setup
    book = Bookkeeping(df.tok, eos_ids=[], block_size=B, slots=2, max_len=MAX_LEN, vocab_size=df.vocab_size)
    s = book.open("r", [1, 2, 3], SamplingParams(max_tokens=20, ignore_eos=True))
    logits = torch.zeros(B, 8)
    book.prefilled(s, 5, logits[:1])
    book.stepped(s, [7], logits[:1], width=1)
    book.stepped(s, [8, 9, 10], logits[:3], width=4)
    st = book.stats
    assert (st.drafts, st.draft_tokens, st.accepted, st.widths) == (1, 3, 2, {1: 1, 4: 1})
    assert s.out == [5, 7, 8, 9, 10]


def test_no_kernels_is_an_argument_that_runs_the_torch_ops(tmp_path):
    """`serve --fast --no-kernels` (`build_fast_engine(kernels=False)`): target and drafter run plain torch ops, and
    serve what the kernels serve."""
    from dflash_bench.engine.fast.engine import build_fast_engine

    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    kw = dict(max_slots=2, max_len=MAX_LEN, dtype="float64", device="cpu")
    plain = build_fast_engine(str(target), str(drafter), kernels=False, **kw)
    assert plain.runner.t.kernels is None and plain.runner.d.kernels is None
    sp = SamplingParams(max_tokens=20, ignore_eos=True)
    ps = _prompts(plain.tok, 2)
    assert ([s.out for s in ref_generate(plain, ps, sp)]
            == [s.out for s in ref_generate(build_fast_engine(str(target), str(drafter), **kw), ps, sp)])
