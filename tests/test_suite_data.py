"""The embedded pair's training material: nothing `dflash-bench demo` sends is trained on, whichever suite
repeats it, and the material is split between the target and the drafter."""

from __future__ import annotations

import random

import pytest

from dflash_bench.suites import load_prompts
from dflash_bench.sweep.commands import DEMO_CONCURRENCY
from dflash_bench.train import suite_data as sd


@pytest.fixture(scope="module")
def material(data_dir):
    held = sd.held_out(data_dir)
    records = sd.train_records(data_dir, held)
    return held, records


def _demo_prompts(data_dir):
    """What the demo sends at its defaults: per suite the first max(concurrency) prompts of the seed-0 order
    (warm-ups are the same prompts with a prefix)."""
    n = max(DEMO_CONCURRENCY)
    return [p for s in sd.SUITES for p in load_prompts(s, data_dir=data_dir, num_prompts=n, seed=0)]


def test_no_prompt_the_demo_sends_is_trained_on(material, data_dir):
    held, records = material
    demo = _demo_prompts(data_dir)
    assert {p.id for p in demo} <= held.ids
    trained_ids = {p.id for p in records}
    assert not trained_ids & {p.id for p in demo}
    texts = [sd.normalise(t) for p in records for t in p.turns]
    pairs = sd.answer_pairs(records, data_dir, held)
    texts += [sd.normalise(u) for u, _ in pairs]
    for p in demo:  # no training prompt holds a demo turn, or is held in one
        for turn in p.turns:
            t = sd.normalise(turn)
            if len(t) >= sd.MIN_OVERLAP:
                assert not any(t in x or x in t for x in texts if len(x) >= sd.MIN_OVERLAP), p.id


def test_a_question_repeated_by_another_suite_is_held_out_there_too(material, data_dir):
    """Spec-Bench repeats GSM8K test questions (its math_reasoning items): those of held-out GSM8K prompts are
    not trained on under Spec-Bench's name either."""
    held, records = material
    gsm = load_prompts("gsm8k", data_dir=data_dir, num_prompts=sd.HOLD, seed=0)
    questions = [sd.normalise(p.turns[0].split("\nPlease reason")[0]) for p in gsm]
    spec = [p for p in load_prompts("spec-bench", data_dir=data_dir) if p.category == "math_reasoning"]
    repeated = [p for p in spec if any(q in sd.normalise(p.turns[0]) for q in questions)]
    assert repeated  # the data does repeat them: otherwise this test checks nothing
    assert not {p.id for p in repeated} & {p.id for p in records}


def test_mbpp_full_file_leaves_out_held_out_tasks_and_the_drafters(material, data_dir):
    held, records = material
    theirs = [p for p in records if p.suite == "mbpp"][:5]
    pairs = sd._mbpp_full(data_dir, held, {int(p.meta["task_id"]) for p in theirs})
    assert pairs
    for p in theirs:
        code = sd._code(p.reference)
        assert not any(code in a for _, a in pairs)


def test_answers_carry_their_task_openers(material, data_dir):
    held, records = material
    by_suite = {}
    for u, a in sd.answer_pairs(records, data_dir, held):
        by_suite.setdefault(next((p.suite for p in records if p.turns[0] == u), "mbpp-full"), a)
    assert by_suite["gsm8k"].startswith(sd.STEPS) and "\\boxed{" in by_suite["gsm8k"]
    assert by_suite["humaneval"].startswith("Here is the completed function:\n```python\n")
    assert by_suite["mbpp-full"].startswith(sd.CODE + "```python\n")


def test_split_records_is_a_deterministic_partition_per_suite(material):
    _, records = material
    a, b = sd.split_records(records, 0.5, seed=3)
    assert sorted(p.id for p in a + b) == sorted(p.id for p in records)
    assert not {p.id for p in a} & {p.id for p in b}
    for s in sd.SUITES:
        n = sum(p.suite == s for p in records)
        assert abs(sum(p.suite == s for p in b) - n / 2) <= 0.5
    assert [p.id for p in sd.split_records(records, 0.5, seed=3)[1]] == [p.id for p in b]


def test_summary_pairs_are_the_first_two_sentences():
    held = sd.HeldOut(frozenset(), (), frozenset())
    text = "The queue holds items. It is thread safe. Use put and get. Nothing else."
    assert sd.summary_pairs([text, "Too short. Two."], held) == [(f"Summarize: {text}", "The queue holds items. It is thread safe.")]


def test_vary_numbers_redraws_whole_numbers_only():
    text = "Tom has 12 apples and 3.5 pears in room B12; he buys 7 more."
    out = sd.vary_numbers(text, random.Random(0))
    assert out != text
    words, new = text.split(), out.split()
    assert len(words) == len(new)
    for w, x in zip(words, new):
        if w.rstrip(";.").isdigit():
            assert len(x.rstrip(";.")) == len(w.rstrip(";.")) and x.rstrip(";.").isdigit()
        else:
            assert x == w  # 3.5 and B12 are not whole numbers on their own
