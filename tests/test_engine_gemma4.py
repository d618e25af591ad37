"""Gemma 4 on the builtin engine: tokens equal to transformers' own generate, DFlash equal to AR, and the gemma-4
drafter step for step equal to z-lab's reference code (PyPI dflash 0.1.0), on a tiny random Gemma4ForCausalLM.

The tiny target covers what the 31B's layout has: sliding layers (window 8, shorter than most prompts) and full
ones with their own head size and KV heads, the key as the value (attention_k_eq_v), proportional partial rotary
(0.25) on full layers, final-logit softcapping and a tied head. Its drafter has a sliding (causal, window 4) and a
full (non-causal) layer, six target features, the embedding scale and softcapped draft logits.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

pytest.importorskip("transformers")

from dflash_bench.engine.build import build  # noqa: E402
from dflash_bench.engine.config import EngineConfig  # noqa: E402
from dflash_bench.engine.reference.decode import generate  # noqa: E402
from dflash_bench.engine.sampling_params import SamplingParams  # noqa: E402
from dflash_bench.testing.tiny import make_tiny_pair  # noqa: E402
from dflash_bench.errors import UserError  # noqa: E402

from zlab_reference import zlab_model  # noqa: E402

pytestmark = pytest.mark.engine
B = 6
FAVOURED = range(97, 100)  # embedding rows made larger: drafts and targets agree now and then (ragged acceptance)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    target, drafter = make_tiny_pair(tmp_path_factory.mktemp("gemma4"), arch="gemma4", seed=1, block_size=B, layers=7)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    with torch.no_grad():
        model.get_input_embeddings().weight[FAVOURED] *= 3.0
        for i, layer in enumerate(model.model.layers):  # a real checkpoint's layer scalars are not 1
            layer.layer_scalar.fill_(0.6 + 0.15 * i)
    model.save_pretrained(target)
    return target, drafter


def _engines(pair, dtype):
    target, drafter = pair
    ar = build(EngineConfig(str(target), mode="ar", max_slots=8, max_model_len=256, dtype=dtype, device="cpu"))
    df = build(EngineConfig(str(target), str(drafter), mode="dflash", max_slots=8, max_model_len=256, dtype=dtype, device="cpu"))
    ar.prefill_rows = df.prefill_rows = 8  # batched, right-padded prefill too
    return ar, df


@pytest.fixture(scope="module")
def engines(pair):
    return _engines(pair, "float64")


@pytest.fixture(scope="module")
def engines32(pair):  # the Triton kernels run float32 and half types
    return _engines(pair, "float32")


def prompts(n=6, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randint(3, 30))] for _ in range(n)]


def outs(seqs):
    return [s.out for s in seqs]


def test_the_tiny_pair_has_what_gemma4_31b_has(pair):
    cfg = json.loads((pair[0] / "config.json").read_text())
    assert set(cfg["layer_types"]) == {"sliding_attention", "full_attention"}
    assert cfg["attention_k_eq_v"] and cfg["final_logit_softcapping"] == 30.0 and cfg["tie_word_embeddings"]
    full = [str(i) for i, t in enumerate(cfg["layer_types"]) if t == "full_attention"]
    assert {cfg["per_layer_config"][i]["head_dim"] for i in full} == {2 * cfg["head_dim"]}
    assert cfg["rope_parameters"]["full_attention"] == {"partial_rotary_factor": 0.25, "rope_theta": 1e6,
                                                        "rope_type": "proportional"}
    assert cfg["sliding_window"] < max(len(p) for p in prompts())
    d = json.loads((pair[1] / "config.json").read_text())
    assert d["layer_types"] == ["sliding_attention", "full_attention"] and d["use_sliding_window"]
    assert len(d["dflash_config"]["target_layer_ids"]) == 6
    assert d["dflash_config"]["input_embedding_scale"] == 8.0 and d["dflash_config"]["final_logit_softcapping"] == 30.0


def test_ar_equals_transformers_generate(pair, engines):
    from transformers import AutoModelForCausalLM

    ar, _ = engines
    ps = prompts(4)
    hf = AutoModelForCausalLM.from_pretrained(str(pair[0]), dtype=torch.float64).eval()
    ref = [hf.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                       pad_token_id=256)[0, len(p):].tolist() for p in ps]
    sp = SamplingParams(max_tokens=24, ignore_eos=True)
    assert outs(generate(ar, ps, sp)) == ref
    assert [outs(generate(ar, [p], sp))[0] for p in ps] == ref


def test_dflash_equals_ar_at_several_batch_sizes(engines):
    ar, df = engines
    ps = prompts(6, seed=1)
    sp = SamplingParams(max_tokens=40, ignore_eos=True)
    ref = outs(generate(ar, ps, sp))
    before = df.stats.accepted
    for bs in (1, 3, 6):
        got = [o for i in range(0, len(ps), bs) for o in outs(generate(df, ps[i:i + bs], sp))]
        assert got == ref
    assert df.stats.accepted > before  # some drafts were accepted: the rollback of the rest was exercised


def test_dflash_is_step_for_step_zlabs_reference(pair, engines):
    """Greedy DFlash through z-lab's `dflash_generate` (its drafter class, transformers' target and cache): the
    same tokens, the same acceptance length at every step, and the same draft logits at every full block."""
    from transformers import AutoModelForCausalLM

    zm = zlab_model()
    _, df = engines
    target = AutoModelForCausalLM.from_pretrained(str(pair[0]), dtype=torch.float64).eval()
    drafter = zm.DFlashDraftModel.from_pretrained(str(pair[1]), dtype=torch.float64).eval()
    theirs_logits, ours_logits = [], []
    compute = drafter.compute_logits
    drafter.compute_logits = lambda h, head: theirs_logits.append(compute(h, head)) or theirs_logits[-1]
    propose, step, lengths = df.proposer.propose, df.step, []
    df.proposer.propose = lambda seqs: (lambda r: ours_logits.append(r[1]) or r)(propose(seqs))
    df.step = lambda seqs: (lambda d: lengths.extend(len(x.token_ids) for x in d) or d)(step(seqs))
    n, longest = 36, 1
    try:
        for p in prompts(6, seed=2):
            theirs_logits.clear()
            ours_logits.clear()
            lengths.clear()
            z = zm.dflash_generate(drafter, target, torch.tensor([p]), n, None, 0.0, return_stats=True)
            got = generate(df, [p], SamplingParams(max_tokens=n, ignore_eos=True))[0].out
            assert got == z.output_ids[0, len(p):len(p) + n].tolist()
            assert lengths[:-1] == z.acceptance_lengths[:len(lengths) - 1]  # the last step is cut at n
            full = [(t, o) for t, o in zip(theirs_logits, ours_logits) if t.shape[1] == B - 1]
            assert len(full) >= len(lengths) - B  # z-lab cuts the blocks of its last steps at n
            for t, o in full:
                torch.testing.assert_close(o[0], t[0], rtol=0, atol=1e-5)
            longest = max(longest, *z.acceptance_lengths)
    finally:
        del drafter.compute_logits, df.proposer.propose, df.step
    assert longest > 1  # drafts were accepted: ragged steps were compared


def test_a_gemma4_it_cannot_serve_is_one_sentence(tmp_path):
    """KV sharing (Gemma 4 E2B/E4B: later layers read an earlier layer's keys of the same forward) is refused."""
    from transformers import AutoModelForCausalLM, Gemma4TextConfig

    cfg = Gemma4TextConfig(vocab_size=272, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=32,
                           num_kv_shared_layers=2, hidden_size_per_layer_input=0, sliding_window=8,
                           layer_types=["sliding_attention", "full_attention"] * 2)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    with pytest.raises(UserError, match="shares keys and values across its last 2 layers"):
        build(EngineConfig(str(tmp_path), mode="ar", max_slots=1, max_model_len=64, device="cpu"), tokenizer=object())


def test_dummy_weights_serve_a_config_without_weight_files(pair, tmp_path):
    """`--load-format dummy`: the folders need only their config.json (and the target its tokenizer)."""
    import shutil

    target, drafter = tmp_path / "target", tmp_path / "drafter"
    shutil.copytree(pair[0], target, ignore=shutil.ignore_patterns("*.safetensors"))
    shutil.copytree(pair[1], drafter, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(UserError):
        build(EngineConfig(str(target), str(drafter), mode="dflash", max_slots=2, max_model_len=128, device="cpu"))
    df = build(EngineConfig(str(target), str(drafter), mode="dflash", max_slots=2, max_model_len=128, load_format="dummy", device="cpu"))
    ar = build(EngineConfig(str(target), mode="ar", max_slots=2, max_model_len=128, load_format="dummy", device="cpu"))
    with torch.no_grad():  # the same seed-free random init in both: make them one model
        for a, b in zip(ar.target.model.parameters(), df.target.model.parameters()):
            a.copy_(b)
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    ps = prompts(2)
    assert outs(generate(df, ps, sp)) == outs(generate(ar, ps, sp))
    assert df.stats.drafts > 0


# ---- the fast path (`serve --fast`): the same tokens through its three CPU ways of running a step ----------------
# "cpu": the C kernels; False: plain torch ops; True: the Triton kernels in Triton's interpreter (what a GPU runs)
FAST_PATHS = [pytest.param("cpu", id="c-kernels"), pytest.param(False, id="torch-ops"),
              pytest.param(True, id="triton-interpreter")]


def _fast_runner(df, *, drafter: bool, kernels, ring_margin=None, monkeypatch=None, **step):
    from dflash_bench.engine.config import StepConfig
    from dflash_bench.engine.fast.models import gemma, cache_layout as layout
    from dflash_bench.engine.fast.models.draft import FastDrafter
    from dflash_bench.engine.fast.core import EngineCore

    if kernels == "cpu":
        from dflash_bench.engine.fast.kernels import cpu_kernels

        if cpu_kernels.load() is None:
            pytest.skip("no C compiler builds the CPU kernels")
    if ring_margin is not None:
        monkeypatch.setattr(layout, "RING_MARGIN", ring_margin)
    t = gemma.GemmaTarget(df.target.model, max_slots=8, max_len=256, kernels=kernels)
    d = FastDrafter(df.proposer.drafter, t.embed, t.head, max_slots=8, max_len=256, kernels=kernels) if drafter else None
    return EngineCore(t, d, StepConfig(**{"verify_width": "full", "kv_block": 16, **step}))


def _step_lengths(engine, p, n):
    """Tokens per step of the reference engine decoding `p` alone to `n` tokens."""
    step, lengths = engine.step, []
    engine.step = lambda seqs: (lambda d: lengths.extend(len(x.token_ids) for x in d) or d)(step(seqs))
    try:
        generate(engine, [p], SamplingParams(max_tokens=n, ignore_eos=True))
    finally:
        del engine.step
    return lengths


def _fast_step_lengths(runner, p, n):
    out, lengths = [runner.add(0, p)], []
    while len(out) < n:
        got = runner.step([0])[0]
        out += got
        lengths.append(len(got))
    runner.release(0)
    return lengths


@pytest.mark.parametrize("kernels", FAST_PATHS)
def test_fast_path_equals_the_reference_ar_and_dflash(request, kernels, monkeypatch):
    """AR and DFlash at batch 1 and 5; the sliding layers' ring is the window plus one block (the least that
    holds every key a step's queries see), so it wraps many times; DFlash drafts what the reference drafts, step
    for step (the same number of tokens at every step but the last, which the request's end cuts)."""
    from dflash_bench.engine.fast.drive import generate as fast_generate

    slow = kernels is True  # the interpreter runs a kernel launch in ~0.1 s: fewer prompts and tokens
    ar, df = request.getfixturevalue("engines32" if slow else "engines")
    n = 5 if slow else 40
    ps = prompts(5, seed=3)[2:4] if slow else prompts(5, seed=3)
    ref = outs(generate(ar, ps, SamplingParams(max_tokens=n, ignore_eos=True)))
    fast_ar = _fast_runner(df, drafter=False, kernels=kernels, ring_margin=B, monkeypatch=monkeypatch)
    assert fast_ar.probe.target.kinds[0].ring == 8 + B and (fast_ar.probe.target.kernels is not None) == (kernels is not False)
    assert fast_generate(fast_ar, ps, n) == ref
    fast_df = _fast_runner(df, drafter=True, kernels=kernels, ring_margin=B, monkeypatch=monkeypatch)
    assert fast_generate(fast_df, ps, n) == ref
    if slow:
        return
    assert [fast_generate(fast_ar, [p], n)[0] for p in ps[:2]] == ref[:2]
    longest = 1
    for p in ps:
        want = _step_lengths(df, p, n)
        assert _fast_step_lengths(fast_df, p, n)[:-1] == want[:-1]
        longest = max(longest, *want)
    assert longest > 1  # drafts were accepted: ragged steps were compared


def test_serve_fast_builds_the_gemma4_engine_and_keeps_only_the_window(pair):
    """`build` with --fast (what `serve --fast` runs) on the folders: greedy tokens equal the reference engine's at
    several batch sizes; the sliding layers' cache is a ring of the window plus RING_MARGIN positions a slot."""
    from dflash_bench.engine.fast.models import cache_layout as layout
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.build import build

    ar = build(EngineConfig(str(pair[0]), mode="ar", max_slots=8, max_model_len=256, dtype="float64", device="cpu"))
    ps = prompts(6, seed=4)
    sp = SamplingParams(max_tokens=30, ignore_eos=True)
    ref = outs(generate(ar, ps, sp))
    for mode in ("ar", "dflash"):
        fe = build(EngineConfig.from_options(str(pair[0]), str(pair[1]) if mode == "dflash" else None, mode=mode, dtype="float64",
                               device="cpu", max_slots=8, max_model_len=256, fast=True))
        sliding, full = fe.core.probe.target.kinds
        assert sliding.k[0].shape == (8, 8 + layout.RING_MARGIN + 1, 2, 16) and full.k[0].shape == (8, 256, 1, 32)
        for bs in (1, 2, 6):
            assert [o for i in range(0, 6, bs) for o in outs(generate(fe, ps[i:i + bs], sp))] == ref


@pytest.mark.parametrize("kernels", FAST_PATHS[:2])
def test_fast_target_logits_equal_transformers(engines, kernels):
    """The fast target's logits (softcapped, so a dropped cap shows here though greedy tokens cannot see it) for a
    prompt longer than the window, and then for a step of 3 tokens after it, equal transformers' forward."""
    from transformers import AutoModelForCausalLM

    from dflash_bench.engine.fast.models import gemma

    _, df = engines
    if kernels == "cpu":
        from dflash_bench.engine.fast.kernels import cpu_kernels

        if cpu_kernels.load() is None:
            pytest.skip("no C compiler builds the CPU kernels")
    t = gemma.GemmaTarget(df.target.model, max_slots=2, max_len=64, kernels=kernels)
    hf = AutoModelForCausalLM.from_pretrained(df.target.model.name_or_path, dtype=torch.float64).eval()
    ids = torch.tensor([prompts(1, seed=5)[0] + [97, 98, 99, 5, 6, 7, 8]])
    n = ids.shape[1] - 3
    want = hf(ids).logits[0]
    got, _ = t.forward(ids[:, :n], torch.tensor([0]), 1, n, slot=torch.tensor([1]), last=torch.tensor([n - 1]),
                       last_only=True)
    torch.testing.assert_close(got[0, 0], want[n - 1], rtol=0, atol=1e-3)  # HF norms Gemma 4 in float32
    step, _ = t.forward(ids[:, n:], torch.tensor([n]), 1, n + 3)
    torch.testing.assert_close(step[0], want[n:], rtol=0, atol=1e-3)  # HF norms Gemma 4 in float32
    assert want.abs().max() < 30 and want.abs().max() > 15  # the cap bends the logits here


@pytest.mark.parametrize("use", [None, False, True])
def test_the_drafters_window_is_read_as_zlabs_qwen3config_reads_it(pair, use):
    """z-lab's drafter class reads its config as a Qwen3Config, which keeps `sliding_window` only with
    `use_sliding_window`; the sliding layers stay causal either way."""
    from transformers import Qwen3Config

    from dflash_bench.engine.reference.drafter import DrafterConfig

    d = json.loads((pair[1] / "config.json").read_text())
    d.pop("use_sliding_window")
    if use is not None:
        d["use_sliding_window"] = use
    c = DrafterConfig.from_dict(d)
    zlab = Qwen3Config(**{k: v for k, v in d.items() if k not in ("dflash_config", "architectures")})
    assert c.sliding_window == zlab.sliding_window == (4 if use else None)
    assert c.layer_mask_kind(0) == (True, zlab.sliding_window) and c.layer_mask_kind(1) == (False, None)


def test_serve_fast_load_format_dummy_over_http(pair, tmp_path):
    """`dflash-bench serve --fast --load-format dummy` on folders without weight files: it serves Gemma 4 and its
    drafter over HTTP; a wrong --load-format is one sentence."""
    import shutil
    import subprocess
    import sys

    import httpx
    from test_engine_server import cli_server

    target, drafter = tmp_path / "target", tmp_path / "drafter"
    shutil.copytree(pair[0], target, ignore=shutil.ignore_patterns("*.safetensors"))
    shutil.copytree(pair[1], drafter, ignore=shutil.ignore_patterns("*.safetensors"))
    bad = subprocess.run([sys.executable, "-m", "dflash_bench", "serve", "--model", str(target), "--device", "cpu",
                          "--load-format", "random"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--load-format must be auto or dummy" in bad.stderr + bad.stdout
    assert "Traceback" not in bad.stderr
    with cli_server("--model", str(target), "--draft", str(drafter), "--served-model-name", "g", "--fast",
                    "--load-format", "dummy") as url:
        body = {"model": "g", "prompt": "the cat sat on the mat", "max_tokens": 16, "ignore_eos": True,
                "temperature": 0}
        r = httpx.post(url + "/v1/completions", json=body, timeout=120).json()
        assert r["usage"]["completion_tokens"] == 16
        assert "vllm:spec_decode_num_drafts_total{" in httpx.get(url + "/metrics").text
