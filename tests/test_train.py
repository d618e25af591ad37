"""DFlash drafter training: the training forward is the engine's drafter, blocks are isolated, training raises
the acceptance measured by the engine's decode loop, and the saved checkpoint loads strictly."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

from dflash_bench.engine.build import build  # noqa: E402
from dflash_bench.engine.config import EngineConfig  # noqa: E402
from dflash_bench.engine.reference.decode import generate  # noqa: E402
from dflash_bench.engine.sampling_params import SamplingParams  # noqa: E402
from dflash_bench.testing.tiny import make_tiny_pair  # noqa: E402
from dflash_bench.errors import UserError  # noqa: E402
from dflash_bench.train import loss as L  # noqa: E402
from dflash_bench.train.data import read_prompts  # noqa: E402
from dflash_bench.train.train_drafter import DrafterTrainConfig, FrozenTarget, build_target_layer_ids, train_drafter  # noqa: E402

pytestmark = pytest.mark.engine
WORDS = "the cat sat on a mat while seven dogs ran past quickly".split()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_tiny_pair(tmp_path_factory.mktemp("pair"), seed=3, block_size=6)


def _prompts(n: int, seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    return [[{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 10)))}] for _ in range(n)]


def test_block_logits_equal_the_engine_draft(pair):
    """The batched training forward at an anchor gives the engine's draft logits for the same state."""
    target, drafter = pair
    e = build(EngineConfig(str(target), str(drafter), mode="dflash", max_slots=2, max_model_len=256, dtype="float64", device="cpu"))
    seq, _ = e.add("0", e.tok("the cat sat on a mat while").input_ids, SamplingParams(max_tokens=40, ignore_eos=True))
    for _ in range(2):  # context now holds prompt and verify-step features
        e.step([seq])
    _, want = e.proposer.propose([seq])
    tgt = FrozenTarget(str(target), "cpu", torch.float64)
    tgt.tap(e.proposer.layer_ids)
    ids = torch.tensor([seq.prompt + seq.out])
    got = L.block_logits(e.proposer.drafter, tgt.embed_weight, tgt.lm_head, ids, tgt.features(ids),
                         torch.tensor([[seq.start, 2]]))
    torch.testing.assert_close(got[0, 0], want[0], rtol=1e-9, atol=1e-9)


def test_blocks_see_only_earlier_context_and_themselves(pair):
    target, drafter = pair
    e = build(EngineConfig(str(target), str(drafter), mode="dflash", max_slots=1, max_model_len=64, dtype="float64", device="cpu"))
    tgt = FrozenTarget(str(target), "cpu", torch.float64)
    tgt.tap(e.proposer.layer_ids)
    ids = torch.randint(0, 256, (1, 30))
    anchors = torch.tensor([[10, 20]])

    def logits(x):
        return L.block_logits(e.proposer.drafter, tgt.embed_weight, tgt.lm_head, x, tgt.features(x), anchors)[0]

    base = logits(ids)
    later = ids.clone()
    later[0, 12:] = (later[0, 12:] + 1) % 256  # after anchor 10 (and its block's labels), incl. anchor 20's token
    out = logits(later)
    torch.testing.assert_close(out[0], base[0])  # block 10 sees nothing at positions > 10
    assert not torch.allclose(out[1], base[1])  # block 20 sees context 12..19 and its own anchor token
    earlier = ids.clone()
    earlier[0, 9] = (earlier[0, 9] + 1) % 256
    assert not torch.allclose(logits(earlier)[0], base[0])


def test_loss_weights_and_labels():
    w = L.position_weights(16, 7.0)
    assert w[0] == 1.0 and torch.isclose(w[7], torch.exp(torch.tensor(-1.0)))
    ids = torch.arange(20)[None]
    anchors, valid = torch.tensor([[3, 17]]), torch.tensor([[True, True]])
    logits = torch.full((1, 2, 3, 20), -10.0)
    for n, a in enumerate([3, 17]):
        for k in range(3):
            logits[0, n, k, min(a + k + 1, 19)] = 10.0  # right at every slot
    loss, stats = L.dflash_loss(logits, ids, torch.tensor([19]), anchors, valid, 7.0)
    assert loss < 1e-3
    # anchor 3: 3 drafts accepted; anchor 17: only position 18 is a label (length 19) -> 1 accepted
    assert stats["acc_len"].item() == pytest.approx(1 + (3 + 1) / 2)


def test_anchors_are_response_positions_with_a_label():
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[0, 4:10] = True
    mask[1, 8:9] = True
    anchors, valid = L.select_anchors(mask, torch.tensor([10, 9]), 8, torch.Generator().manual_seed(0))
    assert sorted(anchors[0][valid[0]].tolist()) == [4, 5, 6, 7, 8]
    assert valid[1].sum() == 0  # its only response token is the last one: no label after it


def test_target_layer_ids_follow_zlab_spacing():
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert build_target_layer_ids(6, 3) == [1, 2, 3]


def _tau(target, drafter, prompts) -> float:
    e = build(EngineConfig(str(target), str(drafter), mode="dflash", max_slots=len(prompts), max_model_len=256, device="cpu"))
    ids = [e.tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"] for m in prompts]
    generate(e, ids, SamplingParams(max_tokens=48))
    return 1 + e.stats.accepted / max(1, e.stats.drafts)


@pytest.mark.slow
def test_training_raises_acceptance_and_saves_zlab_format(pair, tmp_path):
    target, untrained = pair
    out = tmp_path / "drafter"
    cfg = DrafterTrainConfig(steps=150, block_size=6, layers=1, batch=8, anchors=16, max_new_tokens=48, lr=3e-3)
    prompts = _prompts(48, seed=0)
    train_drafter(str(target), prompts, str(out), cfg, log=lambda m: None)
    # a random target's continuations are memorised, not generalised: measure on prompts it trained on
    before, after = _tau(target, untrained, prompts[:8]), _tau(target, out, prompts[:8])
    assert before < 1.2
    assert after > before + 0.6, (before, after)
    conf = json.loads((out / "config.json").read_text())
    assert conf["block_size"] == 6 and conf["dflash_config"]["mask_token_id"] >= 261
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert {f.get_tensor(k).dtype for k in keys} == {torch.bfloat16}
    assert {"fc.weight", "hidden_norm.weight", "norm.weight"} <= keys and not any("embed" in k or "lm_head" in k for k in keys)


def test_read_prompts_formats(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]})
                 + "\n" + json.dumps({"prompt": "add two numbers"}) + "\n")
    (tmp_path / "q.txt").write_text("first prompt\n\nsecond\nprompt\n")
    assert read_prompts(f) == [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "add two numbers"}]]
    assert len(read_prompts(tmp_path)) == 4
    (tmp_path / "bad.jsonl").write_text('{"answer": 1}\n')
    with pytest.raises(UserError, match="bad.jsonl line 1"):
        read_prompts(tmp_path / "bad.jsonl")
    with pytest.raises(UserError, match="no training data"):
        read_prompts(tmp_path / "missing")


@pytest.mark.parametrize("extra, message", [
    (["--target-layers", "1,x"], "--target-layers must be"),
    (["--data", "MISSING"], "no training data"),
    (["--cut-blocks", "1.5"], "--cut-blocks is a share"),
])
def test_cli_bad_input_is_one_sentence(pair, tmp_path, extra, message):
    target, _ = pair
    (tmp_path / "p.txt").write_text("hello\n")
    args = ["--target", str(target), "--data", str(tmp_path / "p.txt"), "--out", str(tmp_path / "d"), "--device", "cpu"]
    args += [str(tmp_path / a) if a == "MISSING" else a for a in extra]
    r = subprocess.run([sys.executable, "-m", "dflash_bench", "train-drafter", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr


def test_a_cut_block_drafts_as_a_block_of_that_length(pair):
    """Blocks cut to l slots (what an engine drafting fewer positions runs) give, at their slots, the logits of
    a drafter whose block is l long, and nothing past them reaches the slots before."""
    import copy

    target, drafter = pair
    e = build(EngineConfig(str(target), str(drafter), mode="dflash", max_slots=1, max_model_len=64, dtype="float64", device="cpu"))
    tgt = FrozenTarget(str(target), "cpu", torch.float64)
    tgt.tap(e.proposer.layer_ids)
    ids = torch.randint(0, 256, (1, 30))
    feats = tgt.features(ids)
    anchors = torch.tensor([[8, 17]])
    d = e.proposer.drafter
    full = L.block_logits(d, tgt.embed_weight, tgt.lm_head, ids, feats, anchors)
    cut = L.block_logits(d, tgt.embed_weight, tgt.lm_head, ids, feats, anchors, torch.tensor([[3, 6]]))
    short = copy.copy(d)
    short.config = copy.copy(d.config)
    short.config.block_size = 3
    want = L.block_logits(short, tgt.embed_weight, tgt.lm_head, ids, feats, anchors)
    torch.testing.assert_close(cut[0, 0, :2], want[0, 0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(cut[0, 1], full[0, 1])  # the second block was not cut (6 = B)
    assert not torch.allclose(cut[0, 0, :2], full[0, 0, :2])  # the cut changed what the first block sees


def test_block_lengths_mix_whole_and_cut_blocks():
    g = torch.Generator().manual_seed(0)
    n = L.block_lengths((4, 256), 16, 0.5, g)
    assert n.min() >= 2 and n.max() == 16
    whole = (n == 16).float().mean().item()
    assert 0.4 < whole < 0.6 and len(set(n[n < 16].tolist())) == 14  # 2..15 all drawn
    assert (L.block_lengths((2, 8), 16, 0.0, g) == 16).all()


def test_slots_past_a_cut_are_not_trained():
    ids = torch.arange(20)[None]
    anchors, valid = torch.tensor([[3]]), torch.tensor([[True]])
    logits = torch.full((1, 1, 5, 20), -10.0)
    for k in range(2):
        logits[0, 0, k, 3 + k + 1] = 10.0  # slots 1 and 2 right, 3..5 wrong
    loss, stats = L.dflash_loss(logits, ids, torch.tensor([20]), anchors, valid, 7.0, torch.tensor([[3]]))
    assert loss < 1e-3 and stats["acc_len"].item() == 3.0
    whole, _ = L.dflash_loss(logits, ids, torch.tensor([20]), anchors, valid, 7.0)
    assert whole > 1.0
