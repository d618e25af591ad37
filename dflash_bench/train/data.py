"""Training text: Python's own standard library as chat pairs, user prompt files, and target-regenerated responses.

The tiny pair learns from openly licensed text found on every machine with Python: the standard library's
source (PSF licence; its `test` packages left out) and its documentation topics (`pydoc_data`). A function
or class with a docstring becomes a chat pair (user: the docstring, assistant: the code); a documentation
topic becomes (user: "Explain ...", assistant: the text). No benchmark data is read here.
"""

from __future__ import annotations

import ast
import json
import random
import sysconfig
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from dflash_bench.errors import UserError

SKIP_PARTS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "lib2to3", "turtledemo"}
PROMPT_KEYS = ("prompt", "instruction", "question", "problem", "text", "input")


def stdlib_files(root: str | None = None) -> list[Path]:
    """The standard library's .py files (tests excluded), sorted for reproducibility."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    return sorted(p for p in base.rglob("*.py") if not SKIP_PARTS & set(p.relative_to(base).parts))


def _pairs_of_file(path: Path, base: Path, max_chars: int) -> Iterator[tuple[str, str]]:
    try:
        src = path.read_text(encoding="utf-8")
        tree = ast.parse(src)
    except (UnicodeDecodeError, SyntaxError, ValueError):
        return
    lines = src.splitlines()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 12 or (node.end_lineno or node.lineno) - node.lineno > max_chars // 20:
            continue
        code = _segment(lines, node)
        if len(code) <= max_chars:
            yield " ".join(doc.strip().split("\n\n")[0].split()), code
    module = ".".join(path.relative_to(base).with_suffix("").parts)
    for i, chunk in enumerate(_chunks(src, max_chars)):
        yield f"Write part {i + 1} of the Python module {module}.", chunk


def _segment(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> str:
    """The node's source, dedented by its column (lines indented less, inside strings, are kept as they are)."""
    col = node.col_offset
    body = lines[node.lineno - 1 : node.end_lineno]
    return "\n".join(ln[col:] if not ln[:col].strip() else ln for ln in body)


def stdlib_pairs(root: str | None = None, max_chars: int = 3000) -> list[tuple[str, str]]:
    """(user, assistant) chat pairs from the standard library: docstring -> code, module part -> its source,
    documentation topic -> its text."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    pairs = [p for f in stdlib_files(root) for p in _pairs_of_file(f, base, max_chars)]
    topics: dict[str, str] = {}
    try:
        from pydoc_data import topics as pydoc_topics

        topics = dict(pydoc_topics.topics)
    except ImportError:  # some distributions strip the docs
        pass
    for name, text in sorted(topics.items()):
        for i, chunk in enumerate(_chunks(text, max_chars)):
            pairs.append((f"Explain {name}" + (f" (part {i + 1})" if i else "") + ".", chunk))
    return pairs


def _chunks(text: str, size: int) -> list[str]:
    paras, out, cur = text.strip().split("\n\n"), [], ""
    for p in paras:
        if cur and len(cur) + len(p) > size:
            out.append(cur.strip())
            cur = ""
        cur += p + "\n\n"
    if cur.strip():
        out.append(cur.strip())
    return out


def split_pairs(pairs: list, held_out: float, seed: int) -> tuple[list, list]:
    """Shuffle deterministically and split off a held-out fraction."""
    rng = random.Random(seed)
    items = list(pairs)
    rng.shuffle(items)
    k = int(len(items) * held_out)
    return items[k:], items[:k]


def read_prompts(path: str | Path, limit: int | None = None) -> list[list[dict]]:
    """Chat prompts from a .jsonl file (`messages`, or one of prompt/instruction/question/problem/text per
    line), a .txt file (prompts separated by blank lines), or a folder of such files.

    Returns message lists (the last message is the user's; assistant turns in the data are dropped, the
    target writes its own response).
    """
    p = Path(path)
    if not p.exists():
        raise UserError(f"no training data at {str(path)!r}: pass a .jsonl or .txt file or a folder of them")
    files = sorted(f for f in p.rglob("*") if f.suffix in (".jsonl", ".txt")) if p.is_dir() else [p]
    prompts: list[list[dict]] = []
    for f in files:
        if f.suffix == ".jsonl":
            prompts += _jsonl_prompts(f)
        elif f.suffix == ".txt":
            prompts += [[{"role": "user", "content": t.strip()}] for t in f.read_text(encoding="utf-8").split("\n\n") if t.strip()]
        else:
            raise UserError(f"unsupported training data file {f.name!r}: use .jsonl or .txt")
        if limit and len(prompts) >= limit:
            break
    if not prompts:
        raise UserError(f"found no prompts in {str(path)!r}: expected .jsonl lines with 'messages' or 'prompt', or .txt paragraphs")
    return prompts[:limit] if limit else prompts


def _jsonl_prompts(f: Path) -> list[list[dict]]:
    out = []
    for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise UserError(f"{f.name} line {n} is not valid JSON ({err.msg})") from err
        msgs = rec.get("messages") if isinstance(rec, dict) else None
        if isinstance(msgs, list) and msgs:
            while msgs and msgs[-1].get("role") == "assistant":
                msgs = msgs[:-1]
            if msgs:
                out.append([{"role": m["role"], "content": str(m["content"])} for m in msgs])
            continue
        text = next((rec[k] for k in PROMPT_KEYS if isinstance(rec, dict) and isinstance(rec.get(k), str)), None)
        if text is None:
            raise UserError(f"{f.name} line {n} has no 'messages' or {'/'.join(PROMPT_KEYS)} field")
        out.append([{"role": "user", "content": text}])
    return out


def encode_prompts(tokenizer: Any, prompts: list[list[dict[str, str]]], max_len: int) -> list[list[int]]:
    """Apply the chat template (generation prompt on); prompts longer than `max_len` tokens are cut at the front."""
    out = []
    for msgs in prompts:
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
        ids = tokenizer(text, add_special_tokens=False).input_ids
        out.append(ids[-max_len:])
    return out


@torch.no_grad()
def regenerate(model: Any, prompt_ids: list[list[int]], *, eos_ids: list[int], pad_id: int, max_new_tokens: int,
               batch: int = 64, log: Callable[[str], object] | None = None) -> list[tuple[list[int], list[int]]]:
    """The target's own greedy responses (HF `generate`, left-padded batches of similar lengths; EOS kept).

    Returns (prompt ids, response ids) pairs in the prompts' order; empty responses are dropped.
    """
    dev = next(model.parameters()).device
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    responses: dict[int, list[int]] = {}
    stop = set(eos_ids)
    for n in range(0, len(order), batch):
        idx = order[n : n + batch]
        width = max(len(prompt_ids[i]) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        att = torch.zeros(len(idx), width, dtype=torch.long)
        for row, i in enumerate(idx):
            p = prompt_ids[i]
            ids[row, width - len(p):] = torch.tensor(p)
            att[row, width - len(p):] = 1
        out = model.generate(input_ids=ids.to(dev), attention_mask=att.to(dev), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=list(eos_ids), pad_token_id=pad_id)
        for row, i in enumerate(idx):
            resp = []
            for t in out[row, width:].tolist():
                resp.append(t)
                if t in stop:
                    break
            responses[i] = resp
        if log:
            log(f"regenerated {min(n + batch, len(order))}/{len(order)} responses")
    return [(prompt_ids[i], responses[i]) for i in range(len(prompt_ids)) if responses[i]]
