"""The target's tokenizer: whether a model folder holds one (the one rule the sweep's prompt building and its
sizing both follow), and loading it, with one full sentence naming the folder and the cause when it fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dflash_bench.errors import UserError

# Either file says the folder ships a tokenizer: tokenizer.json alone loads (a fast tokenizer, its class from
# config.json), tokenizer_config.json names the class and its vocabulary files. A folder with one of them that
# does not load is an error, never a silent fall back to counting characters.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def has_tokenizer(folder: str | Path | None) -> bool:
    """Whether `folder` is a model folder on this machine holding a tokenizer (a hub id or None: False)."""
    if not folder:
        return False
    path = Path(folder)
    return path.is_dir() and any((path / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(name: str | Path, purpose: str = "") -> Any:
    """A transformers tokenizer from a folder or hub id; one that does not load is a UserError naming the folder
    and the whole cause (`purpose`, e.g. "to count prompt tokens", says what it was wanted for)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(name))
    except (OSError, ValueError, TypeError, KeyError) as err:  # a JSONDecodeError is a ValueError
        raise UserError(tokenizer_error(name, err, purpose)) from None


def tokenizer_error(name: str | Path, err: BaseException, purpose: str = "") -> str:
    """One sentence: which tokenizer, what for, and why it did not load (every line of the cause, joined)."""
    path = Path(name)
    where = f"the folder {path}" if path.is_dir() else repr(str(name))
    cause = " ".join(str(err).split()) or type(err).__name__
    broken = _broken_json(path) if path.is_dir() else None
    if broken is not None:
        cause = f"{broken} is not valid JSON ({cause})"
    return f"cannot load the tokenizer of {where}{' ' + purpose if purpose else ''}: {cause.rstrip('.')}."


def _broken_json(folder: Path) -> str | None:
    """The first tokenizer file of `folder` that does not parse as JSON (a truncated or damaged download)."""
    for name in TOKENIZER_FILES:
        file = folder / name
        if file.is_file():
            try:
                json.loads(file.read_text(errors="replace"))
            except ValueError:
                return name
    return None
