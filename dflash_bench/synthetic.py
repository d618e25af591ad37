"""Synthetic acceptance: one drawn acceptance profile that every engine able to draw one is given alike.

For benchmarking random weights (or any drafter) at a chosen acceptance: the verifier accepts drafts by a draw
instead of comparing them with the target's tokens, so every answer is wrong on purpose, but each step costs
what a real one does. A profile is, per draft position i = 1..K (K = block size - 1), the *unconditional* rate

    r_i = P(the first i drafts of a step are all accepted),     1 >= r_1 >= r_2 >= ... >= r_K >= 0,

which is what vLLM's `--speculative-config` takes as `synthetic_acceptance_rates`. A step that verifies the
whole block commits its accepted run plus one token, so tau = 1 + r_1 + ... + r_K; a step that verifies only
its first w - 1 drafts commits 1 + r_1 + ... + r_{w-1} (`tau_at`). Each position is drawn with its conditional
rate c_i = r_i / r_{i-1} (r_0 = 1), as vLLM's rejection sampler and the builtin engine both do.

A mean tau alone becomes the geometric profile r_i = a^i, 1 + a + ... + a^K = tau (`from_tau`): a constant
conditional rate a, the builtin engine's draw. vLLM turns a bare mean into another profile (positions below
tau - 1 always accepted, the next one by the fraction, none after), so the harness never gives it a mean: every
engine gets the rates.

`sweep --synthetic-acceptance TAU|card` (`suite_profile`): TAU for every suite, or `card`: each suite's tau from
the pair's model card at concurrency 1 (published.py), and for a suite the card has no row for (Spec-Bench,
SPEED-Bench, the long-<N> suites) the mean of the card's suites, said in the profile's `source`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol, Sequence

from pydantic import BaseModel, ConfigDict, field_validator

from dflash_bench.errors import UserError

if TYPE_CHECKING:
    from dflash_bench.published import PublishedTable

CARD = "card"  # sweep --synthetic-acceptance card: each suite's tau from the pair's model card
DIGITS = 6  # decimals the rates are given to an engine with (tau moves by under 1e-5)
TAU_DIGITS = 4  # decimals of a profile's tau: its rates' rounding stays below them


class SyntheticProfile(BaseModel):
    """Per draft position the unconditional acceptance rate an engine is told to draw (see the module)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rates: tuple[float, ...]  # r_1..r_K: P(the first i drafts all accepted), non-increasing in [0, 1]
    source: str = ""  # where it came from, beside its tau: "" (a mean given), "card gsm8k", "rates"

    @field_validator("rates")
    @classmethod
    def _non_increasing(cls, rates: tuple[float, ...]) -> tuple[float, ...]:
        if not rates:
            raise ValueError("a synthetic acceptance profile needs a rate per draft position")
        if not all(math.isfinite(r) and 0.0 <= r <= 1.0 for r in rates):
            raise ValueError(f"synthetic acceptance rates lie in [0, 1], not {list(rates)}")
        if any(b > a for a, b in zip(rates, rates[1:])):
            raise ValueError(f"synthetic acceptance rates are unconditional (the first i drafts all accepted), so "
                             f"they never increase by position: {list(rates)}")
        return rates

    @classmethod
    def from_tau(cls, tau: float, block_size: int, source: str | None = None) -> SyntheticProfile:
        """The geometric profile of mean tau over a block of `block_size` (r_i = a^i)."""
        a = geometric_rate(tau, block_size)
        rates = tuple(min(round(a**i, DIGITS), 1.0) for i in range(1, block_size))
        return cls(rates=rates, source=source or "")

    @classmethod
    def from_rates(cls, rates: Sequence[float], block_size: int, source: str = "rates") -> SyntheticProfile:
        """Rates given by hand, one per draft position of a block of `block_size`; one sentence when they are not."""
        if len(rates) != block_size - 1:
            raise UserError(f"synthetic acceptance rates: give one per draft position, {block_size - 1} for a block "
                            f"of {block_size}, not {len(rates)}")
        try:
            return cls(rates=tuple(float(r) for r in rates), source=source)
        except ValueError as err:  # pydantic's ValidationError is a ValueError
            raise UserError(_first_error(err)) from None

    @property
    def block_size(self) -> int:
        return len(self.rates) + 1

    @property
    def tau(self) -> float:
        """Tokens per step when every step verifies the whole block."""
        return self.tau_at(self.block_size)

    def tau_at(self, width: int) -> float:
        """Tokens per step when each step verifies the anchor and its first width - 1 drafts."""
        return round(1.0 + sum(self.rates[: max(width - 1, 0)]), TAU_DIGITS)

    def conditional(self) -> list[float]:
        """Per position the rate it is drawn with once the positions before it were accepted (r_i / r_{i-1})."""
        before = (1.0, *self.rates[:-1])
        return [r / q if q > 0 else 0.0 for r, q in zip(self.rates, before)]

    def label(self) -> str:
        """How a row measured under it is labelled."""
        return f"synthetic τ {self.tau:.2f}, drawn" + (f" ({self.source})" if self.source else "")


def for_draft(profile: SyntheticProfile, tokens: int) -> SyntheticProfile:
    """The profile for a server that drafts `tokens` a step (an EAGLE-3 head beside the DFlash block): the same one
    where its length matches, else the geometric profile of the same tau over that length (the tau capped at
    tokens + 1, all a step can commit), so that both speculative servers of a sweep draw the same acceptance."""
    if len(profile.rates) == tokens:
        return profile
    tau = min(profile.tau, tokens + 1.0)
    return SyntheticProfile.from_tau(tau, tokens + 1, f"{profile.source or 'rates'}, over {tokens} drafts")


def geometric_rate(tau: float, block_size: int) -> float:
    """The constant conditional rate a with 1 + a + ... + a^(B-1) = tau (bisection)."""
    if not 1.0 <= tau <= block_size:
        raise UserError(f"a synthetic acceptance length (tau) lies between 1 and the block size {block_size}, "
                        f"not {tau:g}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if 1 + sum(mid**k for k in range(1, block_size)) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def parse_rates(text: str, option: str = "--synthetic-acceptance-rates") -> tuple[float, ...]:
    """'0.9,0.8,0.5' -> (0.9, 0.8, 0.5), checked as a profile's rates; one sentence for anything else."""
    try:
        rates = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise UserError(f"{option} takes comma-separated numbers, one per draft position, not {text!r}") from None
    try:
        SyntheticProfile(rates=rates)
    except ValueError as err:
        raise UserError(f"{option}: {_first_error(err)}") from None
    return rates


def check_setting(value: str) -> str:
    """`sweep --synthetic-acceptance`: `card` or a mean tau of at least 1, as it is saved (one sentence else)."""
    text = value.strip().lower()
    if text == CARD:
        return CARD
    if (why := setting_refusal(text)) is not None:
        raise UserError(why)
    return f"{float(text):g}"


def setting_refusal(value: str) -> str | None:
    """The sentence for a `--synthetic-acceptance` that is neither `card` nor a mean tau of at least 1 (None: it
    stands)."""
    if value == CARD:
        return None
    try:
        tau = float(value)
    except ValueError:
        tau = math.nan
    if math.isfinite(tau) and tau >= 1:
        return None
    return (f"--synthetic-acceptance takes a mean acceptance length (tau, at least 1) or 'card' (each suite's tau "
            f"from the model card), not {value!r}")


class CardPair(Protocol):
    """What the card's profiles read of a pair (a models.ModelPair): its name, its block and its card's table."""

    @property
    def name(self) -> str: ...

    @property
    def block_size(self) -> int: ...

    def published(self) -> PublishedTable | None: ...


def card_taus(pair: CardPair) -> dict[str, float]:
    """Each suite's tau on the pair's model card at concurrency 1 (empty where the card publishes none)."""
    table = pair.published()
    if table is None:
        return {}
    return {r.suite: r.tau for r in table.rows if r.concurrency == 1 and r.tau is not None}


def suite_profile(setting: str | None, pair: CardPair, suite: str) -> SyntheticProfile | None:
    """The profile a DFlash server of `suite`'s cells is given under `sweep --synthetic-acceptance setting`."""
    if setting is None:
        return None
    if setting != CARD:
        return SyntheticProfile.from_tau(float(setting), pair.block_size)
    taus = card_taus(pair)
    if not taus:
        raise UserError(f"--synthetic-acceptance card takes each suite's tau from the model card, and the card of "
                        f"{pair.name} publishes none: give a mean tau instead, e.g. --synthetic-acceptance 6.5")
    if suite in taus:
        return SyntheticProfile.from_tau(taus[suite], pair.block_size, f"card {suite}")
    mean = sum(taus.values()) / len(taus)
    # no row of its own: the same profile for every such suite (one server for them all)
    return SyntheticProfile.from_tau(round(mean, 2), pair.block_size, f"card mean of {', '.join(taus)}")


def _first_error(err: ValueError) -> str:
    errors = getattr(err, "errors", None)
    if callable(errors):
        msg = str(errors()[0].get("msg", err))
        return msg.removeprefix("Value error, ")
    return str(err)
