"""The target's tokenizer: whether a model folder holds one (the one rule the sweep's prompt building and its
sizing both follow)."""

from __future__ import annotations

from pathlib import Path

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
