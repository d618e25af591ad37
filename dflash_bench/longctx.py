"""Long prompts from real text, for the input-length axis (`--input-len 1k,4k,16k,32k`).

Speedups fall as the context grows (longer attention per step, drafts conditioned on more), and the
suites' prompts are short, so this builds prompts of about N tokens from real documents:

    prompts = build_prompts(4096, data_dir=Path("../shared/datasets"), num_prompts=8, tokenizer=tok)

Each prompt is Spec-Bench documents joined together (its CNN/DailyMail summarization articles and its
RAG passages), then one RAG record's own passages, then that record's question. Below about 1k tokens the
record's passages alone are too long, and only their beginning is kept. Prompt i asks the same
question at every length, so cells of different lengths differ only in how much text comes first.
Never random tokens: a drafter predicts random text badly or, on repeats, too well, and either way tau
says nothing about real traffic.

Token counts are the target's tokenizer's when one is given (the user turn only, without the chat
template's few tokens); otherwise 4 characters per token, a stated approximation for English BPE
vocabularies (Llama 3, Qwen, Gemma average 3.8-4.5 on news text), recorded in each prompt's meta.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from dflash_bench.errors import UserError
from dflash_bench.suites import Prompt, load_prompts

CHARS_PER_TOKEN = 4
APPROX = f"approximate: {CHARS_PER_TOKEN} characters per token"
QUESTION = "\n\nAnswer the question using the documents above.\nQuestion: {question}"


def length_label(n: int) -> str:
    """4096 -> "4k", 2000 -> "2000": the suffix of a long-prompt suite's name."""
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def token_counter(tokenizer: Any | None) -> tuple[Callable[[str], int], str]:
    """(count, how): the tokenizer's exact count (a transformers tokenizer or a path to one), else chars/4."""
    if tokenizer is None:
        return (lambda s: -(-len(s) // CHARS_PER_TOKEN)), APPROX
    if isinstance(tokenizer, (str, Path)):
        from dflash_bench.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(tokenizer, "to count prompt tokens")
    how = f"tokenizer: {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__}"
    return (lambda s: len(tokenizer.encode(s, add_special_tokens=False))), how


def _sources(data_dir: Path | None) -> tuple[list[str], list[tuple[str, str, str]]]:
    """(documents, rag records as (id, passages, question)) from Spec-Bench, in file order."""
    records = load_prompts("spec-bench", data_dir=data_dir, categories=["rag", "summarization"])
    docs, rag = [], []
    for p in records:
        text = p.turns[0].strip()
        if p.category == "summarization":
            docs.append(text.removeprefix("Summarize:").strip())
        else:
            passages, _, question = text.rpartition("\n")
            docs.append(passages.strip())
            rag.append((p.id.split("/", 1)[1], passages.strip(), question.strip()))
    return docs, rag


def _cut(text: str, fits: Callable[[str], bool]) -> str:
    """The longest prefix of `text`, cut at whitespace, that still fits (binary search on the cut)."""
    cuts = [m.start() for m in re.finditer(r"\s", text)] + [len(text)]
    lo, hi = 0, len(cuts) - 1
    if not fits(text[:cuts[0]]):
        return ""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(text[:cuts[mid]]) else (lo, mid - 1)
    return text[:cuts[lo]]


def build_prompt(target: int, docs: list[str], passages: str, question: str, start: int,
                 count: Callable[[str], int]) -> tuple[str, int]:
    """One prompt of at most `target` tokens and as close below it as a whitespace cut allows.

    Filler documents are taken from `docs` starting at `start` (wrapping, never repeating one), then the
    record's own passages, then the question. Returns (text, token count)."""
    ask = QUESTION.format(question=question)
    need = count(ask)
    if need > target:
        raise UserError(f"an input length of {target} tokens is shorter than the question itself ({need} tokens).")
    tail = "\n\n" + passages + ask
    if count(tail) > target:  # a short length: the record's own passages, cut, are the only text
        text = _cut(passages, lambda s: count(s + ask) <= target) + ask
        return text.lstrip(), count(text.lstrip())
    # Documents are counted one by one (token counts add up to within a few at the joins), so a 32k prompt
    # costs one pass over its text; the exact count of the whole is taken only at the end.
    pool = [d for d in (docs[(start + k) % len(docs)] for k in range(len(docs))) if d != passages]
    filler: list[str] = []
    estimate = count(tail)
    for doc in pool:
        size = count(doc) + 1
        if estimate + size > target:
            break
        filler.append(doc)
        estimate += size
    else:
        total = count("\n\n".join(filler) + tail)
        if total < target * 0.9:
            raise UserError(f"the offline documents hold only about {total} tokens: an input length of {target} "
                            "needs more text than Spec-Bench's summarization and RAG records.")

    def fits(parts: list[str]) -> bool:
        return count("\n\n".join(parts) + tail) <= target

    while filler and not fits(filler):  # the joins cost more than the estimate said
        filler.pop()
    if len(filler) < len(pool):
        piece = _cut(pool[len(filler)], lambda s: fits(filler + [s]))
        filler += [piece] if piece else []
    text = ("\n\n".join(filler) + tail).lstrip()
    return text, count(text)


def build_prompts(target: int, *, data_dir: Path | None = None, num_prompts: int = 8,
                  tokenizer: Any | None = None, seed: int = 0) -> list[Prompt]:
    """`num_prompts` prompts of about `target` tokens, suite "long-<label>", one per RAG question in order.

    `seed` shifts which documents come first, so two sweeps can use other filler with the same questions.
    """
    if num_prompts < 1:
        raise UserError("the number of long prompts must be at least 1.")
    count, how = token_counter(tokenizer)
    docs, rag = _sources(data_dir)
    suite = f"long-{length_label(target)}"
    out = []
    for i in range(num_prompts):
        rid, passages, question = rag[i % len(rag)]
        start = (seed + i * 7) % len(docs)  # 7: neighbouring prompts do not share their first documents
        text, n = build_prompt(target, docs, passages, question, start, count)
        pid = f"{suite}/{rid}" + (f"#{i // len(rag)}" if i >= len(rag) else "")
        out.append(Prompt(id=pid, suite=suite, turns=[text], category="long-context", reference=None,
                          meta={"target_tokens": target, "input_tokens": n, "counted_by": how,
                                "question_id": rid, "question": question}))
    return out
