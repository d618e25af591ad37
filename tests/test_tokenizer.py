"""One rule for "this model folder has a tokenizer" (dflash_bench/tokenizer.py), followed by the sweep's prompt
building (sweep/prompts.py) and its sizing (sweep/fit.py), on folders cut from the embedded pair's target."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from dflash_bench.errors import UserError
from dflash_bench.sweep.fit import token_counter
from dflash_bench.sweep.prompts import _local_target
from dflash_bench.tokenizer import has_tokenizer

TARGET = Path(__file__).resolve().parent.parent / "dflash_bench" / "assets" / "default_pair" / "target"
TEXT = "Natalia sold clips to 48 of her friends in April."


def folder(tmp_path: Path, *files: str) -> Path:
    out = tmp_path / "-".join(files or ("none",))
    out.mkdir()
    for name in ("config.json", *files):
        shutil.copy(TARGET / name, out / name)
    return out


def test_tokenizer_json_alone_is_a_tokenizer_both_callers_use(tmp_path: Path):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    path = folder(tmp_path, "tokenizer.json")
    assert has_tokenizer(path) and has_tokenizer(str(path))
    assert _local_target(str(path)) == path
    exact = len(AutoTokenizer.from_pretrained(str(path)).encode(TEXT, add_special_tokens=False))
    assert token_counter(str(path))(TEXT) == exact != math.ceil(len(TEXT) / 3)


def test_tokenizer_config_alone_is_a_tokenizer_that_must_load(tmp_path: Path):
    pytest.importorskip("transformers")
    path = folder(tmp_path, "tokenizer_config.json")
    assert has_tokenizer(path) and _local_target(str(path)) == path
    with pytest.raises(UserError, match="tokenizer"):  # it says it has one and it does not load: never a guess
        token_counter(str(path))


def test_no_tokenizer_files_or_no_folder_is_no_tokenizer(tmp_path: Path):
    path = folder(tmp_path)
    for target in (path, str(path), "org/not-a-folder", None, str(tmp_path / "missing"), str(path / "config.json")):
        assert not has_tokenizer(target)
    assert _local_target(str(path)) is None
    assert token_counter(str(path))(TEXT) == math.ceil(len(TEXT) / 3)  # the stated approximation


@pytest.fixture
def corrupt(tmp_path: Path) -> Path:
    """The embedded target's folder with its tokenizer.json cut short, as an interrupted download leaves it."""
    path = Path(shutil.copytree(TARGET, tmp_path / "corrupt"))
    (path / "tokenizer.json").write_bytes((TARGET / "tokenizer.json").read_bytes()[:3000])
    return path


def _one_sentence(text: str, corrupt: Path) -> None:
    assert f"cannot load the tokenizer of the folder {corrupt}" in text
    assert "tokenizer.json is not valid JSON (" in text and "(char 3000))." in text  # the whole cause, to its end
    assert "\n" not in text.strip() and "Traceback" not in text


def test_a_corrupt_tokenizer_json_is_one_full_sentence_naming_the_folder(corrupt: Path):
    pytest.importorskip("transformers")
    from dflash_bench.engine.build import load_tokenizer
    from dflash_bench.longctx import token_counter as longctx_counter

    with pytest.raises(UserError) as engine:
        load_tokenizer(str(corrupt))
    _one_sentence(str(engine.value), corrupt)
    assert "for the engine" in str(engine.value)
    with pytest.raises(UserError) as longctx:
        longctx_counter(corrupt)
    _one_sentence(str(longctx.value), corrupt)
    assert "to count prompt tokens" in str(longctx.value)


def test_serve_with_a_corrupt_tokenizer_json_exits_with_the_sentence(corrupt: Path):
    pytest.importorskip("transformers")
    import subprocess
    import sys

    from dflash_bench.launch import free_port

    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "serve", "--model", str(corrupt), "--mode", "ar",
                           "--device", "cpu", "--port", str(free_port())], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    _one_sentence(" ".join(proc.stderr.split()), corrupt)
