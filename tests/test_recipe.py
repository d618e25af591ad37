"""recipes/tiny_pair: the recipe that made the embedded pair runs end to end (toy scale, CPU) and writes a pair
the engine loads, with a record of what it trained on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

pytestmark = [pytest.mark.engine, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[1]


def test_the_recipe_trains_a_pair_the_engine_serves(tmp_path, data_dir):
    out = tmp_path / "pair"
    cmd = [sys.executable, "-m", "recipes.tiny_pair.train", "--data-dir", str(data_dir), "--scale", "toy", "--device", "cpu",
           "--out", str(out), "--target-epochs", "1", "--sample-prompts", "24", "--max-new", "12",
           "--drafter", "a:1:64:1,2", "--drafter", "b:2:64:1,2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    record = json.loads((out / "recipe.json").read_text())
    assert record["data"]["held_out_per_suite"] == 64 and record["samples"]["responses"] == 24
    assert record["data"]["synthetic_prompts"]["chat"] > 0 and record["data"]["synthetic_prompts"]["code"] > 0
    assert set(record["drafters"]) == {"a", "b"} and record["drafter"]["name"] == "a"  # the first one is the pair's
    conf = json.loads((out / "drafter" / "config.json").read_text())
    assert (conf["num_hidden_layers"], conf["intermediate_size"]) == (1, 64)
    target = json.loads((out / "target" / "config.json").read_text())  # for transformers 4 readers (z-lab's code)
    assert target["rope_theta"] == target["rope_parameters"]["rope_theta"] == conf["rope_theta"]
    assert conf["dflash_config"]["target_layer_ids"] == [1, 2]
    from dflash_bench.engine.build import build
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.reference.decode import generate
    from dflash_bench.engine.sampling_params import SamplingParams

    kw = dict(max_slots=1, max_model_len=256, dtype="float32", device="cpu")
    ar = build(EngineConfig(str(out / "target"), mode="ar", **kw))
    df = build(EngineConfig(str(out / "target"), str(out / "drafters" / "b"), mode="dflash", **kw))
    ids = ar.tok("Write a function to add two numbers.").input_ids
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    assert generate(df, [ids], params)[0].out == generate(ar, [ids], params)[0].out
