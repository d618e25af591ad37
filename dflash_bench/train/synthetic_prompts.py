"""More prompts like the demo's open-ended and code suites, written from text the pair may train on.

The suites give the drafter few prompts of some kinds once the demo's are held out: 6 MT-Bench records, 50
HumanEval ones. A drafter learns the target's answers to the kinds of prompt it was trained on, and the tiny
target answers an unfamiliar request its own way (often a loop), so a drafter that never saw such requests
guesses there (τ 2.2 on MT-Bench, 3.3 on HumanEval, against 9.1 on GSM8K). These prompts are requests of the
same kinds over other text: a suite's instruction styles (MT-Bench's eight categories, Spec-Bench's tasks) filled
with passages from the standard library's documentation and the suites' own training records, and HumanEval's
wrapper around standard-library functions' signatures and docstrings. Only their form is the suites'; every
prompt is checked against the held-out ones by the caller, as every other training prompt is.
"""

from __future__ import annotations

import ast
import random
import re

from dflash_bench.suite_file import get_suite

# MT-Bench's categories (writing, roleplay, reasoning, math, coding, extraction, stem, humanities) and
# Spec-Bench's tasks (translation, summarization, qa, rag), as requests about a topic or over a passage
ABOUT = (
    "Compose an engaging blog post about {t}, highlighting what a newcomer should know.",
    "Write a persuasive essay arguing for {t}.",
    "Draft a short, professional email to a colleague explaining {t}.",
    "Write a poem about {t}.",
    "Help me construct a catchy headline for an article on {t}.",
    "Pretend you are a teacher. Explain {t} to a class of beginners.",
    "Act as an expert consultant. A client asks you about {t}. What do you tell them?",
    "Describe {t} in three sentences, then give one example.",
    "Discuss the advantages and disadvantages of {t}.",
    "Compare {t} with a common alternative and explain when to use each.",
    "What are the most common mistakes people make with {t}? Give a numbered list.",
    "Explain {t} in simple terms, as if to a ten-year-old.",
    "Develop a Python program that demonstrates {t}.",
    "Write a function that uses {t} and explain how it works.",
    "Imagine you are a historian. How did {t} come about, and why does it matter?",
    "Suggest five creative project ideas that involve {t}.",
)
OVER = (
    "Summarize: {p}",
    "Summarize the following passage in two sentences:\n{p}",
    "Translate German to English: {p}",
    "Identify the named entities (people, organizations, locations) mentioned in the following text. Return them "
    "as a JSON dictionary.\n\n{p}",
    "Read the below passage carefully and answer the question with an explanation:\n{p}\nWhat is its main point?",
    "Evaluate the following text on a scale of 1 to 5, with 1 being very poor and 5 being excellent:\n{p}",
    "Extract the key facts from this passage and present them as a bulleted list:\n{p}",
    "Rewrite the following text in a formal tone:\n{p}",
    "Given the following context, answer the question.\nContext: {p}\nQuestion: What does the text describe?",
    "Edit the following paragraph to correct any grammatical errors:\n{p}",
    "{p}\n\nBased on the passage above, write three questions a student might ask.",
)
_WORDS = re.compile(r"[A-Za-z][A-Za-z ,'-]{12,80}")


def topics(doc_pairs: list[tuple[str, str]]) -> list[str]:
    """Short topics: the documentation's section names ("Explain X." -> "X") and its docstrings' first clauses."""
    out = []
    for u, _ in doc_pairs:
        if u.startswith("Explain "):
            if "(part" not in u:
                out.append(u[len("Explain "):].rstrip("."))
        elif not u.startswith("Write part"):
            m = _WORDS.match(u)
            if m:
                out.append(m.group().strip(" ,'-").lower())
    return sorted(set(out))


def phrases(texts: list[str], rng: random.Random, per_text: int = 2) -> list[str]:
    """Topics in plain English: runs of 3 to 7 words from the texts' sentences ("a local bakery sells muffins")."""
    out = []
    for t in texts:
        words = [w.strip("\"'()[]{}:;,.?!") for w in t.split()]
        words = [w for w in words if w.isalpha()]
        for _ in range(per_text if len(words) >= 8 else 0):
            k = rng.randint(3, 7)
            i = rng.randrange(0, len(words) - k)
            out.append(" ".join(words[i:i + k]).lower())
    return sorted(set(out))


def passages(texts: list[str], rng: random.Random, max_chars: int = 600) -> list[str]:
    """A paragraph of each text (at most `max_chars`, cut at a sentence where it can be)."""
    out = []
    for t in texts:
        paras = [p for p in t.split("\n\n") if len(p.split()) >= 8]
        if not paras:
            continue
        p = " ".join(rng.choice(paras).split())
        if len(p) > max_chars:
            cut = p.rfind(". ", 0, max_chars)
            p = p[: cut + 1] if cut > 40 else p[:max_chars]
        out.append(p)
    return out


def chat_prompts(topic_list: list[str], passage_list: list[str], n: int, rng: random.Random) -> list[str]:
    """`n` requests like MT-Bench's and Spec-Bench's: half about a topic, half over a passage (fewer when the
    material runs short; no prompt twice)."""
    made: set[str] = set()
    for _ in range(4 * n):
        if len(made) >= n:
            break
        if rng.random() < 0.5 and topic_list:
            made.add(rng.choice(ABOUT).format(t=rng.choice(topic_list)))
        elif passage_list:
            made.add(rng.choice(OVER).format(p=rng.choice(passage_list)))
    return sorted(made)


def code_prompts(code_pairs: list[tuple[str, str]], n: int, rng: random.Random) -> list[str]:
    """`n` requests like HumanEval's: a standard-library function's signature and docstring, its body left to
    write, in HumanEval's wrapper."""
    heads = [h for h in (_head(code) for _, code in code_pairs if code.startswith("def ")) if h]
    rng.shuffle(heads)
    template = get_suite("humaneval").template  # suites/humaneval.toml: the wrapper around the record's {prompt}
    return [template.replace("{prompt}", "\n" + h + "\n") for h in heads[:n]]


def _head(code: str) -> str | None:
    """A function's `def` line(s) and docstring, without its body (None when it has no docstring)."""
    try:
        fn = ast.parse(code).body[0]
    except (SyntaxError, IndexError):
        return None
    if not isinstance(fn, ast.FunctionDef) or not fn.body or ast.get_docstring(fn) is None:
        return None
    lines = code.splitlines()
    return "\n".join(lines[: fn.body[0].end_lineno])
