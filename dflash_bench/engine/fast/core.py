"""`EngineCore`: the fast path's scheduler and runner side by side (nano-vllm's LLMEngine, vLLM v1's EngineCore).

The core asks the `Scheduler` for each decision (a step's `StepPlan`, a prefill group, the graph shapes to
capture) and hands it to the `FastRunner`, which executes it; it tells the scheduler what was prefilled, released
and collected. Neither part knows the other. `FastEngine` (engine.py) adds requests and their bookkeeping on top;
tests and benchmarks drive a core directly (`drive.py`).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from dflash_bench.engine.config import StepConfig
from dflash_bench.engine.fast.models.family import Drafter, Target
from dflash_bench.engine.fast.running.runner import FastRunner
from dflash_bench.engine.fast.scheduling.scheduler import Row, Scheduler, StepPlan
from dflash_bench.engine.fast.running.timer import StepTimer


class EngineCore:
    """Greedy AR (no drafter) or DFlash (with a drafter) decoding on the fast path: a `Scheduler` and a `FastRunner`
    over one target's slots."""

    def __init__(self, target: Target, drafter: Drafter | None, config: StepConfig, *, graphs: bool | None = None,
                 keep_logits: bool = False, overlap: bool = True):
        """`config`: how it steps (serve's options); `graphs` (default: on CUDA) captures each step shape once;
        `keep_logits`: the target's logits of each step per slot (for logprobs); `overlap`: the drafter's context
        beside the target's last layers, on a second stream."""
        self.config = config
        self.runner = FastRunner(target, drafter, config, graphs=graphs, keep_logits=keep_logits, overlap=overlap)
        self.sched = Scheduler(config, slots=self.runner.S, block=self.runner.B, max_len=self.runner.max_len,
                               graphs=self.runner.graphs_on, rides=target.rides)
        self.B, self.max_len = self.runner.B, self.runner.max_len
        self.width = self.sched.fixed  # the width of the step collected last

    @property
    def logits(self) -> torch.Tensor | None:
        """Target logits of the last step per slot (for logprobs); a prefill's last logits at position 0."""
        return self.runner.logits

    @property
    def timer(self) -> StepTimer | None:
        """A benchmark's timer, attached to the runner's launches (`StepTimer.attach(core)`)."""
        return self.runner.timer

    @timer.setter
    def timer(self, timer: StepTimer | None) -> None:
        self.runner.timer = timer

    @property
    def dev(self) -> torch.device:
        return self.runner.dev

    @property
    def inflight(self) -> int:
        """Steps launched and not yet collected."""
        return len(self.runner.inflight)

    def capture_all(self, watch: Any = None) -> int:
        """Capture the graphs of every shape the scheduler may plan, before any request is added (GPU; a CPU runs
        eagerly): serving never stops to capture. Returns the number of graphs. `watch`: a tensor-parallel rank's
        watchdog (`ranks.Watch`)."""
        if self.sched.lengths:
            raise RuntimeError("capture_all runs before any request is added")
        return self.runner.capture(self.sched.graph_keys(), watch)

    # ---- requests -------------------------------------------------------------------------------
    def add(self, slot: int, prompt: list[int]) -> int:
        """Prefill `prompt` into `slot`; returns the first generated token."""
        return self.add_many([slot], [prompt])[0]

    def add_many(self, slots: list[int], prompts: list[list[int]]) -> list[int]:
        """Prefill `prompts[i]` into `slots[i]`, in the groups the scheduler makes (`Scheduler.prefill_groups`);
        returns each one's first generated token, in input order. Nothing is run unless every prompt fits."""
        toks: dict[int, int] = {}
        for g, graphed in self.sched.prefill_groups([len(p) for p in prompts]):
            gs, gp = [slots[i] for i in g], [prompts[i] for i in g]
            first = self.runner.prefill(gs, gp, self.sched.padded(max(map(len, gp))) if graphed else None)
            for s, p in zip(gs, gp):
                self.sched.prefilled(s, len(p))
            toks.update(zip(g, first))
        return [toks[i] for i in range(len(prompts))]

    def release(self, slot: int) -> None:
        self.runner.release(slot)
        self.sched.release(slot)

    # ---- steps ----------------------------------------------------------------------------------
    def schedule(self, rows: Sequence[Row], ahead: bool | None = None) -> int:
        """Launch the steps the scheduler plans for `rows` now (`Scheduler.schedule`: step-ahead, logprobs,
        max_tokens, the cache bound, the prompts that ride); returns how many."""
        plans = self.sched.schedule(rows, ahead)
        for plan in plans:
            self.runner.run(plan)
        return len(plans)

    def launch(self, slots: list[int], rides: Sequence[tuple[int, list[int]]] = ()) -> bool:
        """Launch the one step the scheduler plans for `slots` (carrying `rides`: AR with --prefill mixed) behind
        those in flight; False, launching nothing, when it plans none (the cache bound, or two steps in flight)."""
        plan: StepPlan | None = self.sched.plan(slots, rides)
        if plan is not None:
            self.runner.run(plan)
        return plan is not None

    def step(self, slots: list[int]) -> dict[int, list[int]]:
        """Advance every slot in `slots` by one verify (DFlash) or one token (AR); returns the new tokens."""
        if not self.launch(slots):
            raise ValueError(f"a sequence would pass the cache length {self.max_len}")
        return self.collect()

    def collect(self) -> dict[int, list[int]]:
        """The new tokens of the oldest step in flight, per slot (slots released, or re-admitted, since are left
        out); the prompts that rode in it are admitted, their first tokens in `sched.took`."""
        got = self.runner.collect()
        plan = got.plan
        current = self.sched.current(plan)
        accepted = {s: got.accepted[s] for s in current}
        self.sched.collected(plan, accepted, got.firsts, got.seconds)
        timer = self.runner.timer
        if timer is not None:
            timer.collected(plan, len(current), sum(accepted.values()))
        self.width = plan.width
        return {s: got.tokens[s] for s in current}

    def widths_chosen(self) -> dict[int, int]:
        """Steps per verify width so far, when the width is chosen by load (what a benchmark reads of the chooser)."""
        return self.sched.chosen()
