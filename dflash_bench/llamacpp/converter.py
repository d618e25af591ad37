"""Run llama.cpp's convert_hf_to_gguf.py with this project's pre-tokenizer rule registered (never patching it).

    python -m dflash_bench.llamacpp.converter TREE MODEL_DIR --outtype f32 --outfile X.gguf [...]

The converter names a BPE pre-tokenizer by hashing how the tokenizer splits a probe text and refuses a
hash it does not list (conversion/base.py, TextModel.get_vocab_base_pre; its documented fix is to list the model in
convert_hf_to_gguf_update.py and regenerate). A tokenizer whose pre-tokenizer is exactly GPT-2's
byte-level split (tokenizer.json: ByteLevel with its regex on, nothing else) is GPT-2's pre-tokenizer
whatever its vocabulary, so an unlisted hash with that layout is registered as "gpt-2" here, in this
process only. Any other unlisted layout is still refused, as the converter would.
Both changes live in this process (methods of the tree's classes replaced after import), never in its files.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any


def gpt2_layout(model_dir: Path) -> bool:
    """Is the tokenizer's pre-tokenizer GPT-2's byte-level split and nothing else?"""
    try:
        pre = json.loads((model_dir / "tokenizer.json").read_text()).get("pre_tokenizer") or {}
    except (OSError, ValueError):
        return False
    return pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space", False)


def register(base: Any) -> None:
    original = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self: Any, tokenizer: Any) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            if gpt2_layout(Path(self.dir_model)):
                return "gpt-2"
            raise

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre

    # Qwen's set_vocab tries SentencePiece first and falls back to BPE on FileNotFoundError (no
    # tokenizer.model), but imports sentencepiece before it looks. Without the package, a folder that has
    # no tokenizer.model gets that same FileNotFoundError, so BPE tokenizers convert without sentencepiece.
    sp_original = base.TextModel._create_vocab_sentencepiece

    def _create_vocab_sentencepiece(self: Any) -> Any:
        if not (Path(self.dir_model) / "tokenizer.model").is_file() and not _has("sentencepiece"):
            raise FileNotFoundError(f"File not found: {Path(self.dir_model) / 'tokenizer.model'}")
        return sp_original(self)

    base.TextModel._create_vocab_sentencepiece = _create_vocab_sentencepiece


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def main(argv: list[str]) -> None:
    tree, args = Path(argv[0]), argv[1:]
    sys.path[:0] = [str(tree), str(tree / "gguf-py")]
    from conversion import base  # the tree's own package, first on the path

    register(base)
    sys.argv = [str(tree / "convert_hf_to_gguf.py"), *args]
    runpy.run_path(str(tree / "convert_hf_to_gguf.py"), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
