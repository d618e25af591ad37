"""Every model family the fast path registers (`engine/fast/models/family.py`) is in the exactness tests: its tiny
architecture builds a config of one of its model types, and `serve --fast`'s engine over that tiny pair gives the
reference engine's greedy tokens, AR and DFlash, over the caches its family's layout says. A family registered
without a tiny architecture of its own fails here."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("transformers")

from dflash_bench.engine.build import build  # noqa: E402
from dflash_bench.engine.reference.decode import generate  # noqa: E402
from dflash_bench.engine.config import EngineConfig  # noqa: E402
from dflash_bench.engine.fast.models.family import FAMILIES, family_of, load_target  # noqa: E402
from dflash_bench.engine.sampling_params import SamplingParams  # noqa: E402
from dflash_bench.testing.tiny import make_tiny_pair  # noqa: E402
from dflash_bench.errors import UserError  # noqa: E402

pytestmark = pytest.mark.engine
MAX_LEN = 128


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_registered_family_decodes_its_tiny_pair_exactly(family, tmp_path):
    from transformers import AutoConfig

    target, drafter = make_tiny_pair(tmp_path, arch=family.tiny, seed=1, block_size=4)
    cfg = AutoConfig.from_pretrained(target).get_text_config()
    assert family_of(cfg) is family  # the tiny architecture is one of this family's model types
    rng = random.Random(0)
    ps = [[rng.randrange(256) for _ in range(rng.randint(3, 20))] for _ in range(3)]
    sp = SamplingParams(max_tokens=16, ignore_eos=True)
    ar = build(EngineConfig(str(target), mode="ar", max_slots=4, max_model_len=MAX_LEN, dtype="float64", device="cpu"))
    ref = [s.out for s in generate(ar, ps, sp)]
    for mode in ("ar", "dflash"):
        fe = build(EngineConfig.from_options(str(target), str(drafter) if mode == "dflash" else None, mode=mode, dtype="float64",
                               device="cpu", max_slots=4, max_model_len=MAX_LEN, fast=True))
        assert fe.core.probe.target.caches == family.layout(cfg, MAX_LEN)
        assert [s.out for s in generate(fe, ps, sp)] == ref, (family.name, mode)


def test_a_model_type_no_family_serves_is_one_sentence(tmp_path):
    """gemma3 has a tiny architecture but no fast-path family: refused in one sentence naming what runs."""
    from transformers import AutoModelForCausalLM

    target, _ = make_tiny_pair(tmp_path, arch="gemma3", seed=1, block_size=4)
    with pytest.raises(UserError, match="the fast path runs qwen3, .* models, not 'gemma3_text'"):
        load_target(AutoModelForCausalLM.from_pretrained(target), max_slots=1, max_len=16)
