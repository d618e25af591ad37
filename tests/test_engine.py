"""The builtin engine's decode loop: lossless against AR, ragged batches, forced acceptance, drafter loading."""

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

pytestmark = pytest.mark.engine
B = 6


@pytest.fixture(scope="module", params=["qwen3", "llama", "gemma3"])
def pair(request, tmp_path_factory):
    return make_tiny_pair(tmp_path_factory.mktemp(request.param), arch=request.param, seed=1, block_size=B)


@pytest.fixture(scope="module")
def engines(pair):
    target, drafter = pair
    ar = build(EngineConfig(str(target), mode="ar", max_slots=8, max_model_len=256, dtype="float64", device="cpu"))
    df = build(EngineConfig(str(target), str(drafter), mode="dflash", max_slots=8, max_model_len=256, dtype="float64", device="cpu"))
    ar.prefill_rows = df.prefill_rows = 8  # batched, right-padded prefill (the GPU default) under test too
    return ar, df


def prompts(tok, n=6):
    rng = random.Random(0)
    words = "the cat sat on a mat while seven dogs ran past quickly".split()
    return [tok(" ".join(rng.choice(words) for _ in range(rng.randint(1, 25)))).input_ids for _ in range(n)]


def ids(seqs):
    return [s.out for s in seqs]


class Oracle:
    """Proposes the target's own next tokens (from an AR reference) for the first k drafts, then wrong ones.

    `k(seq)` picks how many drafts are right at each step; every step is recorded as (req_id, k).
    """

    def __init__(self, reference: dict, vocab: int, k):
        self.block_size, self.layer_ids = B, []
        self.ref, self.vocab, self.k, self.log = reference, vocab, k, []

    def prefill(self, slot, feats):
        pass

    def commit(self, seqs, feats, starts):
        pass

    def propose(self, seqs):
        rows = []
        for s in seqs:
            ref = self.ref[tuple(s.prompt)]
            n, k = len(s.out), self.k(s)
            truth = (ref[n : n + B - 1] + [0] * B)[: B - 1]
            rows.append([t if i < k else (t + 1) % self.vocab for i, t in enumerate(truth)])
            self.log.append((s.req_id, len(s.out), k))
        return torch.tensor(rows), None


def with_proposer(ar_engine, proposer):
    from dflash_bench.engine.reference.decode import ReferenceEngine

    return ReferenceEngine(ar_engine.target, ar_engine.tok, proposer, eos_ids=sorted(ar_engine.eos_ids))


def test_dflash_equals_ar_greedy_batched_and_single(engines):
    ar, df = engines
    ps = prompts(ar.tok)
    for max_tokens in (1, 7, 40):
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        ref = ids(generate(ar, ps, sp))
        assert ids(generate(df, ps, sp)) == ref
        assert [ids(generate(df, [p], sp))[0] for p in ps] == ref
        assert all(len(o) == max_tokens for o in ref)
    # a last block past max_tokens drafts only the positions inside the request (metrics/definitions.py tau)
    assert df.stats.drafts > 0 and df.stats.draft_tokens < df.stats.drafts * (B - 1)


def test_ar_engine_equals_transformers_generate(pair, engines):
    from transformers import AutoModelForCausalLM

    ar, _ = engines
    ps = prompts(ar.tok, 3)
    ours = ids(generate(ar, ps, SamplingParams(max_tokens=20, ignore_eos=True)))
    hf = AutoModelForCausalLM.from_pretrained(str(pair[0]), dtype=torch.float64).eval()
    for p, o in zip(ps, ours):
        ref = hf.generate(torch.tensor([p]), max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=256)
        assert ref[0, len(p):].tolist() == o


def test_stops_at_eos_like_ar(engines):
    ar, df = engines
    ps = prompts(ar.tok, 8)
    sp = SamplingParams(max_tokens=60)
    ref = generate(ar, ps, sp)
    got = generate(df, ps, sp)
    assert ids(got) == ids(ref)
    assert [s.finish for s in got] == [s.finish for s in ref]


def _reference(ar, ps, max_tokens):
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return {tuple(p): s.out for p, s in zip(ps, generate(ar, ps, sp))}, sp


def test_oracle_drafter_accepts_full_blocks(engines):
    ar, _ = engines
    ps = prompts(ar.tok)
    max_tokens = 1 + 4 * B
    ref, sp = _reference(ar, ps, max_tokens)
    eng = with_proposer(ar, Oracle(ref, ar.target.vocab_size, lambda s: B - 1))
    got = generate(eng, ps, sp)
    assert ids(got) == [ref[tuple(p)] for p in ps]
    assert all(s.steps == 4 for s in got)  # tau = B on every step: 1 prefill token + 4 blocks of B
    assert eng.stats.accepted == eng.stats.drafts * (B - 1)
    assert eng.stats.accepted_per_pos == [eng.stats.drafts] * (B - 1)


def test_wrong_drafter_accepts_nothing(engines):
    ar, _ = engines
    ps = prompts(ar.tok)
    ref, sp = _reference(ar, ps, 20)
    eng = with_proposer(ar, Oracle(ref, ar.target.vocab_size, lambda s: 0))
    got = generate(eng, ps, sp)
    assert ids(got) == [ref[tuple(p)] for p in ps]
    # tau = 1; 19 decode steps, the last with room for one token only: no draft position left, no verify step
    assert eng.stats.accepted == 0 and all(s.steps == 18 for s in got)


@pytest.mark.parametrize("room", [2, 1])
def test_drafts_past_max_tokens_count_for_nothing(engines, room):
    """tau is tokens committed per verify step, nothing past the request's end (metrics/definitions.py): an
    oracle drafter whose last block runs past max_tokens has only the drafts inside the request counted, and a
    last step with room for one token is no verify step (llama.cpp counts the same way). Before, the builtin
    engine counted the whole last block as drafted and accepted."""
    ar, _ = engines
    ps = prompts(ar.tok)
    max_tokens = 1 + 3 * B + room  # the prefill's token, three full blocks, then `room` tokens left
    ref, sp = _reference(ar, ps, max_tokens)
    eng = with_proposer(ar, Oracle(ref, ar.target.vocab_size, lambda s: B - 1))
    got = generate(eng, ps, sp)
    assert ids(got) == [ref[tuple(p)] for p in ps]
    assert all(s.steps == 3 + (room > 1) for s in got)
    assert all(s.accepted == len(s.out) - 1 - s.steps - (room == 1) for s in got)  # committed drafts only
    assert eng.stats.draft_tokens == eng.stats.accepted == len(ps) * (3 * (B - 1) + room - 1)
    assert eng.stats.drafts == len(ps) * (3 + (room > 1))


def test_ragged_acceptance_in_one_batch(engines):
    ar, _ = engines
    ps = prompts(ar.tok, 8)
    ref, sp = _reference(ar, ps, 50)
    rng = random.Random(3)
    oracle = Oracle(ref, ar.target.vocab_size, lambda s: rng.randint(0, B - 1))
    eng = with_proposer(ar, oracle)
    got = generate(eng, ps, sp)
    assert ids(got) == [ref[tuple(p)] for p in ps]
    # each step advanced a row by exactly k + 1 tokens (unless max_tokens cut it)
    by_req: dict[str, list] = {}
    for req, n_out, k in oracle.log:
        by_req.setdefault(req, []).append((n_out, k))
    for steps in by_req.values():
        for (n0, k), (n1, _) in zip(steps, steps[1:]):
            assert n1 - n0 == k + 1
    assert len({k for _, _, k in oracle.log}) > 2 and max(len(v) for v in by_req.values()) > 3


def test_sampling_runs_and_respects_top_k_1(engines):
    ar, df = engines
    ps = prompts(ar.tok, 4)
    greedy = ids(generate(ar, ps, SamplingParams(max_tokens=15, ignore_eos=True)))
    topk1 = ids(generate(df, ps, SamplingParams(temperature=0.9, top_k=1, max_tokens=15, ignore_eos=True)))
    assert topk1 == greedy
    hot = generate(df, ps, SamplingParams(temperature=1.5, max_tokens=15, ignore_eos=True))
    assert all(len(s.out) == 15 for s in hot)


def _edit_config(drafter_dir, tmp_path, **changes):
    import shutil

    out = tmp_path / "bad"
    shutil.copytree(drafter_dir, out)
    cfg = json.loads((out / "config.json").read_text())
    for k, v in changes.items():
        if k in ("target_layer_ids", "mask_token_id"):
            cfg["dflash_config"][k] = v
        else:
            cfg[k] = v
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"hidden_size": 96}, "hidden size 96 does not match"),
        ({"target_layer_ids": [0, 9]}, "target has 4 layers"),
        ({"vocab_size": 1000}, "vocabulary of 1000 tokens"),
        ({"num_hidden_layers": 3}, "weights do not match"),
        ({"mask_token_id": 5000}, "outside the target's vocabulary"),
        ({"block_size": None}, "not a DFlash drafter"),
    ],
)
def test_drafter_that_does_not_fit_is_a_clear_error(pair, tmp_path, changes, message):
    target, drafter = pair
    bad = _edit_config(drafter, tmp_path, **changes)
    with pytest.raises(UserError, match=message):
        build(EngineConfig(str(target), str(bad), mode="dflash", max_slots=1, max_model_len=64, device="cpu"))


def test_drafter_checkpoint_is_zlab_format(pair):
    from safetensors.torch import load_file

    _, drafter = pair
    cfg = json.loads((drafter / "config.json").read_text())
    assert cfg["block_size"] == B and set(cfg["dflash_config"]) >= {"mask_token_id", "target_layer_ids"}
    keys = set(load_file(str(drafter / "model.safetensors")))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_proj.weight",
            "layers.1.mlp.down_proj.weight", "layers.0.self_attn.k_norm.weight"} <= keys
    assert not any(k.startswith(("model.", "embed", "lm_head")) for k in keys)
    n_layers = cfg["num_hidden_layers"]
    assert len(keys) == 3 + 11 * n_layers  # 58 tensors for z-lab's 5-layer drafters


def test_hybrid_recurrent_target_is_refused(tmp_path):
    from transformers import AutoModelForCausalLM, Qwen3NextConfig

    from dflash_bench.testing.tiny import make_tokenizer

    cfg = Qwen3NextConfig(vocab_size=272, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=16, num_experts=2, num_experts_per_tok=1,
                          moe_intermediate_size=16, shared_expert_intermediate_size=16, linear_num_value_heads=2,
                          linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    make_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(UserError, match="linear_attention layers"):
        build(EngineConfig(str(tmp_path), mode="ar", max_slots=1, max_model_len=64, device="cpu"))


def test_seeded_sampling_is_reproducible_whatever_the_batch(engines):
    _, df = engines
    ps = prompts(df.tok, 4)
    hot = dict(temperature=1.0, max_tokens=24, ignore_eos=True)
    alone = ids(generate(df, [ps[0]], SamplingParams(seed=7, **hot)))[0]
    mixed = [SamplingParams(seed=7, **hot)] + [SamplingParams(**hot) for _ in ps[1:]]
    assert ids(generate(df, ps, mixed))[0] == alone
    others = {tuple(ids(generate(df, [ps[0]], SamplingParams(seed=s, **hot)))[0]) for s in (1, 2, 3)}
    assert len(others | {tuple(alone)}) > 1  # the seed matters


def test_loop_serves_the_good_requests_when_one_prefill_fails(engines):
    import queue as q

    from dflash_bench.engine.serving.loop import EngineLoop

    ar, _ = engines
    free = len(ar.free_slots)
    loop = EngineLoop(ar)
    inbox: q.SimpleQueue = q.SimpleQueue()
    sp = SamplingParams(max_tokens=5, ignore_eos=True)
    for name, prompt in [("a", [1, 2, 3]), ("bad", [1, 10**6]), ("b", [4, 5])]:
        loop.submit(name, prompt, sp, lambda d, name=name: inbox.put((name, d)))
    loop.start()  # all three are waiting: one batched prefill, which fails, then one by one
    try:
        got: dict = {}
        while len(got) < 3:
            name, d = inbox.get(timeout=30)
            if isinstance(d, Exception) or d.finish:
                got[name] = d
    finally:
        loop.stop()
    assert isinstance(got["bad"], Exception)
    assert got["a"].completion_tokens == 5 and got["b"].completion_tokens == 5
    assert len(ar.free_slots) == free


def test_an_abort_right_after_submit_drops_the_request(engines):
    """The abort can land after the loop emptied its inbox but before it reads the aborted ids."""
    from dflash_bench.engine.serving.loop import EngineLoop

    ar, _ = engines
    loop = EngineLoop(ar)  # not started: the steps of its thread are run by hand, in the racy order
    loop._take(block=False)
    loop.submit("gone", [1, 2, 3], SamplingParams(max_tokens=5), lambda d: None)
    loop.abort("gone")
    loop._drop_aborted()
    loop._take(block=False)
    assert not loop.waiting


def test_health_says_503_when_the_engine_thread_is_gone(engines):
    from fastapi.testclient import TestClient

    from dflash_bench.engine.serving.loop import EngineLoop
    from dflash_bench.engine.serving.api_server import build_app

    ar, _ = engines
    loop = EngineLoop(ar)
    client = TestClient(build_app(loop, "tiny"))
    assert client.get("/health").status_code == 503  # never started
    loop.start()
    try:
        assert client.get("/health").status_code == 200
    finally:
        loop.stop()
    assert client.get("/health").status_code == 503


def test_admitting_more_requests_than_free_slots_fails_without_taking_any(engines):
    ar, _ = engines
    sp = SamplingParams(max_tokens=5, ignore_eos=True)
    held = [ar.add(str(i), [1, 2, 3], sp)[0] for i in range(len(ar.free_slots) - 1)]  # one slot left
    try:
        with pytest.raises(RuntimeError, match="every slot is taken"):
            ar.add_many([("x", [1, 2], sp), ("y", [3, 4], sp)])
        assert len(ar.free_slots) == 1
    finally:
        for s in held:
            ar.release(s)


def test_request_success_counts_finished_requests_only(engines):
    ar, _ = engines
    before = ar.stats.requests
    generate(ar, prompts(ar.tok, 2), SamplingParams(max_tokens=3, ignore_eos=True))
    assert ar.stats.requests == before + 2
    seq, _ = ar.add("aborted", [1, 2, 3], SamplingParams(max_tokens=50, ignore_eos=True))
    ar.step([seq])
    ar.release(seq)  # the client went away
    assert ar.stats.requests == before + 2


def test_two_engines_decode_on_two_threads_at_once(pair):
    """Each thread's forward has its own attention state: two engines in one process do not mix their caches."""
    import threading

    target, drafter = pair
    engs = [build(EngineConfig(str(target), mode="ar", max_slots=4, max_model_len=256, dtype="float64", device="cpu")),
            build(EngineConfig(str(target), str(drafter), mode="dflash", max_slots=4, max_model_len=256, dtype="float64", device="cpu"))]
    ps = prompts(engs[0].tok, 4)
    sp = SamplingParams(max_tokens=40, ignore_eos=True)
    want = ids(generate(engs[0], ps, sp))
    got, errors = {}, []

    def work(i):
        try:
            got[i] = [ids(generate(engs[i], ps, sp)) for _ in range(3)]
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and got[0] == got[1] == [want] * 3


def test_a_drafter_made_from_a_bare_config_is_saved_as_zlab_writes_them(tmp_path):
    """engine_speed builds drafters from a bare dict: saved, they must still name their model class
    (vLLM refuses a config.json without model_type) and their weights' dtype (SGLang assumed float16 without it),
    while a real drafter's keys are kept as they were."""
    from dflash_bench.engine.reference.drafter import DFlashDrafter, DrafterConfig, load_drafter, save_drafter

    bare = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
            "block_size": 4, "dflash_config": {"mask_token_id": 63, "target_layer_ids": [0]}}
    save_drafter(DFlashDrafter(DrafterConfig.from_dict(bare)).to(torch.bfloat16), tmp_path / "bare")
    cfg = json.loads((tmp_path / "bare" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3" and cfg["dtype"] == "bfloat16"
    assert cfg["num_key_value_heads"] == 2 and cfg["head_dim"] == 16 and cfg["dflash_config"] == bare["dflash_config"]
    load_drafter(tmp_path / "bare", target_hidden=32, target_layers=1, target_vocab=64, dtype=None, device="cpu")
    own = {**bare, "model_type": "llama", "rope_theta": 500000.0, "torch_dtype": "float16"}
    save_drafter(DFlashDrafter(DrafterConfig.from_dict(own)), tmp_path / "own")
    cfg = json.loads((tmp_path / "own" / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["rope_theta"] == 500000.0 and "dtype" not in cfg
