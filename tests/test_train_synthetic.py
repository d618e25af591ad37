"""dflash_bench.train.synthetic_prompts: requests like the demo's open-ended and code suites, built from other text."""

from __future__ import annotations

import ast
import random

from dflash_bench.suites import load_prompts
from dflash_bench.train import synthetic_prompts as synthetic

CODE = '''def clamp(x, lo, hi):
    """Return x limited to the range [lo, hi].

    Values below lo give lo, values above hi give hi."""
    if x < lo:
        return lo
    return min(x, hi)
'''


def test_code_prompts_wrap_a_signature_and_docstring_as_humaneval_does(data_dir):
    [real] = load_prompts("humaneval", data_dir=data_dir, num_prompts=1, seed=0)
    pairs = [("Return x limited.", CODE), ("A class.", "class A:\n    '''doc'''\n"),
             ("No docstring.", "def f(x):\n    return x\n")]
    [prompt] = synthetic.code_prompts(pairs, 5, random.Random(0))
    head, _, rest = prompt.partition("```python\n")
    assert real.turns[0].startswith(head + "```python\n") and prompt.endswith("\n```") and real.turns[0].endswith("\n```")
    fn = ast.parse(rest.rsplit("```", 1)[0]).body[0]
    assert isinstance(fn, ast.FunctionDef) and fn.name == "clamp"
    assert len(fn.body) == 1 and ast.get_docstring(fn).endswith("give hi.")  # the body is left to write


def test_chat_prompts_are_distinct_requests_about_topics_and_over_passages():
    rng = random.Random(0)
    topics = synthetic.topics([("Explain assert.", "doc"), ("Explain assert (part 2).", "more"),
                               ("Return the sum of the numbers in a list.", "def s(xs): ...")])
    assert topics == ["assert", "return the sum of the numbers in a list"]
    passages = synthetic.passages(["Short.\n\n" + "A long paragraph about the weather and the sea. " * 30], rng,
                                  max_chars=200)
    assert len(passages) == 1 and len(passages[0]) <= 200 and passages[0].endswith(".")
    made = synthetic.chat_prompts(topics, passages, 20, rng)
    assert len(made) == len(set(made)) == 20
    assert any(t in m for m in made for t in topics) and any(passages[0] in m for m in made)


def test_phrases_are_runs_of_plain_words():
    got = synthetic.phrases(["Natalia sold clips to 48 of her friends in April, and then she sold half as many."],
                            random.Random(1), per_text=5)
    assert got and all(3 <= len(p.split()) <= 7 and p == p.lower() and p.replace(" ", "").isalpha() for p in got)
