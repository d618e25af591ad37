"""A prompt id outside the vocabulary is refused by the engine itself, in one sentence, before it reaches a
kernel: the C CPU kernels (engine/fast/kernels/cpu_kernels.c) index the embedding without a check, so an in-process
caller (no server in front to answer 400) would otherwise read past it. The engine stays whole afterwards."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from dflash_bench.engine.build import build  # noqa: E402
from dflash_bench.engine.config import EngineConfig  # noqa: E402
from dflash_bench.engine.sampling_params import SamplingParams  # noqa: E402
from dflash_bench.testing.tiny import make_tiny_pair  # noqa: E402

pytestmark = pytest.mark.engine
B, SLOTS, MAX_LEN = 4, 4, 128


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_tiny_pair(tmp_path_factory.mktemp("vocab"), seed=1, block_size=B)


def _engine(pair, which: str):
    target, drafter = map(str, pair)
    if which == "reference":
        return build(EngineConfig(target, drafter, mode="dflash", max_slots=SLOTS, max_model_len=MAX_LEN, device="cpu"))
    from dflash_bench.engine.fast.kernels import cpu_kernels

    if cpu_kernels.load() is None:
        pytest.skip("no C compiler builds the CPU kernels")
    return build(EngineConfig.from_options(target, drafter, mode="dflash", device="cpu", max_slots=SLOTS, max_model_len=MAX_LEN,
                             kernels=True, fast=True))


@pytest.mark.parametrize("which", ["reference", "fast-cpu-kernels"])
def test_out_of_vocabulary_prompt_ids_are_refused_before_any_kernel(pair, which):
    engine = _engine(pair, which)
    v, params = engine.vocab_size, SamplingParams(max_tokens=4, ignore_eos=True)
    free = sorted(engine.free_slots)
    for bad, where in (([5, 6, v], "token id %d (position 2)" % v), ([-1, 5], "token id -1 (position 0)")):
        with pytest.raises(ValueError) as err:
            engine.add("r-bad", bad, params)
        assert str(err.value) == (f"request 'r-bad': the prompt's {where} is outside the vocabulary of {v} tokens "
                                  f"(0 to {v - 1})")
        assert sorted(engine.free_slots) == free  # no slot taken
    with pytest.raises(ValueError, match="outside the vocabulary"):  # all or nothing: the good one goes back too
        engine.add_many([("r-ok", [5, 6, 7], params), ("r-bad", [5, v + 100], params)])
    assert sorted(engine.free_slots) == free
    # the engine decodes on: the last id of the vocabulary is in it
    seq, delta = engine.add("r-last", [5, 6, v - 1], params)
    assert delta is not None and len(delta.token_ids) >= 1 and all(0 <= t < v for t in delta.token_ids)
    engine.release(seq)
