"""Tensor parallelism on the fast path, on the CPU: two gloo ranks (`serve --fast --tensor-parallel-size 2`, rank 1 a
process of its own) give the single-process engine's greedy tokens, step for step (every delta the same length: the
same accepted drafts), with the same logprobs, AR and DFlash, for a tiny Qwen3 pair and a tiny Gemma 4 pair whose
sliding and full layers split their KV heads differently (4 and 2: 2 and 1 a rank)."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("transformers")

from dflash_bench.engine.config import EngineConfig  # noqa: E402
from dflash_bench.engine.build import build  # noqa: E402
from dflash_bench.engine.sampling_params import SamplingParams  # noqa: E402
from dflash_bench.testing.tiny import make_tiny_pair  # noqa: E402
from dflash_bench.errors import UserError  # noqa: E402

pytestmark = pytest.mark.engine
B, SLOTS, MAX_LEN = 6, 4, 128
FAVOURED = range(97, 100)  # embedding rows made larger: drafts and targets agree now and then (ragged acceptance)


@pytest.fixture(scope="module", params=["qwen3", "gemma4"])
def pair(request, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    arch = request.param
    kv = (4, 2) if arch == "gemma4" else (2, 2)
    target, drafter = make_tiny_pair(tmp_path_factory.mktemp(arch), arch=arch, seed=1, block_size=B, layers=5,
                                     kv_heads=kv)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    with torch.no_grad():
        if model.config.tie_word_embeddings:
            model.get_input_embeddings().weight[FAVOURED] *= 3.0
        else:  # the drafter borrows the head: both lean to the same tokens
            model.get_input_embeddings().weight[FAVOURED] *= 6.0
            model.get_output_embeddings().weight[FAVOURED] *= 6.0
    model.save_pretrained(target)
    return str(target), str(drafter)


def _prompts(tok):
    texts = ["the cat sat on a mat", "seven dogs ran past quickly while the", "abc abc abc", "a"]
    return [tok(t).input_ids for t in texts]


def _decode(engine, prompts, max_tokens=24):
    """Every prompt's deltas (token lists, one per step that gave it tokens) and its logprobs, all admitted at once."""
    params = [SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=2 if i == 0 else None)
              for i in range(len(prompts))]
    seqs, deltas, lps = [], {}, {}
    for (seq, d), i in zip(engine.add_many([(str(i), p, sp) for i, (p, sp) in enumerate(zip(prompts, params))]),
                           range(len(prompts))):
        seqs.append(seq)
        deltas[i] = [list(d.token_ids)] if d else []
        lps[i] = list(d.logprobs or []) if d else []
    running = list(seqs)
    while running:
        for d in engine.step(running):
            deltas[int(d.req_id)].append(list(d.token_ids))
            lps[int(d.req_id)] += d.logprobs or []
        for s in [s for s in running if s.finish]:
            engine.release(s)
            running.remove(s)
    return deltas, lps


@pytest.mark.parametrize("mode", ["ar", "dflash"])
def test_two_ranks_decode_what_one_process_decodes(pair, mode):
    target, drafter = pair
    # the whole block verified every step: the adaptive width follows measured times, which differ run to run
    kw = dict(mode=mode, dtype="float64", device="cpu", max_slots=SLOTS, max_model_len=MAX_LEN, verify_width="full")
    draft = drafter if mode == "dflash" else None
    one = build(EngineConfig.from_options(target, draft, **kw, fast=True))
    want, want_lp = _decode(one, _prompts(one.tok))
    two = build(EngineConfig.from_options(target, draft, tensor_parallel_size=2, **kw, fast=True))
    try:
        assert two.core.probe.target.H == one.core.probe.target.H // 2  # each rank holds half the heads
        got, got_lp = _decode(two, _prompts(two.tok))
    finally:
        two.close()
    assert all(not p.is_alive() for p in two.followers.procs)
    assert got == want  # the same tokens in the same steps: every step accepted as many drafts
    lengths = {len(d) for ds in want.values() for d in ds[1:]}
    if mode == "dflash":
        assert len(lengths) > 1, "no step accepted a draft, or every step all: the comparison would be weak"
    assert len(got_lp[0]) == len(want_lp[0]) > 0  # from the gathered logits
    for (tok, lp, top), (tok1, lp1, top1) in zip(got_lp[0], want_lp[0]):
        assert tok == tok1 and lp == pytest.approx(lp1, abs=1e-9)
        assert [t for t, _ in top] == [t for t, _ in top1]


@pytest.mark.parametrize("mode", ["ar", "dflash"])
def test_a_second_turn_resumes_its_slot_on_two_ranks_as_in_one_process(pair, mode):
    """The prefix cache on two ranks: rank 0 decides the resume, every rank prefills from it (`prefill` with its
    starts, `release` keeping the slot, replayed), and the second turns' steps are the single process's."""
    import random

    from dflash_bench.engine.fast.scheduling.prefix import PREFIX_MIN_TOKENS

    target, drafter = pair
    kw = dict(mode=mode, dtype="float64", device="cpu", max_slots=SLOTS, max_model_len=MAX_LEN, verify_width="full")
    draft = drafter if mode == "dflash" else None
    rng = random.Random(5)

    def conversation(engine):
        firsts = [[rng.randrange(3, engine.vocab_size) for _ in range(PREFIX_MIN_TOKENS + 6)] for _ in range(2)]
        one, _ = _decode(engine, firsts, max_tokens=16)
        seconds = [p + [t for d in one[i] for t in d] + [7, 8, 9] for i, p in enumerate(firsts)]
        two, _ = _decode(engine, seconds, max_tokens=16)
        return two, engine.stats.cached_prompt_tokens

    single = build(EngineConfig.from_options(target, draft, **kw, fast=True))
    rng.seed(5)
    want, cached = conversation(single)
    ranks = build(EngineConfig.from_options(target, draft, tensor_parallel_size=2, **kw, fast=True))
    try:
        rng.seed(5)
        got, got_cached = conversation(ranks)
    finally:
        ranks.close()
    assert got == want
    assert got_cached == cached == 2 * (PREFIX_MIN_TOKENS + 6 + 16 - 1)


def test_prompts_that_ride_decode_steps_on_two_ranks(pair):
    """AR with prompts riding the running rows' steps (`--prefill mixed`, the dense family): requests arriving
    mid-decode get the single-process tokens, and some did ride."""
    from fast_helpers import serve_requests

    target, _ = pair
    kw = dict(mode="ar", dtype="float64", device="cpu", max_slots=SLOTS, max_model_len=MAX_LEN, prefill="mixed")
    one = build(EngineConfig.from_options(target, **kw, fast=True))
    if not one.core.probe.mixed:
        pytest.skip("this family carries no prompts in a step")
    reqs = [(at, p, SamplingParams(max_tokens=16, ignore_eos=True)) for at, p in zip((0, 1, 2, 4), _prompts(one.tok))]
    want, _ = serve_requests(one, reqs)
    two = build(EngineConfig.from_options(target, tensor_parallel_size=2, **kw, fast=True))
    try:
        got, _ = serve_requests(two, reqs)
    finally:
        two.close()
    assert got == want and two.mixed_prefills > 0


def test_four_ranks_decode_what_one_process_decodes(tmp_path):
    """--tensor-parallel-size 4 (one query and one KV head a rank, every kind of Gemma 4 layer): DFlash, step for
    step."""
    target, drafter = make_tiny_pair(tmp_path, arch="gemma4", seed=1, block_size=B, layers=3, kv_heads=(4, 4),
                                     draft_kv_heads=4)
    kw = dict(mode="dflash", dtype="float64", device="cpu", max_slots=SLOTS, max_model_len=MAX_LEN, verify_width="full")
    one = build(EngineConfig.from_options(str(target), str(drafter), **kw, fast=True))
    want, _ = _decode(one, _prompts(one.tok), 12)
    four = build(EngineConfig.from_options(str(target), str(drafter), tensor_parallel_size=4, **kw, fast=True))
    try:
        assert four.core.probe.target.H == 1 and [k.hkv for k in four.core.probe.target.caches] == [1, 1]
        got, _ = _decode(four, _prompts(four.tok), 12)
    finally:
        four.close()
    assert got == want


def test_a_size_that_does_not_divide_the_heads_is_one_sentence(pair):
    target, drafter = pair
    with pytest.raises(UserError, match="--tensor-parallel-size 3 does not divide the 4 attention heads"):
        build(EngineConfig.from_options(target, drafter, tensor_parallel_size=3, device="cpu", max_slots=2, max_model_len=64, fast=True))


def test_more_ranks_than_gpus_is_one_sentence(pair, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UserError, match="--tensor-parallel-size 2 needs 2 GPUs, one a rank, but 1 is visible"):
        build(EngineConfig.from_options(pair[0], tensor_parallel_size=2, mode="ar", device="cuda", max_slots=2, max_model_len=64, fast=True))


@pytest.fixture
def stalled(monkeypatch):
    """A watchdog of 3 s, and the sentence a stall ends the server with, recorded instead of exiting the process."""
    import threading

    from dflash_bench.engine.fast.parallel import ranks

    monkeypatch.setattr(ranks, "STALL_S", 3.0)
    said, once = [], threading.Event()

    def record(why: str) -> None:
        said.append(why)
        once.set()
    monkeypatch.setattr(ranks, "_exit_server", record)
    return said, once


def _two_ranks(tmp_path):
    target, _ = make_tiny_pair(tmp_path, arch="qwen3", seed=1, layers=2, kv_heads=(2, 2))
    kw = dict(mode="ar", dtype="float32", device="cpu", max_slots=2, max_model_len=64)
    two = build(EngineConfig.from_options(str(target), tensor_parallel_size=2, **kw, fast=True))
    prompt = two.tok("the cat sat on a mat").input_ids
    seq, _ = two.add("0", prompt, SamplingParams(max_tokens=8, ignore_eos=True))
    for _ in range(3):
        two.step([seq])
    return two, prompt


def test_a_rank_stuck_in_a_collective_ends_the_server_naming_rank_and_step(tmp_path, stalled):
    """Rank 1 replays a prefill rank 0 never runs: its all-reduce waits for ever, and its watchdog ends the server
    with one sentence naming the rank, the call and the step."""
    said, once = stalled
    two, prompt = _two_ranks(tmp_path)
    try:
        two.followers.send("prefill", [1], [prompt], None)  # rank 0 does not take part
        assert once.wait(60), "no watchdog sentence within 60 s"
    finally:
        two.close()
    assert len(said) == 1
    assert re.fullmatch(r"tensor-parallel rank 1 made no progress for \d+ s in prefill #2 \(after step [3-9]\) "
                        r"\(a collective that another rank did not enter, or a device that does not finish\)", said[0])
    assert all(not p.is_alive() for p in two.followers.procs)


def test_rank_0_stuck_in_a_collective_ends_the_server_naming_the_step(tmp_path, stalled):
    """Rank 0 prefills a prompt the other rank never hears of: its watchdog names rank 0 and the step, and ends the
    other ranks, so the collective rank 0 waits in fails rather than hangs."""
    said, once = stalled
    two, prompt = _two_ranks(tmp_path)
    send = two.followers.send
    two.followers.send = lambda name, *a, **kw: None if name == "prefill" else send(name, *a, **kw)
    try:
        with pytest.raises(RuntimeError):  # gloo: the peer is gone
            two.add("1", prompt, SamplingParams(max_tokens=8, ignore_eos=True))
        assert once.wait(60)
    finally:
        two.close()
    assert len(said) == 1
    assert re.match(r"tensor-parallel rank 0 made no progress for \d+ s in prefill #2 \(after step [3-9]\)", said[0])
