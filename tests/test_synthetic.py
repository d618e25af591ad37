"""The synthetic acceptance profile (dflash_bench/synthetic.py): a mean turned into rates and rates into tau, the
card's tau per suite, and the same rates in every engine's launch command (vLLM's --speculative-config, the
builtin engine's serve flags, the emulator's)."""

from __future__ import annotations

import json

import pytest

from dflash_bench import profiles
from dflash_bench.errors import UserError
from dflash_bench.launch import plan_server
from dflash_bench.models import resolve
from dflash_bench.synthetic import CARD, SyntheticProfile, check_setting, geometric_rate, parse_rates, suite_profile

GEMMA = resolve("gemma-4-31B-it")


def test_a_mean_becomes_the_geometric_profile_of_that_mean():
    p = SyntheticProfile.from_tau(6.5, 16)
    a = geometric_rate(6.5, 16)
    assert len(p.rates) == 15 and p.block_size == 16
    assert p.rates == pytest.approx([a**i for i in range(1, 16)], abs=1e-6)
    assert p.tau == pytest.approx(6.5, abs=1e-4)
    assert p.conditional() == pytest.approx([a] * 15, abs=1e-4)  # a constant conditional rate: the builtin's draw
    assert p.tau_at(3) == pytest.approx(1 + a + a * a, abs=1e-4) and p.tau_at(1) == 1.0
    assert SyntheticProfile.from_tau(1.0, 16).rates == (0.0,) * 15
    assert SyntheticProfile.from_tau(16.0, 16).rates == (1.0,) * 15


def test_rates_become_tau_and_their_conditional_rates():
    p = SyntheticProfile.from_rates([1.0, 0.8, 0.8, 0.2, 0.0], 6)
    assert p.tau == pytest.approx(3.8)
    assert p.conditional() == pytest.approx([1.0, 0.8, 1.0, 0.25, 0.0])
    assert "3.80" in p.label() and "drawn" in p.label()


@pytest.mark.parametrize("rates, words", [([0.5, 0.9], "never increase"), ([1.2, 0.5], "[0, 1]"),
                                          ([0.5, float("nan")], "[0, 1]")])
def test_rates_that_are_no_profile_are_refused_in_one_sentence(rates, words):
    with pytest.raises(UserError, match=words.replace("[", r"\[").replace("]", r"\]")):
        SyntheticProfile.from_rates(rates, len(rates) + 1)
    with pytest.raises(UserError, match="--synthetic-acceptance-rates"):
        parse_rates(",".join(map(str, rates)))


def test_rates_of_another_block_and_a_tau_past_the_block_are_refused():
    with pytest.raises(UserError, match="15 for a block of 16, not 3"):
        SyntheticProfile.from_rates([0.9, 0.8, 0.7], 16)
    with pytest.raises(UserError, match="between 1 and the block size 16"):
        SyntheticProfile.from_tau(16.5, 16)
    with pytest.raises(UserError, match="comma-separated numbers"):
        parse_rates("0.9;0.8")


@pytest.mark.parametrize("value, saved", [("card", CARD), (" CARD ", CARD), ("6.5", "6.5"), ("7", "7")])
def test_the_sweep_setting_is_a_mean_or_card(value, saved):
    assert check_setting(value) == saved


@pytest.mark.parametrize("value", ["0.5", "high", "nan", "inf", ""])
def test_a_sweep_setting_that_is_neither_is_refused(value):
    with pytest.raises(UserError, match="--synthetic-acceptance takes a mean"):
        check_setting(value)


@pytest.mark.parametrize("suite, tau", [("math500", 8.59), ("gsm8k", 7.53), ("humaneval", 8.00), ("mbpp", 6.13),
                                        ("mt-bench", 4.23)])
def test_card_gives_each_suite_the_tau_of_its_card_at_concurrency_1(suite, tau):
    p = suite_profile(CARD, GEMMA, suite)
    assert p is not None and p.tau == pytest.approx(tau, abs=1e-4) and p.source == f"card {suite}"
    assert p.label() == f"synthetic τ {tau:.2f}, drawn (card {suite})"


@pytest.mark.parametrize("suite", ["spec-bench", "speed-bench", "long-4k"])
def test_a_suite_the_card_has_no_row_for_gets_the_mean_of_its_suites_said_in_its_label(suite):
    p = suite_profile(CARD, GEMMA, suite)
    mean = (8.59 + 7.53 + 8.00 + 6.13 + 4.23) / 5
    assert p is not None and p.tau == pytest.approx(round(mean, 2), abs=1e-4)
    assert p.source == "card mean of math500, gsm8k, humaneval, mbpp, mt-bench"
    assert p == suite_profile(CARD, GEMMA, "long-128")  # one profile (one server) for every suite the card lacks


def test_a_mean_is_the_same_for_every_suite_and_card_needs_a_card_with_tau():
    assert suite_profile("6.5", GEMMA, "gsm8k") == suite_profile("6.5", GEMMA, "spec-bench")
    assert suite_profile("6.5", GEMMA, "gsm8k").label() == "synthetic τ 6.50, drawn"  # type: ignore[union-attr]
    assert suite_profile(None, GEMMA, "gsm8k") is None
    with pytest.raises(UserError, match="publishes none"):
        suite_profile(CARD, resolve("Qwen3.5-4B"), "math500")  # its card has a table, without tau


def _spec_config(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--speculative-config") + 1])


@pytest.mark.parametrize("suite", ["gsm8k", "mt-bench", "spec-bench"])
def test_vllm_and_the_builtin_engine_are_launched_with_the_same_rates(suite):
    """vLLM's docker command and the builtin engine's serve command carry one profile: the same floats."""
    drawn = suite_profile(CARD, GEMMA, suite)
    assert drawn is not None
    _, _, docker, _, _ = plan_server("vllm", GEMMA, "dflash", preset="h200", runner="docker", synthetic=drawn)
    config = _spec_config(docker)
    assert config["rejection_sample_method"] == "synthetic" and config["method"] == "dflash"
    assert "synthetic_acceptance_length" not in config  # never a bare mean: vLLM would draw another profile
    assert config["num_speculative_tokens"] == len(config["synthetic_acceptance_rates"]) == 15
    _, _, serve, _, _ = plan_server("builtin", GEMMA, "dflash", preset="h200", runner="process", synthetic=drawn,
                                    extra_args=["--fast"])
    given = parse_rates(serve[serve.index("--synthetic-acceptance-rates") + 1])
    assert tuple(config["synthetic_acceptance_rates"]) == given == drawn.rates
    assert "--benchmark-only" in serve and "--draft" in serve
    _, _, emulate, _, _ = plan_server("emulator", GEMMA, "dflash", runner="process", synthetic=drawn)
    assert parse_rates(emulate[emulate.index("--acceptance-rates") + 1]) == drawn.rates


def test_an_ar_server_never_draws_and_a_dflash_server_without_a_profile_verifies():
    drawn = SyntheticProfile.from_tau(6.5, 16)
    _, _, ar, _, _ = plan_server("vllm", GEMMA, "ar", runner="docker", synthetic=drawn)
    assert "--speculative-config" not in ar
    _, _, plain, _, _ = plan_server("vllm", GEMMA, "dflash", runner="docker")
    assert "rejection_sample_method" not in _spec_config(plain)
    _, _, serve_ar, _, _ = plan_server("builtin", GEMMA, "ar", runner="process", synthetic=drawn)
    assert not any(a.startswith("--synthetic") or a == "--benchmark-only" for a in serve_ar)


def test_engines_without_a_synthetic_mode_are_refused_in_one_sentence():
    sglang = profiles.get("sglang").synthetic_refusal()
    assert sglang is not None and "SGLang's DFlash has no synthetic acceptance" in sglang and "\n" not in sglang
    assert profiles.get("llamacpp").synthetic_refusal() is not None
    with pytest.raises(UserError, match="SGLang's DFlash has no synthetic acceptance"):
        plan_server("sglang", GEMMA, "dflash", runner="docker", synthetic=SyntheticProfile.from_tau(6.5, 16))
    assert profiles.get("vllm").synthetic_refusal() is None and profiles.get("emulator").synthetic_refusal() is None
    builtin = profiles.get("builtin")
    assert "--engine-arg=--fast" in (builtin.synthetic_refusal([]) or "")
    assert builtin.synthetic_refusal(["--fast"]) is None
    assert "keep the sweep's option only" in (builtin.synthetic_refusal(["--fast", "--synthetic-acceptance=6.5"]) or "")


def test_vllm_is_refused_rates_of_another_length():
    with pytest.raises(UserError, match="one rate per draft position"):
        plan_server("vllm", GEMMA, "dflash", runner="docker", synthetic=SyntheticProfile.from_tau(3.0, 8))
