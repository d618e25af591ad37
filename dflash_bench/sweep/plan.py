"""What a sweep will do: its settings, its cells, the order it runs them in, and resume checks."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from dflash_bench.errors import UserError
from dflash_bench.store import CellPlan, cell_id

MODES = ("ar", "dflash")


class SweepSettings(BaseModel):
    """Everything that decides what a sweep measures. A resumed sweep must agree on all of it."""

    model: str
    engines: list[str] = Field(default_factory=lambda: ["builtin"])
    suites: list[str]
    concurrency: list[int] = Field(default_factory=lambda: [1, 8, 32])
    num_prompts: int | None = None  # per cell; None means max(concurrency, suite default)
    max_tokens: int | None = None  # None means each suite's default
    repeats: int = 1
    temperature: float = 0.0
    seed: int = 0
    thinking: bool | None = None  # None means the model pair's default
    gpu: str = "generic"  # preset name for engine flags
    runner: str = "docker"  # docker | process
    port: int | None = None  # port of launched servers (None: the engine's default)
    image: str | None = None  # container image of launched servers (None: the engine's pinned one)
    url_ar: str | None = None
    url_dflash: str | None = None
    save_token_ids: bool = False
    engine_args: list[str] = Field(default_factory=list)
    engine_options: dict[str, Any] = Field(default_factory=dict)  # e.g. builtin: target/drafter dirs, device

    # settings that may change between a run and its resume without changing what is measured
    RESUME_FREE: ClassVar[frozenset[str]] = frozenset({"runner", "port", "url_ar", "url_dflash"})

    def identity(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if k not in self.RESUME_FREE}


@dataclass(frozen=True)
class Launch:
    """One server lifetime: an (engine, mode) and the consecutive cells measured on it."""

    engine: str
    mode: str
    cells: tuple[CellPlan, ...]


def plan_cells(settings: SweepSettings) -> list[CellPlan]:
    """engine x repeat x mode x suite x concurrency, in run order.

    Modes alternate with the repeat (AR, DFlash, then DFlash, AR, ...) so that slow drift of the machine
    (clocks, temperature) lands on both modes equally; consecutive cells of one mode share a launch.
    """
    _check(settings)
    out = []
    for engine in settings.engines:
        for repeat in range(settings.repeats):
            modes = MODES if repeat % 2 == 0 else MODES[::-1]
            for mode in modes:
                for suite in settings.suites:
                    for c in settings.concurrency:
                        out.append(CellPlan(cell_id=cell_id(engine, mode, suite, c, repeat), engine=engine,
                                            mode=mode, suite=suite, concurrency=c, repeat=repeat))
    return out


def launches(plan: list[CellPlan], pending_only: bool = True) -> list[Launch]:
    """Group the plan into server lifetimes: consecutive cells of one (engine, mode)."""
    cells = [c for c in plan if c.status in ("pending", "running", "failed")] if pending_only else list(plan)
    return [Launch(engine, mode, tuple(group)) for (engine, mode), group in groupby(cells, key=lambda c: (c.engine, c.mode))]


def check_resume(saved: dict[str, Any], current: SweepSettings) -> None:
    """Refuse to resume when what is measured differs; name the first differing settings."""
    now = current.identity()
    diff = [k for k in sorted(set(saved) | set(now)) if k not in current.RESUME_FREE and saved.get(k) != now.get(k)]
    if diff:
        shown = ", ".join(f"{k} (sweep: {saved.get(k)!r}, now: {now.get(k)!r})" for k in diff[:3])
        raise UserError(f"cannot resume: the settings differ from the sweep's manifest: {shown}; "
                        "drop those options to reuse the saved ones, or start a new sweep")


def _check(settings: SweepSettings) -> None:
    if not settings.suites:
        raise UserError("no suites to run; pass --suites all or a comma-separated list")
    if not settings.concurrency or any(c < 1 for c in settings.concurrency):
        raise UserError("--concurrency takes positive integers, e.g. 1,8,32")
    if settings.repeats < 1:
        raise UserError("--repeats must be at least 1")
    if len(set(settings.concurrency)) != len(settings.concurrency):
        raise UserError("--concurrency lists a value twice")
    if bool(settings.url_ar) != bool(settings.url_dflash):
        raise UserError("give both --url-ar and --url-dflash to measure servers you already run, or neither")
    if settings.url_ar and len(settings.engines) != 1:
        raise UserError("with --url-ar/--url-dflash, name the one engine those servers run with --engine")
