"""tau as a property of the pair, the requests and the verify width (metrics/definitions.py): at temperature 0 and
a fixed width the builtin fast engine commits the same tokens and counts the same drafts and accepted tokens
whatever the concurrency and run to run; under `--verify-width auto` it counts the widths it used and the
width-free acceptance profile from which tau at any width follows."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

from dflash_bench.engine.reference.decode import generate  # noqa: E402
from dflash_bench.engine.sampling_params import SamplingParams  # noqa: E402
from dflash_bench.metrics.definitions import profile_tau  # noqa: E402

pytestmark = pytest.mark.engine

PAIR = Path(__file__).resolve().parents[1] / "dflash_bench" / "assets" / "default_pair"
TEXTS = ["Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
         "Write a function that returns the sum of the squares of a list of numbers.",
         "What is the capital of France? Answer in one sentence.",
         "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning."]


def engine(**kw):
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.build import build

    return build(EngineConfig.from_options(str(PAIR / "target"), str(PAIR / "drafter"), max_slots=4, max_model_len=512, device="cpu",
                             dtype="float32", **kw, fast=True))


def run(eng, prompts, concurrency: int, max_tokens: int = 40):
    """The prompts decoded `concurrency` at a time; the tokens and the counters' change over them."""
    st = eng.stats
    before = (st.drafts, st.draft_tokens, st.accepted, list(st.accepted_per_pos), list(st.verified_per_pos))
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    outs = []
    for i in range(0, len(prompts), concurrency):
        outs += [s.out for s in generate(eng, prompts[i: i + concurrency], sp)]
    after = (st.drafts, st.draft_tokens, st.accepted, list(st.accepted_per_pos), list(st.verified_per_pos))
    counts = tuple(a - b if isinstance(a, int) else [x - y for x, y in zip(a, b)] for a, b in zip(after, before))
    return outs, counts


@pytest.mark.parametrize("width", [None, 3], ids=["full", "w3"])
def test_at_a_fixed_width_tau_is_the_same_at_every_concurrency_and_run_to_run(width):
    eng = engine(verify_width=str(width or "full"))
    assert eng.book.width_policy == ("full" if width is None else f"w{width}")
    prompts = [eng.tok(t).input_ids for t in TEXTS]
    one, counts_one = run(eng, prompts, concurrency=1)
    four, counts_four = run(eng, prompts, concurrency=4)
    again, counts_again = run(eng, prompts, concurrency=2)
    assert one == four == again
    assert counts_one == counts_four == counts_again
    drafts, draft_tokens, accepted, per_pos, verified = counts_one
    assert drafts > 0 and 2 * accepted > drafts  # the embedded pair accepts: tau well above 1
    w = width or eng.B
    assert len(per_pos) == eng.B - 1 and all(v == 0 for v in verified[w - 1:])
    # every verify step checks w - 1 positions but a last one cut at max_tokens: the profile says so
    assert sum(verified) == draft_tokens and verified[0] == drafts and verified == sorted(verified, reverse=True)
    assert all(a <= v for a, v in zip(per_pos, verified)) and sum(per_pos) == accepted


def test_auto_width_counts_the_widths_used_and_the_profile_tau_follows_from():
    eng = engine(verify_width="auto")
    assert eng.book.width_policy == "auto"
    prompts = [eng.tok(t).input_ids for t in TEXTS]
    _, (drafts, draft_tokens, accepted, per_pos, verified) = run(eng, prompts, concurrency=4, max_tokens=48)
    widths = eng.stats.widths
    assert widths and sum(widths.values()) >= drafts
    assert sum(verified) == draft_tokens and verified[0] == drafts and verified == sorted(verified, reverse=True)
    profile = list(zip(verified, per_pos))
    tau = 1 + accepted / drafts
    # tau at the widths used is the pooled tau; the profile over the positions some step verified gives tau had
    # every step verified them all (the same only when every step verified the same positions)
    known = sum(v > 0 for v in verified)
    assert profile_tau(profile, known) is not None and profile_tau(profile, known + 1) is None or known == len(per_pos)
    assert profile_tau(profile[:1]) == pytest.approx(1 + per_pos[0] / drafts)
    assert tau >= 1


def test_the_same_pair_accepts_far_less_on_random_token_prompts():
    """Why `vllm bench serve`'s random dataset reads a lower tau than dflash-bench's suite prompts from the same
    server (docs/acceptance.md, "Two clients, one tau"): the requests differ, not the reading."""
    import random

    eng = engine(verify_width="full")
    prompts = [eng.tok(t).input_ids for t in TEXTS]
    rng = random.Random(0)
    # as the random dataset does: random ids decoded to text, which the server tokenizes again
    noise = [eng.tok(eng.tok.decode([rng.randrange(eng.vocab_size) for _ in p])).input_ids for p in prompts]
    _, (drafts, _, accepted, _, _) = run(eng, prompts, 4, max_tokens=64)
    _, (drafts_r, _, accepted_r, _, _) = run(eng, noise, 4, max_tokens=64)
    assert 1 + accepted_r / drafts_r < 0.7 * (1 + accepted / drafts)


def test_the_acceptance_profile_does_not_carry_tau_from_one_width_to_another():
    """Why the gate compares tau only at one fixed width (gate/tau.py): a narrower width starts more steps inside
    runs of easy tokens, so each position's share of accepted drafts rises as the width falls, and tau over the
    same first positions differs between widths (docs/acceptance.md quotes these prompts at 200 tokens)."""
    shares = {}
    for width in ("4", "full"):
        eng = engine(verify_width=width)
        prompts = [eng.tok(t).input_ids for t in TEXTS]
        _, (drafts, _, accepted, per_pos, verified) = run(eng, prompts, concurrency=4, max_tokens=64)
        shares[width] = profile_tau(list(zip(verified, per_pos)), 3)
    assert shares["4"] is not None and shares["full"] is not None
    assert shares["4"] > 1.05 * shares["full"], shares
