"""`Probe`: what a benchmark or a test may read of an `EngineCore`, and the few things it may set, without reaching
into the core's scheduler or runner (`EngineCore.probe`). Serving never uses it.

- the models: `target`, `drafter`, `vocab_size`;
- the device: `state` (the slots' device tensors), `graphed` and `graphs` (the CUDA graphs captured, by key),
  `launched` (steps launched), `wait_oldest` (the device's share of a step);
- the plan: the scheduler's facts and choices (`running`, `waiting`, `rode`, `took`, `widths`, `chooser`,
  `padded`, `can_ride`, `mixed`, `ride_queue`);
- synthetic acceptance: its profile and its draws (`synthetic`, `synthetic_draws`, `restart_draws`);
- a step body run eagerly, outside any plan (`body`: profiling);
- every launch, as it happens (`EngineCore.watch`); the steps' times and acceptance: `timer.StepTimer`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from dflash_bench.engine.fast.models.family import Drafter, Target
from dflash_bench.engine.fast.running.device_state import SlotState
from dflash_bench.engine.fast.running.runner import FastRunner
from dflash_bench.engine.fast.scheduling.scheduler import Chooser, Scheduler
from dflash_bench.synthetic import SyntheticProfile


class Probe:
    """A read-mostly view of one core's scheduler and runner (see the module)."""

    def __init__(self, scheduler: Scheduler, runner: FastRunner) -> None:
        self._scheduler, self._runner = scheduler, runner

    # ---- the models ---------------------------------------------------------------------------------
    @property
    def target(self) -> Target:
        return self._runner.t

    @property
    def drafter(self) -> Drafter | None:
        return self._runner.d

    @property
    def vocab_size(self) -> int:
        return self._runner.t.vocab_size

    # ---- the device ---------------------------------------------------------------------------------
    @property
    def state(self) -> SlotState:
        """The slots' device tensors (`out`: the last step's results per row; `active`, `start`, `logits`, ...)."""
        return self._runner.state

    @property
    def graphed(self) -> bool:
        """Whether steps and prefills run as captured CUDA graphs (else eagerly, as on a CPU)."""
        return self._runner.graphs_on

    @property
    def graphs(self) -> list[tuple]:
        """The keys of the graphs captured so far (`Scheduler.graph_keys`' shapes)."""
        return list(self._runner.graphs)

    @property
    def launched(self) -> int:
        """Steps launched so far."""
        return self._runner.launched

    def wait_oldest(self) -> None:
        """Wait until the device has run the oldest step in flight (nothing is read; `collect` reads it): the
        device's share of a step, apart from the host's."""
        done = self._runner.inflight[0].done if self._runner.inflight else None
        if done is not None:
            done.synchronize()

    # ---- the plan -----------------------------------------------------------------------------------
    @property
    def running(self) -> dict[int, int]:
        """The running slots and their committed tokens, as of the last step collected."""
        return dict(self._scheduler.lengths)

    @property
    def waiting(self) -> set[int]:
        """The slots whose prompt waits to ride a step, or rides in one in flight."""
        return self._scheduler.waiting()

    @property
    def rode(self) -> int:
        """Prompts prefilled by a decode step's forward so far."""
        return self._scheduler.rode

    @property
    def took(self) -> dict[int, int]:
        """The slots the step collected last prefilled (their prompts rode in it) and their first tokens."""
        return dict(self._scheduler.took)

    @property
    def widths(self) -> list[int]:
        """The verify widths a step may take."""
        return list(self._scheduler.widths)

    @property
    def chooser(self) -> Chooser | None:
        """The verify width's chooser by load (None: a fixed width); a benchmark may set its `decay`."""
        return self._scheduler.chooser

    @property
    def mixed(self) -> bool:
        """Whether prompts may ride the rows' steps (AR with --prefill mixed, a family that rides)."""
        return self._scheduler.mixed

    @property
    def ride_queue(self) -> int:
        """How many prompts may wait to ride at most (a larger burst is prefilled at once)."""
        return self._scheduler.ride_queue

    @ride_queue.setter
    def ride_queue(self, n: int) -> None:
        self._scheduler.ride_queue = n

    def padded(self, n: int) -> int:
        """A prompt of `n` tokens' prefill bucket."""
        return self._scheduler.padded(n)

    def runs_graph(self, k: int) -> bool:
        """Whether a prefill group of k prompts runs a captured graph (`Scheduler.runs_graph`)."""
        return self._scheduler.runs_graph(k)

    def can_ride(self, prompts: Sequence[Sequence[int]]) -> bool:
        """Whether these prompts may ride one step together."""
        return self._scheduler.can_ride(prompts)

    # ---- synthetic acceptance -----------------------------------------------------------------------
    @property
    def synthetic(self) -> SyntheticProfile | None:
        """The acceptance profile drawn instead of the target's verdict (None: acceptance is measured)."""
        return self._runner.bodies.synthetic

    @property
    def synthetic_draws(self) -> torch.Tensor | None:
        """Its table of draws `[steps, slots, B - 1]` (0.0: accepted, 1.0: not), read at each row's step counter."""
        return self._runner.bodies.draws if self._runner.bodies.synthetic is not None else None

    def restart_draws(self) -> None:
        """Every row's synthetic draws from the start of the table again (runs then draw the same acceptances)."""
        if self._runner.bodies.synthetic is not None:
            self._runner.bodies.synth_step.zero_()

    # ---- profiling ----------------------------------------------------------------------------------
    def body(self, kind: str, bs: int, L: int, w: int = 1) -> Callable[[], None]:
        """One step body (`ar`, `draft` or `verify`) of `bs` rows over `L` keys (width `w`), to run eagerly outside
        any plan: what a graph of that shape replays. For profiling its kernels only: it commits to the slots."""
        b = self._runner.bodies
        if kind == "ar":
            return lambda: b.ar(bs, L)
        if kind == "draft":
            return lambda: b.draft(bs, L, w)
        if kind == "verify":
            return lambda: b.verify(bs, L, w)
        raise ValueError(f"no step body {kind!r}: ar, draft or verify")
