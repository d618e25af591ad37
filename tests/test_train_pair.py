"""The committed tiny pair (dflash_bench/assets/default_pair): small, bf16, loads strictly, its drafter accepts
long runs of drafts on the demo's own prompts (held out of its training), and DFlash output stays identical to AR."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from dflash_bench.engine.build import build  # noqa: E402
from dflash_bench.engine.config import EngineConfig  # noqa: E402
from dflash_bench.engine.reference.decode import generate  # noqa: E402
from dflash_bench.engine.sampling_params import SamplingParams  # noqa: E402

pytestmark = pytest.mark.engine
PAIR = Path(__file__).resolve().parents[1] / "dflash_bench" / "assets" / "default_pair"
# prompts written for this test (not in the training data, not from a benchmark)
PROMPTS = [
    "Return the number of items waiting in the queue.",
    "Open the file and return its lines without trailing newlines.",
    "Explain the for statement.",
    "Write a function that checks whether a string is a palindrome.",
]


def test_pair_is_small_bf16_with_tokenizer_and_chat_template():
    files = [f for f in PAIR.rglob("*") if f.is_file()]
    assert sum(f.stat().st_size for f in files) <= 20_000_000
    from safetensors import safe_open

    for part in ("target", "drafter"):
        with safe_open(str(PAIR / part / "model.safetensors"), "pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    assert (PAIR / "target" / "tokenizer.json").is_file()
    conf = json.loads((PAIR / "drafter" / "config.json").read_text())
    assert conf["architectures"] == ["DFlashDraftModel"] and conf["block_size"] == 16
    target = json.loads((PAIR / "target" / "config.json").read_text())  # transformers 4 (z-lab's) reads only this
    assert target["rope_theta"] == target["rope_parameters"]["rope_theta"] == conf["rope_theta"]


@pytest.mark.parametrize("suite", ["gsm8k", "math500", "humaneval", "mbpp", "mt-bench", "spec-bench"])
def test_pair_accepts_long_drafts_on_the_demos_prompts(suite, data_dir):
    """The first four prompts the demo sends (never trained on: tests/test_suite_data.py), 32 tokens as the demo
    asks: at least 3.5 tokens per verify on every suite the demo runs (the bar the embedded pair is held to; measured 9.7, 6.4, 4.8,
    5.9, 5.3, 7.4), token for token what AR says."""
    from dflash_bench.suites import load_prompts

    kw = dict(max_slots=4, max_model_len=1024, dtype="float32", device="cpu")
    ar = build(EngineConfig(str(PAIR / "target"), mode="ar", **kw))
    df = build(EngineConfig(str(PAIR / "target"), str(PAIR / "drafter"), mode="dflash", **kw))
    tok = df.tok
    ids = [tok(tok.apply_chat_template([{"role": "user", "content": p.turns[0]}], tokenize=False,
                                       add_generation_prompt=True), add_special_tokens=False).input_ids
           for p in load_prompts(suite, data_dir=data_dir, num_prompts=4, seed=0)]
    params = SamplingParams(max_tokens=32)
    assert [s.out for s in generate(df, ids, params)] == [s.out for s in generate(ar, ids, params)]
    assert 1 + df.stats.accepted / df.stats.drafts >= 3.5


def test_pair_drafts_are_accepted_and_output_equals_ar():
    kw = dict(max_slots=len(PROMPTS), max_model_len=512, dtype="float32", device="cpu")
    ar = build(EngineConfig(str(PAIR / "target"), mode="ar", **kw))
    df = build(EngineConfig(str(PAIR / "target"), str(PAIR / "drafter"), mode="dflash", **kw))
    tok = df.tok
    ids = [tok(tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True),
               add_special_tokens=False).input_ids for p in PROMPTS]
    params = SamplingParams(max_tokens=96)
    want = [s.out for s in generate(ar, ids, params)]
    got = [s.out for s in generate(df, ids, params)]
    assert got == want
    tau = 1 + df.stats.accepted / df.stats.drafts
    assert tau > 1.5, tau
