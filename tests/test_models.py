"""Known target/drafter pairs: look-up by short name or id, explicit drafters, clear errors, the table."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dflash_bench import models
from dflash_bench.errors import UserError


@pytest.mark.parametrize("name,target,drafter,block,thinking", [
    # From the z-lab README's supported-models table and the model cards (dflash.md §1.3, §4.2).
    ("gemma-4-31B-it", "google/gemma-4-31B-it", "z-lab/gemma-4-31B-it-DFlash", 16, True),
    ("gemma-4-26B-A4B-it", "google/gemma-4-26B-A4B-it", "z-lab/gemma-4-26B-A4B-it-DFlash", 16, True),
    ("Qwen3-4B", "Qwen/Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16", 16, False),
    ("Qwen3-8B", "Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", 16, False),
    ("Qwen3-Coder-30B-A3B", "Qwen/Qwen3-Coder-30B-A3B-Instruct", "z-lab/Qwen3-Coder-30B-A3B-DFlash", 16, False),
    ("Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct", "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat", 10, False),
    ("gpt-oss-20b", "openai/gpt-oss-20b", "z-lab/gpt-oss-20b-DFlash", 10, True),
    ("gpt-oss-120b", "openai/gpt-oss-120b", "z-lab/gpt-oss-120b-DFlash", 10, True),
    ("Qwen3.5-4B", "Qwen/Qwen3.5-4B", "z-lab/Qwen3.5-4B-DFlash", 16, True),
    ("Qwen3.5-9B", "Qwen/Qwen3.5-9B", "z-lab/Qwen3.5-9B-DFlash", 16, True),
    ("Qwen3.5-27B", "Qwen/Qwen3.5-27B", "z-lab/Qwen3.5-27B-DFlash", 16, True),
    ("Qwen3.5-35B-A3B", "Qwen/Qwen3.5-35B-A3B", "z-lab/Qwen3.5-35B-A3B-DFlash", 16, True),
])
def test_known_pairs(name, target, drafter, block, thinking):
    for key in (name, name.lower(), target, drafter):
        pair = models.resolve(key)
        assert (pair.name, pair.target, pair.drafter, pair.block_size, pair.thinking) == (
            name, target, drafter, block, thinking)


def test_unknown_short_name_lists_the_known_ones():
    with pytest.raises(UserError) as err:
        models.resolve("Qwen9-1B")
    msg = str(err.value)
    assert "unknown model 'Qwen9-1B'" in msg and "gemma-4-31B-it" in msg and "Qwen3-8B" in msg
    assert "\n" not in msg
    with pytest.raises(UserError, match="empty"):
        models.resolve("  ")


def test_any_hf_id_or_folder_with_an_explicit_drafter(tmp_path):
    pair = models.resolve("acme/target-7b", drafter="acme/target-7b-dflash")
    assert (pair.target, pair.drafter, pair.block_size) == ("acme/target-7b", "acme/target-7b-dflash", 16)
    # A local drafter folder: the block size comes from its config.json (Qwen3.5 style: inside dflash_config).
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"dflash_config": {"block_size": 8}}))
    target = tmp_path / "target"
    target.mkdir()
    pair = models.resolve(str(target), drafter=str(draft))
    assert (pair.target, pair.drafter, pair.block_size, pair.name) == (str(target), str(draft), 8, "target")
    # A known pair keeps its card flags when its drafter is overridden.
    custom = models.resolve("Qwen3-8B", drafter=str(draft))
    assert custom.drafter == str(draft) and custom.block_size == 8
    assert custom.sglang_flags == models.resolve("Qwen3-8B").sglang_flags
    (draft / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="cannot read the drafter config"):
        models.resolve(str(target), drafter=str(draft))
    for bad in ('{"block_size": "big"}', '{"dflash_config": {"block_size": 1}}'):
        (draft / "config.json").write_text(bad)
        with pytest.raises(UserError, match="expected a whole number of at least 2"):
            models.resolve(str(target), drafter=str(draft))
    (draft / "config.json").write_text("[1, 2]")  # no block size in it: the default
    assert models.resolve(str(target), drafter=str(draft)).block_size == 16


def test_models_command_prints_the_table():
    out = subprocess.run([sys.executable, "-m", "dflash_bench", "models"], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "250"})
    assert out.returncode == 0, out.stderr
    for pair in models.known():
        assert pair.name in out.stdout
    assert "z-lab/gemma-4-31B-it-DFlash" in out.stdout


def test_every_pair_not_confirmed_says_why_or_has_a_shape_to_run():
    from dflash_bench.model_shapes import shape_of

    for pair in models.known():
        text = f"{pair.vllm_version} {pair.notes}"
        if "not confirmed" in text or "assumed" in text:
            assert shape_of(pair.name) is not None or "not run here" in pair.notes or "not confirmed, as" in pair.notes, pair.name
