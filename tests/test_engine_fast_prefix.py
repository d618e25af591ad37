"""The fast path's prefix cache: a chat's next turn resumes the slot its last turn left, prefilling only what is new,
and decodes exactly what the reference engine decodes from the whole prompt (float64, greedy), on the dense family
and on Gemma 4, whose sliding layers keep a ring that a long conversation wraps."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("transformers")

from dflash_bench.engine.build import build  # noqa: E402
from dflash_bench.engine.config import EngineConfig  # noqa: E402
from dflash_bench.engine.fast.scheduling.prefix import PREFIX_MIN_TOKENS, PrefixCache  # noqa: E402
from dflash_bench.engine.reference.decode import generate  # noqa: E402
from dflash_bench.engine.sampling_params import SamplingParams  # noqa: E402
from dflash_bench.testing.tiny import make_tiny_pair  # noqa: E402

pytestmark = pytest.mark.engine
B, MAX_LEN, OUT = 6, 256, 24


def ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


def turn(engine, reqs: list[tuple[str, list[int]]], max_tokens: int = OUT) -> dict[str, tuple[list[int], int]]:
    """Serve `reqs` admitted together to the end, as the server's loop does (each slot given back as its request
    finishes); per request its tokens and the prompt tokens it read from the cache."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    got = engine.add_many([(rid, p, params) for rid, p in reqs])
    running = [s for s, _ in got]
    out = {s.req_id: s for s in running}
    while running:
        engine.step(running)
        for s in [s for s in running if s.finish]:
            engine.release(s)
            running.remove(s)
    return {rid: (s.out, s.cached) for rid, s in out.items()}


def whole(ref, prompts: list[list[int]], max_tokens: int = OUT) -> list[list[int]]:
    return [s.out for s in generate(ref, prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))]


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    target, drafter = make_tiny_pair(tmp_path_factory.mktemp("qwen3"), arch="qwen3", seed=1, block_size=B)
    ref = build(EngineConfig(str(target), mode="ar", max_slots=4, max_model_len=MAX_LEN, dtype="float64", device="cpu"))
    return target, drafter, ref


def fast(target, drafter, mode: str, **kw):
    return build(EngineConfig.from_options(str(target), str(drafter) if mode == "dflash" else None, mode=mode,
                                           max_slots=kw.pop("max_slots", 4), max_model_len=MAX_LEN, dtype="float64",
                                           device="cpu", fast=True, **kw))


def conversations(rng: random.Random, vocab: int, n: int) -> list[list[int]]:
    return [ids(rng, rng.randint(PREFIX_MIN_TOKENS + 4, PREFIX_MIN_TOKENS + 40), vocab) for _ in range(n)]


@pytest.mark.parametrize("kernels", [True, False], ids=["cpu-kernels", "torch-ops"])
@pytest.mark.parametrize("mode", ["ar", "dflash"])
def test_a_second_turn_resumes_its_slot_and_decodes_what_the_whole_prompt_decodes(dense, mode, kernels):
    """Three conversations at once: their second turns (the first turn's prompt, its answer and a new message)
    arrive together, each resumes the slot its first turn left (every token of the conversation but the answer's
    last is read from the cache), and each decodes what the reference engine decodes from the whole prompt."""
    target, drafter, ref = dense
    engine = fast(target, drafter, mode, kernels=kernels)
    rng = random.Random(7)
    firsts = conversations(rng, engine.vocab_size, 3)
    one = turn(engine, [(f"c{i}", p) for i, p in enumerate(firsts)])
    assert [one[f"c{i}"][0] for i in range(3)] == whole(ref, firsts)
    assert all(cached == 0 for _, cached in one.values())
    seconds = [p + one[f"c{i}"][0] + ids(rng, 5 + 3 * i, engine.vocab_size) for i, p in enumerate(firsts)]
    two = turn(engine, [(f"c{i}", p) for i, p in enumerate(seconds)])
    assert [two[f"c{i}"][0] for i in range(3)] == whole(ref, seconds)
    assert [two[f"c{i}"][1] for i in range(3)] == [len(p) + OUT - 1 for p in firsts]
    assert engine.stats.cached_prompt_tokens == sum(len(p) + OUT - 1 for p in firsts)


def test_the_admission_cut_weighs_what_a_resumed_prompt_leaves_to_prefill(dense, monkeypatch):
    """Three second turns whose whole conversations would go into one prefill forward one at a time (here at most
    200 padded tokens a forward) are admitted together: each leaves only its new message to prefill. Forgotten,
    they are admitted one by one again."""
    from dflash_bench.engine.fast.scheduling import scheduler

    monkeypatch.setattr(scheduler, "PREFILL_TOKENS", 200)
    target, drafter, ref = dense
    engine = fast(target, drafter, "ar")
    rng = random.Random(9)
    firsts = conversations(rng, engine.vocab_size, 3)
    one = turn(engine, [(f"c{i}", p) for i, p in enumerate(firsts)])
    seconds = [p + one[f"c{i}"][0] + [4, 5, 6] for i, p in enumerate(firsts)]
    assert all(len(p) > 100 for p in seconds)
    assert engine.admission(seconds) == 3
    # a fourth that starts as c0 did finds c0's slot taken by c0's second turn: whole, it does not fit beside them
    assert engine.admission(seconds + [firsts[0] + [9]]) == 3
    engine.reset_prefix_cache()
    assert engine.admission(seconds) == 1


def test_a_forgotten_or_disabled_cache_prefills_the_whole_prompt(dense):
    """After reset_prefix_cache, and with --no-enable-prefix-caching, the second turn reads nothing from the cache
    and decodes the same tokens; a prompt that parts from the kept one early (fewer shared tokens than
    PREFIX_MIN_TOKENS) is prefilled whole too, in the lowest free slot."""
    target, drafter, ref = dense
    rng = random.Random(3)
    first = conversations(rng, 256, 1)[0]
    for engine, reset in ((fast(target, drafter, "dflash"), True),
                          (fast(target, drafter, "dflash", enable_prefix_caching=False), False)):
        out = turn(engine, [("a", first)])["a"][0]
        if reset:
            engine.reset_prefix_cache()
        second = first + out + [5, 6, 7]
        assert turn(engine, [("b", second)]) == {"b": (whole(ref, [second])[0], 0)}
    engine = fast(target, drafter, "ar", max_slots=2)
    turn(engine, [("a", first)])
    early = first[:PREFIX_MIN_TOKENS - 1] + [9] * 20
    got = engine.add_many([("e", early, SamplingParams(max_tokens=2, ignore_eos=True))])[0][0]
    assert got.cached == 0 and got.slot == 0  # slot 0 kept `first`; a miss takes the lowest free slot as before


def test_the_index_takes_the_longest_share_the_target_can_resume():
    """`PrefixCache.match`: the free slot sharing the most tokens wins, never the prompt's last token (its logits
    give the first token), never a slot taken since, never a share the target's rule refuses."""
    allowed: list[tuple[int, int]] = []
    cache = PrefixCache(lambda p, hi: (allowed.append((p, hi)) or hi - p <= 10), min_tokens=4)
    base = list(range(100, 130))
    cache.keep(0, base[:10], hi=12)
    cache.keep(1, base[:20], hi=22)
    cache.keep(2, base[:25], hi=40)  # written far past what it keeps: the rule says no
    cache.keep(3, base[:3], hi=3)  # shorter than min_tokens: not kept
    assert cache.match(base, free=[0, 1, 2, 3]) == (1, 20)
    assert (25, 40) in allowed
    assert cache.match(base, free=[0, 2]) == (0, 10)
    assert cache.match(base[:21], free=[1]) == (1, 20)
    assert cache.match(base[:20], free=[1]) == (1, 19)  # all but its last
    cache.drop(1)
    assert cache.match(base, free=[1]) is None
    cache.clear()
    assert cache.match(base, free=[0]) is None


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    target, drafter = make_tiny_pair(tmp_path_factory.mktemp("gemma4"), arch="gemma4", seed=1, block_size=B, layers=7)
    ref = build(EngineConfig(str(target), mode="ar", max_slots=4, max_model_len=MAX_LEN, dtype="float64", device="cpu"))
    return target, drafter, ref


@pytest.mark.parametrize("kernels", [True, False], ids=["cpu-kernels", "torch-ops"])
@pytest.mark.parametrize("margin", [B, 200], ids=["ring-wraps", "ring-holds-it-all"])
@pytest.mark.parametrize("mode", ["ar", "dflash"])
def test_gemma4_resumes_through_its_sliding_ring_only_where_the_ring_still_holds_the_window(gemma, mode, margin,
                                                                                            kernels, monkeypatch):
    """Sliding layers of window 8 keep a ring of 8 + margin rows a slot. A ring longer than the conversation holds
    every key: both second turns resume, one after the whole answer, one after an answer cut 10 tokens short (a
    client that edits the last turn). A ring of 8 + B rows has wrapped many times: the whole answer's turn still
    resumes (nothing was written past it but what the rule allows), the cut one does not (the answer's last 10
    tokens took the rows of the window before the cut). Every second turn decodes the whole prompt's tokens."""
    from dflash_bench.engine.fast.models import cache_layout as layout

    monkeypatch.setattr(layout, "RING_MARGIN", margin)
    target, drafter, ref = gemma
    engine = fast(target, drafter, mode, kernels=kernels)
    rng = random.Random(11)
    firsts = conversations(rng, engine.vocab_size, 2)
    one = turn(engine, [(f"c{i}", p) for i, p in enumerate(firsts)])
    cut = (0, 10)
    seconds = [p + one[f"c{i}"][0][:OUT - cut[i]] + ids(rng, 4, engine.vocab_size) for i, p in enumerate(firsts)]
    two = turn(engine, [(f"c{i}", p) for i, p in enumerate(seconds)])
    assert [two[f"c{i}"][0] for i in range(2)] == whole(ref, seconds)
    shared = [len(p) + OUT - max(cut[i], 1) for i, p in enumerate(firsts)]
    assert [two[f"c{i}"][1] for i in range(2)] == (shared if margin == 200 else [shared[0], 0])


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gemma4", "qwen3"])
def test_a_resume_on_the_triton_kernels_a_gpu_runs(request, arch, monkeypatch):
    """The resume on what a GPU runs (the Triton kernels, here in Triton's interpreter: a resumed prefill's fused
    q/k/v norms, RoPE and cache store, then the decode kernels), float32, Gemma 4's ring wrapped: the second turn's
    tokens are the reference engine's from the whole prompt."""
    from dflash_bench.engine.config import StepConfig
    from dflash_bench.engine.fast.core import EngineCore
    from dflash_bench.engine.fast.models import cache_layout as layout, dense as dense_family, gemma as gemma_family

    monkeypatch.setattr(layout, "RING_MARGIN", B)
    target = request.getfixturevalue("gemma" if arch == "gemma4" else "dense")[0]
    ref = build(EngineConfig(str(target), mode="ar", max_slots=1, max_model_len=MAX_LEN, dtype="float32", device="cpu"))
    family = gemma_family.GemmaTarget if arch == "gemma4" else dense_family.DenseTarget
    core = EngineCore(family(ref.target.model, max_slots=2, max_len=MAX_LEN, kernels=True), None,
                      StepConfig(verify_width="full", kv_block=16))
    assert core.probe.target.kernels is not None and core.probe.target.kernels.name == "triton"
    n, rng = 3, random.Random(2)
    first = ids(rng, PREFIX_MIN_TOKENS + 2, core.vocab_size)
    out = [core.add(0, first)]
    while len(out) < n:
        out += core.step([0])[0]
    core.release(0, first + out[:-1])
    second = first + out + [5, 6, 7]
    assert core.match(second, [0, 1]) == (0, len(first) + n - 1)
    core.claim(0)
    got = core.add_many([0], [second], [len(first) + n - 1])
    while len(got) < n:
        got += core.step([0])[0]
    assert got[:n] == whole(ref, [second], n)[0]
