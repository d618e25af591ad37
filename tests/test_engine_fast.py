"""The fast path (engine/fast): greedy AR == DFlash == the reference engine, on real tiny models, on the CPU;
its logprobs == transformers' own; what it refuses (scheduling, widths, step-ahead: test_engine_fast_steps.py;
the served engine and loop: test_engine_fast_serve.py).

The same code runs under CUDA graphs on a GPU (benchmarks/speed/engine_speed.py checks it there too).
"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402

from dflash_bench.engine.build import build  # noqa: E402
from dflash_bench.engine.config import EngineConfig  # noqa: E402
from dflash_bench.engine.reference.decode import generate as ref_generate  # noqa: E402
from dflash_bench.engine.fast.models.draft import FastDrafter  # noqa: E402
from dflash_bench.engine.fast.models.dense import DenseTarget  # noqa: E402
from dflash_bench.engine.fast.drive import decode, generate  # noqa: E402
from dflash_bench.engine.config import StepConfig  # noqa: E402
from dflash_bench.engine.fast.core import EngineCore  # noqa: E402
from dflash_bench.engine.sampling_params import SamplingParams  # noqa: E402
from dflash_bench.testing.tiny import make_tiny_pair  # noqa: E402
from fast_helpers import (ARCHS, B, MAX_LEN, N, PATHS, SLOTS, fast_runner, serve_requests, tiny_engines,  # noqa: E402
                          tiny_prompts, usable_path)

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module", params=ARCHS)
def setup(request, tmp_path_factory):
    return tiny_engines(request.param, tmp_path_factory)


@pytest.mark.parametrize("kernels", PATHS)
def test_fast_ar_and_dflash_equal_the_reference_engine(setup, kernels):
    kernels = usable_path(kernels)
    ar, df = setup
    prompts = tiny_prompts(ar.tok, 5)
    ref = [s.out for s in ref_generate(ar, prompts, SamplingParams(max_tokens=N, ignore_eos=True))]
    d0, a0 = df.stats.drafts, df.stats.accepted
    ref_generate(df, prompts, SamplingParams(max_tokens=N, ignore_eos=True))
    ref_tau = 1 + (df.stats.accepted - a0) / (df.stats.drafts - d0)

    fast_ar = fast_runner(df, drafter=False, kernels=kernels)
    assert (fast_ar.probe.target.kernels is not None) == (kernels == "cpu")
    assert generate(fast_ar, prompts, N) == ref
    fast_df = fast_runner(df, kernels=kernels)
    assert generate(fast_df, prompts, N) == ref
    # same drafts as the reference drafter, step by step: the per-step acceptance matches exactly, as the
    # bookkeeping both engines share counts it (metrics/definitions.py's tau: nothing past a request's end)
    from dflash_bench.engine.bookkeeping import eos_ids
    from dflash_bench.engine.config import EngineConfig, StepConfig
    from dflash_bench.engine.fast.engine import FastEngine

    config = EngineConfig("tiny", fast=True, max_model_len=MAX_LEN, kernels=kernels is not False,
                          step=StepConfig(verify_width="full", kv_block=16))
    engine = FastEngine(df.target.model, df.tok, df.proposer.drafter, config, eos_ids=eos_ids(df.target.model, df.tok),
                        max_slots=SLOTS)
    assert [s.out for s in ref_generate(engine, prompts, SamplingParams(max_tokens=N, ignore_eos=True))] == ref
    assert 1 + engine.stats.accepted / engine.stats.drafts == pytest.approx(ref_tau)
    assert (engine.stats.drafts, engine.stats.accepted) == (df.stats.drafts - d0, df.stats.accepted - a0)


def test_ragged_batches_reuse_slots_and_cross_kv_buckets(setup):
    ar, df = setup
    runner = fast_runner(df)
    first = tiny_prompts(ar.tok, 7)
    ref = [s.out for s in ref_generate(ar, first, SamplingParams(max_tokens=N, ignore_eos=True))]
    assert generate(runner, first, N) == ref
    # a second, smaller batch in the same slots: stale state of freed slots (now padding) must not leak in
    second = tiny_prompts(ar.tok, 3)
    ref2 = [s.out for s in ref_generate(ar, second, SamplingParams(max_tokens=N, ignore_eos=True))]
    assert generate(runner, second, N) == ref2


@pytest.mark.parametrize("budget,way", [(8192, "eager"), (48, "eager"), (8192, "graph")])
def test_batched_prefill_equals_one_prompt_at_a_time(setup, monkeypatch, budget, way):
    """Prompts of different lengths prefilled together (right-padded, in any slot order; with a small token
    budget in several groups; or as the graphs of 2 and 3 rows a GPU runs, here run eagerly) leave the slots
    as one-by-one prefills do: first tokens, logits, the target's and the drafter's K/V over each prompt, and
    every token decoded after."""
    from dflash_bench.engine.fast.scheduling import scheduler as scheduler_mod

    monkeypatch.setattr(scheduler_mod, "PREFILL_TOKENS", budget)
    ar, df = setup
    prompts = tiny_prompts(ar.tok, 5)
    assert len({len(p) for p in prompts}) > 2
    ref = [s.out for s in ref_generate(ar, prompts, SamplingParams(max_tokens=N, ignore_eos=True))]
    slots = [3, 0, 4, 1, 2]
    alone, together = fast_runner(df, keep_logits=True), fast_runner(df, keep_logits=True)
    firsts = [alone.add(s, p) for s, p in zip(slots, prompts)]
    if way == "graph":  # the staged k-row inputs, as the captured graphs read them
        got = (together.prefill_group(slots[:2], prompts[:2], graphed=True)
               + together.prefill_group(slots[2:], prompts[2:], graphed=True))
    else:
        got = together.add_many(slots, prompts)
    assert got == firsts == [o[0] for o in ref]
    close = dict(rtol=1e-9, atol=1e-9)  # float64: other padding, other reduction order, nothing more
    for s, p in zip(slots, prompts):
        n = len(p)
        torch.testing.assert_close(together.logits[s, 0], alone.logits[s, 0], **close)
        for a, b in ((alone.probe.target.cache, together.probe.target.cache), (alone.probe.drafter.cache, together.probe.drafter.cache)):
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
    of ever new lengths does not grow memory (the GPU soak in engine_speed measures the same). Each target and
    drafter keeps its own."""
    ar, df = setup
    runner = fast_runner(df)
    generate(runner, tiny_prompts(ar.tok, 3), 12)
    indexes = (runner.probe.target.index, runner.probe.drafter.index)
    kept = [len(i.kept) for i in indexes]
    assert all(kept)
    again = tiny_prompts(ar.tok, 4)[1:]  # three other prompts, of other lengths
    assert {len(p) for p in again} - {len(p) for p in tiny_prompts(ar.tok, 3)}
    generate(runner, again, 12)
    assert [len(i.kept) for i in indexes] == kept


def test_predictable_pair_accepts_whole_blocks(tmp_path):
    target, drafter = make_tiny_pair(tmp_path, seed=2, block_size=B, predictable=True)
    df = build(EngineConfig(str(target), str(drafter), mode="dflash", max_slots=SLOTS, max_model_len=MAX_LEN, dtype="float32", device="cpu"))
    runner = fast_runner(df)
    out = generate(runner, tiny_prompts(df.tok, 2), N)
    assert runner.timer.tau == B
    assert all(o == [ord("a")] * N for o in out)


def test_a_paused_row_resumes_where_it_stopped(setup):
    """Rows of the batch bucket that are not stepped (padding, paused) keep anchor, position and context."""
    ar, df = setup
    ps = tiny_prompts(ar.tok, 3)
    ref = [s.out for s in ref_generate(ar, ps, SamplingParams(max_tokens=N, ignore_eos=True))]
    for runner in (fast_runner(df, drafter=False), fast_runner(df)):
        outs = [[runner.add(i, p)] for i, p in enumerate(ps)]
        for step in range(200):
            live = [i for i in range(3) if len(outs[i]) < N and not (i == 1 and 2 <= step < 6)]
            if not live:
                break
            got = runner.step(live)
            for i in live:
                outs[i].extend(got[i])
        assert [o[:N] for o in outs] == ref


def test_a_failing_prefill_gives_every_slot_back(tmp_path):
    """add_many is all or nothing: a prompt the cache cannot hold fails, and no slot stays taken."""
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.build import build

    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    fast = build(EngineConfig.from_options(str(target), str(drafter), max_slots=4, max_model_len=64, dtype="float32", device="cpu", fast=True))
    sp = SamplingParams(max_tokens=4, ignore_eos=True)
    with pytest.raises(IndexError):
        fast.add_many([("ok", [1, 2, 3], sp), ("too-long", list(range(1, 100)), sp)])
    assert sorted(fast.free_slots) == [0, 1, 2, 3] and fast.core.probe.state.active.sum() == 0
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

    from dflash_bench.testing.tiny import VOCAB_SIZE, make_tokenizer

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
    ref = build(EngineConfig(str(tmp_path), mode="ar", max_slots=SLOTS, max_model_len=MAX_LEN, dtype="float64", device="cpu"))
    prompts = tiny_prompts(ref.tok, 3)
    want = [s.out for s in ref_generate(ref, prompts, SamplingParams(max_tokens=24, ignore_eos=True))]
    runner = EngineCore(DenseTarget(ref.target.model, max_slots=SLOTS, max_len=MAX_LEN), None, StepConfig(verify_width="full", kv_block=16))
    assert generate(runner, prompts, 24) == want


def test_fast_target_refuses_biases_it_would_drop():
    """Llama with attention_bias has an o_proj bias the fused forward does not add: refused, not run wrong."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from dflash_bench.errors import UserError

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, attention_bias=True)
    with pytest.raises(UserError, match="without --fast"):
        DenseTarget(AutoModelForCausalLM.from_config(cfg), max_slots=1, max_len=16)

    from dflash_bench.engine.reference.drafter import DFlashDrafter, DrafterConfig
    from dflash_bench.testing.tiny import drafter_config

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

    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.build import build

    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    engine = build(EngineConfig.from_options(str(target), str(drafter) if mode == "dflash" else None, mode=mode, max_slots=4,
                               max_model_len=MAX_LEN, dtype="float64", device="cpu", fast=True))
    ps = tiny_prompts(engine.tok, 4)
    tops = [None, 0, 2, 3]
    got, _ = serve_requests(engine, [(0, p, SamplingParams(max_tokens=12, ignore_eos=True, logprobs=k)) for p, k in zip(ps, tops)])
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


def test_no_kernels_is_an_argument_that_runs_the_torch_ops(tmp_path):
    """`serve --fast --no-kernels` (`EngineConfig.kernels` False): target and drafter run plain torch ops, and
    serve what the kernels serve."""
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.build import build

    target, drafter = make_tiny_pair(tmp_path, seed=1, block_size=B)
    kw = dict(max_slots=2, max_model_len=MAX_LEN, dtype="float64", device="cpu")
    plain = build(EngineConfig.from_options(str(target), str(drafter), kernels=False, **kw, fast=True))
    assert plain.core.probe.target.kernels is None and plain.core.probe.drafter.kernels is None
    sp = SamplingParams(max_tokens=20, ignore_eos=True)
    ps = tiny_prompts(plain.tok, 2)
    assert ([s.out for s in ref_generate(plain, ps, sp)]
            == [s.out for s in ref_generate(build(EngineConfig.from_options(str(target), str(drafter), **kw, fast=True)), ps, sp)])


@pytest.mark.parametrize("kernels", [True, "cpu"])
def test_a_head_dim_the_kernels_cannot_run_is_refused_at_load(tmp_path, kernels):
    """Triton's kernels (here in its interpreter) take power-of-two head dims of 16 or more, the C kernels whole
    vectors: another head dim is one sentence when the model loads, not a ValueError at the first decode step."""
    from dflash_bench.engine.reference.drafter import load_drafter
    from dflash_bench.engine.fast.kernels import cpu_kernels
    from dflash_bench.engine.reference.target import load_model
    from dflash_bench.errors import UserError

    if kernels == "cpu" and cpu_kernels.load() is None:
        pytest.skip("no C compiler builds the CPU kernels")
    hidden = 96 if kernels is True else 80  # head dim 24: not a power of two; 20: not a multiple of 8 floats
    target, drafter = make_tiny_pair(tmp_path, hidden=hidden)
    hf = load_model(str(target), dtype=torch.float32, device="cpu")
    which = "Triton kernels take power-of-two head dims of 16 or more" if kernels is True else "C kernels take"
    for make, what in ((lambda k: DenseTarget(hf, max_slots=2, max_len=64, kernels=k), "target"),
                        (lambda k: FastDrafter(load_drafter(str(drafter), target_hidden=hidden, target_layers=4,
                                                            target_vocab=hf.lm_head.weight.shape[0], dtype=torch.float32, device="cpu"), hf.model.embed_tokens.weight,
                                               hf.lm_head.weight, max_slots=2, max_len=64, kernels=k), "drafter")):
        with pytest.raises(UserError) as err:
            make(kernels)
        assert str(err.value).startswith(f"the fast path's {which}")
        assert f"the {what} has head dim {hidden // 4}: serve it with --no-kernels" in str(err.value)
        make(False)  # the same model on torch ops
