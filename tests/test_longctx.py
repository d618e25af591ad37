"""Long prompts built from the real offline Spec-Bench text, counted by a real tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_bench.errors import UserError
from dflash_bench.longctx import APPROX, build_prompts, length_label, token_counter
from dflash_bench.settings import parse_input_lens

ASSETS = Path(__file__).resolve().parents[1] / "dflash_bench" / "assets" / "default_pair" / "target"


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ASSETS))


@pytest.fixture(scope="module")
def source_text(data_dir) -> str:
    lines = (data_dir / "spec_bench" / "question.jsonl").read_text(encoding="utf-8").splitlines()
    return "\n".join(json.loads(line)["turns"][0] for line in lines)


def test_parse_input_lens():
    assert parse_input_lens("32k, 1k,4k,16k") == [1024, 4096, 16384, 32768]
    assert parse_input_lens("2000,0.5k") == [512, 2000]
    assert [length_label(n) for n in parse_input_lens("1k,2000")] == ["1k", "2000"]


@pytest.mark.parametrize("text, words", [("", "not a token count"), ("4k,fast", "'fast'"), ("1k,1024", "twice"),
                                         ("10", "under 64"), ("4 k", "not a token count")])
def test_parse_input_lens_refuses_in_one_sentence(text, words):
    with pytest.raises(UserError) as err:
        parse_input_lens(text)
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("target", [1024, 4096])
def test_prompts_hit_the_target_by_the_tokenizers_count(data_dir, tok, source_text, target):
    prompts = build_prompts(target, data_dir=data_dir, num_prompts=3, tokenizer=tok)
    assert len({p.id for p in prompts}) == 3
    for p in prompts:
        n = len(tok.encode(p.turns[0], add_special_tokens=False))
        assert p.meta["input_tokens"] == n
        assert target - 48 <= n <= target  # cut at whitespace: at most one word short
        assert p.meta["counted_by"].startswith("tokenizer")
        assert p.suite == f"long-{length_label(target)}"
        # real text only: every paragraph but the question comes from the dataset (the last one may be cut)
        body, _, _ = p.turns[0].rpartition("\n\nAnswer the question")
        assert all(par in source_text for par in body.split("\n\n"))


def test_every_length_asks_the_same_question_and_longer_means_more_text(data_dir, tok):
    short = build_prompts(1024, data_dir=data_dir, num_prompts=2, tokenizer=tok)
    long = build_prompts(4096, data_dir=data_dir, num_prompts=2, tokenizer=tok)
    for s, g in zip(short, long):
        assert s.meta["question"] == g.meta["question"] and s.meta["question"].endswith("?")
        assert s.turns[0].endswith(s.meta["question"]) and g.turns[0].endswith(s.meta["question"])
        assert s.id.split("/")[1] == g.id.split("/")[1]
        assert len(g.turns[0]) > 2 * len(s.turns[0])
    # neighbouring prompts start from other documents
    assert long[0].turns[0][:200] != long[1].turns[0][:200]


def test_no_document_is_repeated_within_a_prompt(data_dir):
    (p,) = build_prompts(32768, data_dir=data_dir, num_prompts=1)
    body = p.turns[0].rpartition("\n\nAnswer the question")[0]
    pars = [x for x in body.split("\n\n") if len(x) > 200]
    assert len(pars) == len(set(pars)) > 20


def test_without_a_tokenizer_the_count_is_the_stated_approximation(data_dir):
    (p,) = build_prompts(16384, data_dir=data_dir, num_prompts=1)
    assert p.meta["counted_by"] == APPROX
    assert p.meta["input_tokens"] == -(-len(p.turns[0]) // 4)
    assert 16384 - 48 <= p.meta["input_tokens"] <= 16384


def test_more_text_than_the_offline_sets_hold_is_refused(data_dir):
    with pytest.raises(UserError, match="offline documents hold only about"):
        build_prompts(400_000, data_dir=data_dir, num_prompts=1)


def test_a_length_shorter_than_the_passages_keeps_their_beginning_and_the_question(data_dir, tok):
    (p,) = build_prompts(300, data_dir=data_dir, num_prompts=1, tokenizer=tok)
    assert 300 - 48 <= p.meta["input_tokens"] <= 300
    assert p.turns[0].startswith("Some researchers state that forests")  # the first RAG record's passages
    assert p.turns[0].endswith(p.meta["question"])
    with pytest.raises(UserError, match="shorter than the question itself"):
        build_prompts(10, data_dir=data_dir, num_prompts=1, tokenizer=tok)


def test_a_missing_tokenizer_folder_is_one_sentence(tmp_path):
    with pytest.raises(UserError, match="cannot load the tokenizer"):
        token_counter(tmp_path / "nothing-here")
