"""HF folders to GGUF with the llama.cpp tree's own converter, cached by content hash.

    target = gguf_for(Path("Qwen3-8B"), "bf16")
    drafter = gguf_for(Path("Qwen3-8B-DFlash"), "bf16", target_dir=Path("Qwen3-8B"))  # --target-model-dir

The key hashes every file of the folder (and of the target folder for a drafter, whose tokenizer and
embeddings come from it), the output type and the llama.cpp version, so a changed weight or tokenizer
converts again and an unchanged folder never does. Files are written beside their final name and renamed.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Callable

from dflash_bench.errors import UserError
from dflash_bench.llamacpp import VERSION, cache_root

DTYPES = ("f32", "bf16")
# Files that say nothing about the converted model (training logs, READMEs).
IGNORED = {"README.md", "dflash_train.json", ".gitattributes"}


def check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise UserError(f"unknown GGUF type {dtype!r}: use one of {', '.join(DTYPES)}.")
    return dtype


def folder_hash(folder: Path) -> str:
    """sha256 over the relative names and bytes of every file of the folder."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in IGNORED):
        h.update(str(path.relative_to(folder)).encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def gguf_path(folder: Path, dtype: str, target_dir: Path | None = None) -> Path:
    """Where the GGUF of `folder` lives in the cache (converted or not yet)."""
    key = hashlib.sha256(f"{VERSION}\0{check_dtype(dtype)}\0{folder_hash(folder)}\0"
                         f"{folder_hash(target_dir) if target_dir else ''}".encode()).hexdigest()[:16]
    return cache_root() / "gguf" / f"{folder.name}-{key}-{dtype}.gguf"


def gguf_for(folder: Path, dtype: str, target_dir: Path | None = None, tree: Path | None = None,
             log: Callable[[str], object] | None = None) -> Path:
    """The GGUF of an HF model folder (a z-lab drafter with `target_dir`), converted on first use."""
    folder = _local(folder)
    out = gguf_path(folder, dtype, target_dir)
    if out.is_file():
        return out
    from dflash_bench.llamacpp.server_build import source_tree

    tree = tree or source_tree()
    if tree is None:
        raise UserError("converting to GGUF needs the llama.cpp tree: run `dflash-bench engines build llamacpp`.")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    cmd = [sys.executable, "-m", "dflash_bench.llamacpp.converter", str(tree), str(folder),
           "--outtype", dtype, "--outfile", str(tmp)] + (["--target-model-dir", str(target_dir)] if target_dir else [])
    if log:
        log(f"converting {folder} to GGUF ({dtype}) ...")
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-15:])
        raise UserError(f"llama.cpp's converter failed on {folder} (exit {proc.returncode}):\n{tail}")
    tmp.replace(out)
    return out


def _local(folder: Path) -> Path:
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise UserError(f"{folder} is not a model folder with a config.json (llama.cpp converts local folders; "
                        "download a Hugging Face model first, e.g. `hf download ORG/NAME --local-dir DIR`).")
    return folder.resolve()
