"""The gate's settings: thresholds, bootstrap and missing-cell policy, read from a TOML file (examples/gate.toml)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dflash_bench.errors import UserError

Fraction = Annotated[float, Field(ge=0, lt=1)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Thresholds(Strict):
    """Largest relative change in the bad direction that still passes (0.05 = 5%)."""

    acceptance_length: Fraction = 0.02
    throughput: Fraction = 0.05
    tpot: Fraction = 0.05
    speedup: Fraction = 0.05
    exact_match: Fraction = 0.02
    accuracy: Fraction = 0.05


class Bootstrap(Strict):
    resamples: int = Field(2000, ge=100, le=200_000)
    confidence: float = Field(0.95, gt=0.5, lt=1)
    seed: int = 0
    min_repeats: int = Field(2, ge=2)  # on both sides, else the plain threshold


class CellsPolicy(Strict):
    fail_on_missing: bool = False  # a baseline cell absent from the sweep fails the gate
    # a partial cell (some measured requests failed) fails the gate unless at most this share of its requests failed
    allow_failed_share: Fraction = 0.0


class Reference(Strict):
    """Another engine's τ against the builtin engine's in the same sweep (gate/reference.py)."""

    check: bool = True  # false: the gate leaves the comparison out (the report still shows it)
    tolerance: Fraction | None = None  # largest relative shortfall that passes; None: thresholds.acceptance_length


class MachineSpeedRule(Strict):
    """When two runs ran on a machine of one speed (gate/machine.py): their speed probes' medians differ by no more
    than this share beyond what the probes' own spread explains."""

    speed_tolerance: Fraction = 0.10


class GateConfig(Strict):
    thresholds: Thresholds = Field(default_factory=Thresholds)
    bootstrap: Bootstrap = Field(default_factory=Bootstrap)
    cells: CellsPolicy = Field(default_factory=CellsPolicy)
    reference: Reference = Field(default_factory=Reference)
    machine: MachineSpeedRule = Field(default_factory=MachineSpeedRule)


def load_config(path: Path | None) -> GateConfig:
    """The gate's settings from a TOML file (see examples/gate.toml); defaults without one."""
    if path is None:
        return GateConfig()
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"thresholds file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read thresholds file {path}: {err}") from None
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"thresholds file {path} is not valid TOML ({err})") from None
    try:
        return GateConfig.model_validate(data)
    except ValidationError as err:
        e = err.errors()[0]
        loc = ".".join(str(x) for x in e.get("loc", ()))
        raise UserError(f"thresholds file {path}: {loc}: {e.get('msg')}; see examples/gate.toml") from None
