"""`StepTimer`: what a benchmark measures of a `FastRunner`'s steps, attached from outside (not part of serving).

Attached (`StepTimer().attach(core)`), the runner marks each step it launches (CUDA events on a GPU, the host
clock on a CPU: a CPU step runs inside its launch) and tells the timer what each collected step accepted:
the median draft and verify times (`step_times_ms`), the steps and the acceptance counted since attaching
(`tau`, `drafted`, ...). A step that captured a graph is timed too (its body ran twice): benchmarks warm up
first. Detached, the runner marks nothing but what its width chooser needs.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch

from dflash_bench.engine.fast.scheduling.scheduler import StepPlan


class Timed(Protocol):
    """What a timer attaches to (`FastRunner`, or the `EngineCore` that holds it)."""

    timer: StepTimer | None
    dev: torch.device


def mark(device: torch.device) -> Any:
    """Now, in the device's stream order: a recorded CUDA event on a GPU, else the host clock."""
    if device.type == "cuda":
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev
    return time.perf_counter()


def seconds(device: torch.device, t0: Any, t1: Any) -> float:
    """Seconds between two marks (CUDA events already synchronised)."""
    return t0.elapsed_time(t1) / 1e3 if device.type == "cuda" else t1 - t0


class StepTimer:
    """Step times and counts of one runner from when it is attached (see the module)."""

    def __init__(self) -> None:
        self.marks: list[tuple[Any, Any, Any]] = []  # per step: (draft start, draft end / verify start, verify end)
        self.steps = self.accepted = self.row_steps = 0  # steps; accepted drafts and verifies summed over rows
        self.drafted = self.drafting_rows = 0  # drafts verified, and verifies that checked any, summed over rows
        self.attached: Timed | None = None
        self.device = torch.device("cpu")

    def attach(self, runner: Timed) -> StepTimer:
        runner.timer, self.attached, self.device = self, runner, runner.dev
        return self

    def detach(self) -> None:
        if self.attached is not None and self.attached.timer is self:
            self.attached.timer = None
        self.attached = None

    def launched(self, t0: Any, t1: Any, t2: Any) -> None:
        self.marks.append((t0, t1, t2))

    def collected(self, plan: StepPlan, rows: int, accepted: int) -> None:
        """A collected step: `rows` rows still wanted its tokens, `accepted` drafts accepted over them."""
        self.accepted += accepted
        self.steps += 1
        self.row_steps += rows
        self.drafting_rows += rows if plan.width > 1 else 0
        self.drafted += rows * (plan.width - 1)

    @property
    def tau(self) -> float:
        """Tokens per verify that checked drafts, bonus included (vLLM's 1 + accepted / drafts)."""
        return 1 + self.accepted / max(self.drafting_rows, 1)

    @property
    def verify_width(self) -> float:
        """Tokens verified per row and step, the anchor included."""
        return 1 + self.drafted / max(self.row_steps, 1)

    def step_times_ms(self) -> tuple[float, float]:
        """Median ms per draft and per verify (or AR) step over the steps marked."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            d = [a.elapsed_time(b) for a, b, _ in self.marks]
            v = [b.elapsed_time(c) for _, b, c in self.marks]
        else:
            d = [(b - a) * 1e3 for a, b, _ in self.marks]
            v = [(c - b) * 1e3 for _, b, c in self.marks]
        med = lambda xs: sorted(xs)[len(xs) // 2] if xs else 0.0  # noqa: E731
        return med(d), med(v)
