"""Training material like the suites' prompts, with the prompts a demo or sweep sends held out.

The embedded pair is trained for the suites it is measured on (self-distillation on prompts like theirs, as
DFlash drafters are), so what it must never see is the prompts it is measured with. `held_out` takes, per
suite, the first `hold` prompts of the seed-0 order that `load_prompts(suite, num_prompts=N)` draws from (so
`dflash-bench demo` and any sweep of up to `hold` prompts per suite at seed 0 send only held-out prompts).
Every record whose text overlaps a held-out prompt is dropped from training, whichever suite it comes from
(Spec-Bench repeats MT-Bench's questions and GSM8K's): `is_held_out` compares whitespace-normalised text both
ways (either contains the other). MBPP's full file (its train and validation splits too) is held out by task
id as well, since its `text` words a task differently from the sanitized `prompt`.

What is trained on: the suites' other records, split in two (`split_records`). The target learns from one part's
worked answers (`answer_pairs`: GSM8K and MATH solutions, HumanEval and MBPP code, each with the opening line an
assistant of that task would write), and from extractive summaries (`summary_pairs`: a text's first sentences,
the classic lead baseline). The drafter learns from the target's own responses to the other part's prompts,
which the target never saw, as it will not have seen a demo's (`vary_numbers` makes more of them by drawing new
numbers into a prompt).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dflash_bench.suites import Prompt, load_prompts

SUITES = ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench", "spec-bench")  # what `dflash-bench demo` runs
HOLD = 64  # prompts per suite held out: the demo sends at most 32 (concurrency 32), warm-ups are those again
MIN_OVERLAP = 24  # characters: shorter texts are not compared (a bare "Hello" would match half the data)


@dataclass(frozen=True)
class HeldOut:
    """The held-out prompts: their ids, and the normalised text of every turn."""

    ids: frozenset[str]
    texts: tuple[str, ...]
    mbpp_task_ids: frozenset[int]

    def is_held_out(self, text: str) -> bool:
        t = normalise(text)
        if len(t) < MIN_OVERLAP:
            return False
        return any((h in t or t in h) for h in self.texts)


def normalise(text: str) -> str:
    return " ".join(text.split()).lower()


def held_out(data_dir: Path, hold: int = HOLD, suites: tuple[str, ...] = SUITES) -> HeldOut:
    ids: set[str] = set()
    texts: set[str] = set()
    mbpp: set[int] = set()
    for s in suites:
        for p in load_prompts(s, data_dir=data_dir, num_prompts=min(hold, len(load_prompts(s, data_dir=data_dir))),
                              seed=0):
            ids.add(p.id)
            texts.update(normalise(t) for t in p.turns if len(normalise(t)) >= MIN_OVERLAP)
            if s == "mbpp":
                mbpp.add(int(p.meta["task_id"]))
    return HeldOut(frozenset(ids), tuple(sorted(texts)), frozenset(mbpp))


def train_records(data_dir: Path, held: HeldOut, suites: tuple[str, ...] = SUITES) -> list[Prompt]:
    """Every suite record that is not held out (by id or by text), in file order per suite."""
    out = []
    for s in suites:
        for p in load_prompts(s, data_dir=data_dir):
            if p.id not in held.ids and not any(held.is_held_out(t) for t in p.turns):
                out.append(p)
    return out


def split_records(records: list[Prompt], share: float, seed: int = 0) -> tuple[list[Prompt], list[Prompt]]:
    """(the target's records, the drafter's records): `share` of each suite's records, drawn by seed, go to the
    drafter."""
    rng = random.Random(seed)
    target, drafter = [], []
    for s in SUITES:
        mine = [p for p in records if p.suite == s]
        rng.shuffle(mine)
        k = round(len(mine) * share)
        drafter += mine[:k]
        target += mine[k:]
    return target, drafter


def train_prompts(records: list[Prompt]) -> list[str]:
    """The first turn of every training record (later turns follow the model's own reply)."""
    return [p.turns[0] for p in records]


def answer_pairs(records: list[Prompt], data_dir: Path, held: HeldOut, others: Sequence[Prompt] = ()
                 ) -> list[tuple[str, str]]:
    """(prompt, worked answer) for the records whose suite has one, plus MBPP's other splits (less the tasks of
    `others`, the records trained on elsewhere)."""
    pairs = []
    for p in records:
        answer = _answer(p)
        if answer:
            pairs.append((p.turns[0], answer))
    skip = {int(p.meta["task_id"]) for p in others if p.suite == "mbpp"}
    pairs += _mbpp_full(data_dir, held, skip)
    return pairs


STEPS = "Let's solve this step by step.\n"
CODE = "Here is a Python function that solves the task:\n"


def _answer(p: Prompt) -> str | None:
    if p.suite == "gsm8k":
        work, _, final = p.meta["answer"].rpartition("#### ")
        return f"{STEPS}{work.strip()}\nThe final answer is \\boxed{{{final.strip()}}}."
    if p.suite == "math500":
        return STEPS + p.meta["solution"].strip()
    if p.suite == "humaneval":
        return f"Here is the completed function:\n```python\n{p.meta['prompt'].strip()}\n{(p.reference or '').rstrip()}\n```"
    if p.suite == "mbpp" and p.reference:
        return f"{CODE}```python\n{_code(p.reference)}\n```"
    if p.category == "summarization":
        return _lead(p.turns[0].partition(":")[2])
    return None


_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def _lead(text: str, n: int = 2) -> str | None:
    """The first `n` sentences of a text (None when it has fewer than n + 1)."""
    sentences = [x.strip() for x in _SENTENCE.split(" ".join(text.split())) if x.strip()]
    return " ".join(sentences[:n]) if len(sentences) > n else None


def summary_pairs(texts: list[str], held: HeldOut) -> list[tuple[str, str]]:
    """("Summarize: TEXT", its first two sentences) for texts of at least three sentences."""
    out = []
    for t in texts:
        lead = _lead(t)
        if lead and not held.is_held_out(t):
            out.append((f"Summarize: {' '.join(t.split())}", lead))
    return out


def _code(code: str) -> str:
    return code.replace("\r\n", "\n").replace("\t", "    ").strip()


def _mbpp_full(data_dir: Path, held: HeldOut, skip: set[int]) -> list[tuple[str, str]]:
    """MBPP's full file (train, validation and prompt splits beside test), less held-out task ids and texts and
    the tasks in `skip`."""
    path = Path(data_dir) / "mbpp" / "mbpp.jsonl"
    if not path.is_file():
        return []
    pairs, drop = [], held.mbpp_task_ids | skip
    for line in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        if int(rec["task_id"]) in drop or held.is_held_out(rec["text"]):
            continue
        tests = "\n".join(rec["test_list"][:1])
        pairs.append((f"{rec['text']}\n{tests}".strip(), f"{CODE}```python\n{_code(rec['code'])}\n```"))
    return pairs


_NUMBER = re.compile(r"(?<![\w.])\d+(?![\w.])")


def vary_numbers(text: str, rng: random.Random) -> str:
    """The prompt with every whole number redrawn at the same number of digits (a new problem of the same kind)."""
    def draw(m: re.Match) -> str:
        n = len(m.group())
        return str(rng.randint(10 ** (n - 1) if n > 1 else 1, 10**n - 1))
    return _NUMBER.sub(draw, text)
