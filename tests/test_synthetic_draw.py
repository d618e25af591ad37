"""The builtin engine draws the synthetic acceptance profile it is launched with: a real run of the embedded pair at
full verify width, its per-position acceptance counted as /metrics counts it, against the profile's rates.

Each verify step draws its accepted run from fresh uniforms of a seeded table (steps.StepBodies), so the steps that
verify draft position i are independent trials that accept that far with probability r_i. The check is Chernoff's
bound on a binomial's two tails: n KL(observed || r_i) > t has probability at most 2 exp(-t), so with t = ln(2 K /
1e-6) over the K positions a correct engine fails it with probability below 1e-6 (the table is seeded: the run is
the same every time). Positions drawn with their unconditional rates instead of their conditional ones, or one
position off, lie far outside it: n KL of 80 to 200 at several positions, against a bound of 17.2.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from dflash_bench.engine.reference.decode import generate  # noqa: E402
from dflash_bench.engine.sampling_params import SamplingParams  # noqa: E402
from dflash_bench.launch import plan_server  # noqa: E402
from dflash_bench.models import resolve  # noqa: E402
from dflash_bench.synthetic import SyntheticProfile, parse_rates  # noqa: E402

pytestmark = pytest.mark.engine

PAIR = Path(__file__).resolve().parents[1] / "dflash_bench" / "assets" / "default_pair"
# unconditional rates: a repeated rate (a conditional rate of 1), steep and shallow falls, zeros at the end
RATES = (0.97, 0.9, 0.9, 0.75, 0.6, 0.6, 0.45, 0.3, 0.2, 0.2, 0.12, 0.05, 0.02, 0.0, 0.0)
FAIL_PROBABILITY = 1e-6
SLOTS, MAX_TOKENS, ROUNDS = 32, 64, 6  # about 1900 verify steps, every position verified by 1200 or more


def kl(q: float, p: float) -> float:
    """KL(Bernoulli(q) || Bernoulli(p)); infinite where q puts weight where p has none."""
    def term(a: float, b: float) -> float:
        return 0.0 if a == 0 else math.inf if b == 0 else a * math.log(a / b)
    return term(q, p) + term(1 - q, 1 - p)


def test_the_realized_acceptance_at_full_width_is_the_profile_it_was_launched_with():
    from dflash_bench.engine.config import EngineConfig
    from dflash_bench.engine.build import build

    pair = resolve(str(PAIR / "target"), drafter=str(PAIR / "drafter"))
    profile = SyntheticProfile.from_rates(RATES, pair.block_size)
    _, _, argv, _, _ = plan_server("builtin", pair, "dflash", runner="process", synthetic=profile, extra_args=["--fast"])
    given = argv[argv.index("--synthetic-acceptance-rates") + 1]  # what the sweep's server is launched with
    assert parse_rates(given) == RATES
    eng = build(EngineConfig.from_options(
        str(PAIR / "target"), str(PAIR / "drafter"), max_slots=SLOTS, max_model_len=MAX_TOKENS + 64, device="cpu",
        dtype="float32", fast=True, benchmark_only=True, verify_width="full", synthetic_acceptance_rates=given))
    assert eng.synthetic_acceptance == pytest.approx(profile.tau)  # the /metrics gauge and every response say it
    prompts = [eng.tok(f"Question {i}: what is {i} plus {i}?").input_ids for i in range(SLOTS)]
    for _ in range(ROUNDS):  # ignore_eos: a drawn EOS would cut a step's accepted run short of its draw
        generate(eng, prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    st = eng.stats
    assert st.widths and set(st.widths) == {pair.block_size}  # every step verified the whole block
    bound = math.log(2 * len(RATES) / FAIL_PROBABILITY)
    for i, (r, accepted, verified) in enumerate(zip(RATES, st.accepted_per_pos, st.verified_per_pos)):
        assert verified >= 1200, f"position {i + 1} verified only {verified} times"
        observed = accepted / verified
        assert verified * kl(observed, r) <= bound, (
            f"position {i + 1}: {accepted} of {verified} steps accepted that far ({observed:.3f}), the profile says {r}")
