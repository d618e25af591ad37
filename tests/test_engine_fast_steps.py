"""The fast path's scheduling on real tiny models, on the CPU: adaptive and narrow verify widths, a cut draft,
synthetic acceptance and the counters, steps launched ahead, prompts that ride in the running rows' steps; each
keeps the target's greedy output."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402

from dflash_bench.engine.build import build  # noqa: E402
from dflash_bench.engine.config import EngineConfig  # noqa: E402
from dflash_bench.engine.reference.decode import generate as ref_generate  # noqa: E402
from dflash_bench.synthetic import geometric_rate  # noqa: E402
from dflash_bench.errors import UserError  # noqa: E402
from dflash_bench.engine.fast.drive import generate  # noqa: E402
from dflash_bench.engine.fast.core import EngineCore  # noqa: E402
from dflash_bench.engine.sampling_params import SamplingParams  # noqa: E402
from dflash_bench.testing.tiny import make_tiny_pair  # noqa: E402
from fast_helpers import ARCHS, B, MAX_LEN, N, PATHS, SLOTS, fast_runner, tiny_engines, tiny_prompts, usable_path  # noqa: E402

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module", params=ARCHS)
def setup(request, tmp_path_factory):
    return tiny_engines(request.param, tmp_path_factory)


@pytest.mark.parametrize("kernels", PATHS)
def test_adaptive_width_keeps_the_targets_greedy_output(setup, kernels):
    """Verifying fewer drafts per step (chosen by load, or fixed narrow) commits only the target's own tokens."""
    kernels = usable_path(kernels)
    ar, df = setup
    prompts = tiny_prompts(ar.tok, 5)
    ref = [s.out for s in ref_generate(ar, prompts, SamplingParams(max_tokens=N, ignore_eos=True))]
    auto = fast_runner(df, verify_width="auto", kernels=kernels)
    assert auto.probe.widths == [1, 2, 3, 4, B]  # on a CPU: 1 (the anchor alone, no draft) and 3 too
    assert generate(auto, prompts, N) == ref
    assert set(auto.probe.chooser.chosen) == {1, 2, 3, 4, B}  # every width ran (each is timed before the choice trusts it)
    assert auto.timer.drafted < auto.timer.row_steps * (B - 1)  # some steps verified fewer than the whole block
    narrow = fast_runner(df, verify_width=2, kernels=kernels)
    assert generate(narrow, prompts, N) == ref
    assert narrow.timer.drafted == narrow.timer.row_steps and 1 <= narrow.timer.tau <= 2


@pytest.mark.parametrize("kernels", PATHS)
def test_a_step_of_the_anchor_alone_still_writes_the_drafters_context(setup, kernels):
    """Width 1 (a CPU's adaptive runner may take it under load) runs no draft and verifies the anchor alone: the
    target's tokens, no drafts counted, and the drafter's context K/V written as a drafting step writes it, so
    that a later draft reads what it would have read."""
    kernels = usable_path(kernels)
    ar, df = setup
    prompts = tiny_prompts(ar.tok, 2)
    ref = [s.out for s in ref_generate(ar, prompts, SamplingParams(max_tokens=N, ignore_eos=True))]
    alone, drafting = fast_runner(df, verify_width=1, kernels=kernels), fast_runner(df, verify_width=4, kernels=kernels)
    for p, want in zip(prompts, ref):  # one at a time: no step runs after the slot is released
        assert generate(alone, [p], N) == [want] == generate(drafting, [p], N)
        n = len(p) + N - B  # positions both runners committed
        for a, b in zip(alone.probe.drafter.cache.k + alone.probe.drafter.cache.v, drafting.probe.drafter.cache.k + drafting.probe.drafter.cache.v):
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

    kernels = usable_path(kernels)
    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    short = tmp_path / "short"
    shutil.copytree(drafter, short)
    cfg = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**cfg, "block_size": w}))
    kw = dict(max_slots=SLOTS, max_model_len=MAX_LEN, dtype="float64", device="cpu")
    ar = build(EngineConfig(str(target), mode="ar", **kw))
    ref = build(EngineConfig(str(target), str(short), mode="dflash", **kw))
    df = build(EngineConfig(str(target), str(drafter), mode="dflash", **kw))
    ref_drafts: list[list[int]] = []
    propose = ref.proposer.propose

    def recorded(seqs):
        tokens, logits = propose(seqs)
        ref_drafts.append(logits.argmax(-1)[0].tolist())
        return tokens, logits
    ref.proposer.propose = recorded

    def fast_drafts(runner: EngineCore, prompt: list[int]) -> tuple[list[int], list[list[int]]]:
        out, drafts = [runner.add(0, prompt)], []
        while len(out) < N:
            out += runner.step([0])[0]
            drafts.append(runner.probe.state.out[0, 1:w].tolist())
        runner.release(0)
        return out[:N], drafts

    differs = False
    for p in tiny_prompts(ar.tok, 3):
        want = ref_generate(ar, [p], SamplingParams(max_tokens=N, ignore_eos=True))[0].out
        ref_drafts.clear()
        assert ref_generate(ref, [p], SamplingParams(max_tokens=N, ignore_eos=True))[0].out == want
        out, drafts = fast_drafts(fast_runner(df, verify_width=w, cut_draft=True, kernels=kernels), p)
        assert out == want
        assert drafts == ref_drafts
        whole = fast_drafts(fast_runner(df, verify_width=w, kernels=kernels), p)
        assert whole[0] == want
        differs |= whole[1] != drafts
    assert differs  # the whole block's first drafts are not the cut block's


def test_synthetic_acceptance_of_a_narrow_verify_follows_the_same_curve(setup):
    """Synthetic acceptance is geometric by position: verifying w - 1 drafts gives 1 + sum_{k<w} a^k, not tau."""
    _, df = setup
    runner = fast_runner(df, synthetic_acceptance=3.5, seed=3, verify_width=3)
    generate(runner, tiny_prompts(df.tok, 8), 2 * N)
    a = geometric_rate(3.5, B)
    assert runner.timer.tau <= 3
    assert runner.timer.tau == pytest.approx(1 + a + a * a, abs=0.12)  # ~180 row-steps drawn from a seeded table


def test_synthetic_acceptance_hits_the_asked_mean(setup):
    _, df = setup
    runner = fast_runner(df, synthetic_acceptance=3.5, seed=3)
    draws = (runner.probe.synthetic_draws < 0.5).long().cumprod(-1).sum(-1)  # what each (step, row) would accept
    assert draws.max() <= B - 1
    assert 1 + draws.double().mean() == pytest.approx(3.5, abs=0.05)
    generate(runner, tiny_prompts(df.tok, 4), N)
    assert 2.5 < runner.timer.tau < 4.5  # the engine really took the drawn counts (real acceptance here is ~1.2)
    with pytest.raises(UserError):
        geometric_rate(B + 0.5, B)
    assert geometric_rate(float(B), B) == pytest.approx(1.0)


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


def test_pipelined_decode_matches_step_by_step_up_to_the_cache_bound(setup):
    ar, df = setup
    p = tiny_prompts(ar.tok, 2)
    n = MAX_LEN - max(map(len, p)) - B  # up to the last step the cache has room for
    ref = [s.out for s in ref_generate(ar, p, SamplingParams(max_tokens=n, ignore_eos=True))]
    runner = fast_runner(df)
    assert generate(runner, p, n) == ref
    tau = runner.timer.tau
    sync = fast_runner(df)
    assert generate(sync, p, n, pipeline=False) == ref
    assert tau == pytest.approx(sync.timer.tau)  # the steps run ahead for finished rows are not counted
    assert not runner.inflight and not runner.probe.running


def test_launch_declines_a_step_ahead_that_could_pass_the_cache(setup):
    _, df = setup
    runner = fast_runner(df)
    runner.add(0, [ord("a")] * (MAX_LEN - 2 * B + 1))
    assert runner.launch([0])  # room for one more block
    assert not runner.launch([0])  # a second could pass the cache if the first accepted a whole block
    assert runner.inflight == 1
    got = runner.collect()
    assert 1 <= len(got[0]) <= B and not runner.inflight
    runner.release(0)


def test_only_a_few_prompts_at_a_time_ride(tmp_path):
    """While rows decode, prompts wait to ride, a few a step, up to RIDE_QUEUE waiting; a burst of more, or a
    prompt behind a queue that long, is prefilled at once in one forward (riding, the rows of a long queue
    would start steps apart)."""
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.build import build

    RIDE_QUEUE = 3
    FEW = RIDE_QUEUE + 1
    target, _ = make_tiny_pair(tmp_path, seed=1, block_size=B)
    n = 2 + FEW + RIDE_QUEUE
    engine = build(EngineConfig.from_options(str(target), mode="ar", max_slots=n, max_model_len=MAX_LEN, dtype="float64",
                               device="cpu", prefill="mixed", fast=True))
    probe = engine.core.probe
    probe.ride_queue = RIDE_QUEUE
    ps = tiny_prompts(engine.tok, n)
    sp = SamplingParams(max_tokens=N, ignore_eos=True)
    [(_, first)] = engine.add_many([("0", ps[0], sp)])
    assert first is not None  # nothing decodes yet: prefilled at once
    burst = engine.add_many([(str(i), ps[i], sp) for i in range(1, 1 + FEW)])
    assert all(d is not None for _, d in burst) and not probe.waiting
    for i in range(1 + FEW, 1 + FEW + RIDE_QUEUE):  # one at a time: each waits to ride
        [(_, d)] = engine.add_many([(str(i), ps[i], sp)])
        assert d is None
    assert len(probe.waiting) == RIDE_QUEUE
    [(_, d)] = engine.add_many([("last", ps[-1], sp)])
    assert d is not None and len(probe.waiting) == RIDE_QUEUE  # behind a queue that long: at once


@pytest.mark.parametrize("kernels", PATHS)
def test_prompts_that_ride_in_a_step_decode_as_if_prefilled_alone(setup, kernels):
    """Prompts prefilled by the forward of the running rows' AR step: one into a slot that step's batch bucket
    covers as padding (slot 1 beside rows 0 and 2), later two of different lengths together, one inside the
    bucket and one past it, each time with a second step in flight behind: every row's tokens are greedy
    decoding's of its prompt alone."""
    ar, df = setup
    ps = tiny_prompts(ar.tok, 5)
    ref = [s.out for s in ref_generate(ar, ps, SamplingParams(max_tokens=N, ignore_eos=True))]
    runner = fast_runner(df, drafter=False, kernels=usable_path(kernels), prefill="mixed")
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
        for _ in range(runner.inflight):
            for s, toks in runner.collect().items():
                outs[s].extend(toks)
            for s, tok in runner.took.items():
                outs[s] = [tok]
    assert runner.rode == 3
    assert [outs[s][:N] for s in (0, 2, 1, 3, 5)] == ref
