"""`EngineCore`: the fast path's scheduler and runner side by side (nano-vllm's LLMEngine, vLLM v1's EngineCore).

The core is the only caller of either: it asks the `Scheduler` for each decision (a step's `StepPlan`, a prefill
group, the graph shapes to capture) and hands it to the `FastRunner`, which executes it; it tells the scheduler
what was prefilled, released and collected. Neither part knows the other. `FastEngine` (engine.py) adds requests
and their bookkeeping on top and calls the core alone; tests and benchmarks drive a core directly (`drive.py`),
read it through its `probe` and `watch` its launches.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch

from dflash_bench.engine.config import StepConfig
from dflash_bench.engine.fast.models.family import Drafter, Target
from dflash_bench.engine.fast.probe import Probe
from dflash_bench.engine.fast.running.runner import FastRunner
from dflash_bench.engine.fast.running.timer import StepTimer
from dflash_bench.engine.fast.scheduling.scheduler import Row, Scheduler, StepPlan
from dflash_bench.synthetic import SyntheticProfile

log = logging.getLogger("dflash_bench.engine")


@dataclass(frozen=True)
class Launched:
    """One launch of a core as a watcher sees it (`EngineCore.watch`): a step's plan, or a prefill group (its slots;
    `P` its graph's prompt bucket, None: one eager forward); and the steps in flight after it."""

    inflight: int
    plan: StepPlan | None = None
    prefill: tuple[int, ...] = ()
    P: int | None = None


class EngineCore:
    """Greedy AR (no drafter) or DFlash (with a drafter) decoding on the fast path: a `Scheduler` and a `FastRunner`
    over one target's slots."""

    def __init__(self, target: Target, drafter: Drafter | None, config: StepConfig, *, graphs: bool | None = None,
                 keep_logits: bool = False, overlap: bool = True):
        """`config`: how it steps (serve's options); `graphs` (default: on CUDA) captures each step shape once;
        `keep_logits`: the target's logits of each step per slot (for logprobs); `overlap`: the drafter's context
        beside the target's last layers, on a second stream."""
        self.config = config
        self._runner = FastRunner(target, drafter, config, graphs=graphs, keep_logits=keep_logits, overlap=overlap)
        self._scheduler = Scheduler(config, slots=self._runner.S, block=self._runner.B, max_len=self._runner.max_len,
                                    graphs=self._runner.graphs_on, rides=target.rides, parallel=target.shard.on,
                                    resumable=target.resumable)
        self.B, self.max_len, self.vocab_size = self._runner.B, self._runner.max_len, target.vocab_size
        self.width = self._scheduler.fixed  # the width of the step collected last
        self._watchers: list[Callable[[Launched], None]] = []

    @property
    def logits(self) -> torch.Tensor | None:
        """Target logits of the last step per slot (for logprobs); a prefill's last logits at position 0."""
        return self._runner.logits

    @property
    def timer(self) -> StepTimer | None:
        """A benchmark's timer, attached to the runner's launches (`StepTimer.attach(core)`)."""
        return self._runner.timer

    @timer.setter
    def timer(self, timer: StepTimer | None) -> None:
        self._runner.timer = timer

    @property
    def dev(self) -> torch.device:
        return self._runner.dev

    @property
    def inflight(self) -> int:
        """Steps launched and not yet collected."""
        return len(self._runner.inflight)

    @property
    def synthetic(self) -> SyntheticProfile | None:
        """The acceptance profile drawn instead of the target's verdict (benchmarks; None: acceptance is measured)."""
        return self._runner.bodies.synthetic

    @property
    def probe(self) -> Probe:
        """What a benchmark or a test may read of this core (`probe.py`)."""
        return Probe(self._scheduler, self._runner)

    @property
    def width_policy(self) -> str:
        """How each step's verify width is chosen: "auto" (by load), "full" (the whole block) or "w<N>" (fixed N)."""
        sched = self._scheduler
        return "auto" if sched.chooser else "full" if sched.fixed == self.B else f"w{sched.fixed}"

    def watch(self, fn: Callable[[Launched], None]) -> None:
        """Call `fn` after every step and prefill group this core launches (tests and benchmarks: what ran, how far
        ahead)."""
        self._watchers.append(fn)

    def _launched(self, launch: Launched) -> None:
        for fn in self._watchers:
            fn(launch)

    def drop_graphs(self) -> None:
        """Drop every captured graph, once the device has run what was queued (a tensor-parallel engine's graphs hold
        its process group's communicator: they go before the group ends; a benchmark frees their memory)."""
        self._runner.graphs.clear()

    def lead(self, followers: Any) -> None:
        """Rank 0 of a tensor-parallel engine: from here on, every runner call is replayed by the other ranks
        (`parallel/ranks.py` `Followers`, ready)."""
        self._runner.followers = followers

    def replay(self, name: str, *args: Any, **kw: Any) -> None:
        """A tensor-parallel rank above 0: run what rank 0's runner ran (`Followers.send`): a prefill, a step's
        plan, a release, or the collect that retires the oldest step."""
        if name == "collect":
            self._runner.retire()
        elif name in ("prefill", "run", "release"):
            getattr(self._runner, name)(*args, **kw)
        else:
            raise ValueError(f"rank 0 sent no runner call {name!r}")

    def capture_all(self, watch: Any = None) -> int:
        """Capture the graphs of every shape the scheduler may plan, before any request is added (GPU; a CPU runs
        eagerly): serving never stops to capture. Returns the number of graphs. `watch`: a tensor-parallel rank's
        watchdog (`ranks.Watch`)."""
        if self._scheduler.lengths:
            raise RuntimeError("capture_all runs before any request is added")
        n, t0 = 0, time.perf_counter()
        graphs: Counter[str] = Counter()  # per kind: what start-up spends on each
        seconds: defaultdict[str, float] = defaultdict(float)
        for key in self._scheduler.graph_keys():  # one at a time, in the scheduler's order (every rank's)
            t = time.perf_counter()
            n = self._runner.capture([key], watch)
            graphs[key[0]] += 1
            seconds[key[0]] += time.perf_counter() - t
        if n:  # none on a CPU, or with --enforce-eager
            log.info("captured %d step graphs in %.1f s: %s", n, time.perf_counter() - t0,
                     ", ".join(f"{c} {kind} in {seconds[kind]:.1f} s" for kind, c in graphs.items()))
        return n

    # ---- requests -------------------------------------------------------------------------------
    def add(self, slot: int, prompt: list[int]) -> int:
        """Prefill `prompt` into `slot`; returns the first generated token."""
        return self.add_many([slot], [prompt])[0]

    def admission(self, prompts: Iterable[tuple[int, bool]], free: int) -> int:
        """How many of the waiting prompts (oldest first: the tokens each leaves to prefill, whether it resumes a
        kept prefix) the next prefill takes, `free` slots free (`Scheduler.admission`)."""
        return self._scheduler.admission(prompts, free)

    def add_many(self, slots: list[int], prompts: list[list[int]], starts: Sequence[int] | None = None) -> list[int]:
        """Prefill `prompts[i]` into `slots[i]`, in the groups the scheduler makes (`Scheduler.prefill_groups`);
        returns each one's first generated token, in input order. Nothing is run unless every prompt fits.
        `starts[i]` > 0: the slot holds the prompt's first starts[i] tokens already (`match`), and only the rest is
        prefilled, in groups of their own (`Scheduler.resume_groups`)."""
        at = list(starts) if starts is not None else [0] * len(prompts)
        whole = [i for i in range(len(prompts)) if not at[i]]
        resumed = [i for i in range(len(prompts)) if at[i]]
        toks: dict[int, int] = {}
        for g, graphed in self._scheduler.prefill_groups([len(prompts[i]) for i in whole]):
            ids = [whole[j] for j in g]
            toks.update(zip(ids, self.prefill_group([slots[i] for i in ids], [prompts[i] for i in ids], graphed)))
        for g in self._scheduler.resume_groups([at[i] for i in resumed], [len(prompts[i]) - at[i] for i in resumed]):
            ids = [resumed[j] for j in g]
            toks.update(zip(ids, self.prefill_group([slots[i] for i in ids], [prompts[i] for i in ids], False,
                                                    [at[i] for i in ids])))
        return [toks[i] for i in range(len(prompts))]

    def prefill_group(self, slots: list[int], prompts: list[list[int]], graphed: bool,
                      starts: list[int] | None = None) -> list[int]:
        """Prefill `prompts` into `slots` as one group: the graph of its rows (padded to the longest one's bucket) or
        one eager forward; returns their first tokens. `starts` (eager only): each slot holds its prompt's first
        starts[i] tokens already, and what follows is prefilled. `add_many` groups as the scheduler says; a
        benchmark comparing the ways calls this."""
        if starts is not None and graphed:
            raise ValueError("a resumed prefill runs eagerly: the graphs are captured from position 0")
        P = self._scheduler.padded(max(map(len, prompts))) if graphed else None
        rest = prompts if starts is None else [p[at:] for p, at in zip(prompts, starts)]
        first = self._runner.prefill(slots, rest, P, starts)
        for s, p in zip(slots, prompts):
            self._scheduler.prefilled(s, len(p))
        self._launched(Launched(len(self._runner.inflight), prefill=tuple(slots), P=P))
        return first

    def release(self, slot: int, keep: Sequence[int] | None = None) -> None:
        """Free `slot`; `keep`: the tokens whose K/V it holds from position 0, for a later prompt that starts with
        them (`match`; with prefix caching off, nothing is kept)."""
        self._runner.release(slot, keep=self._scheduler.release(slot, keep))

    # ---- the prefix cache (`scheduling/prefix.py`) -------------------------------------------------------------
    def match(self, prompt: Sequence[int], free: Sequence[int]) -> tuple[int, int] | None:
        """The free slot to resume `prompt` in and the tokens of it that slot holds (None: prefill it whole)."""
        return self._scheduler.match(prompt, free)

    def claim(self, slot: int) -> None:
        """A new request takes `slot`: what it kept is not to be resumed any more."""
        self._scheduler.claim(slot)

    def forget(self) -> None:
        """Forget every slot's kept tokens (/reset_prefix_cache)."""
        self._scheduler.forget()

    # ---- steps ----------------------------------------------------------------------------------
    def schedule(self, rows: Sequence[Row], ahead: bool | None = None) -> int:
        """Launch the steps the scheduler plans for `rows` now (`Scheduler.schedule`: step-ahead, logprobs,
        max_tokens, the cache bound, the prompts that ride); returns how many."""
        plans = self._scheduler.schedule(rows, ahead)
        for plan in plans:
            self._run(plan)
        return len(plans)

    def launch(self, slots: list[int], rides: Sequence[tuple[int, list[int]]] = ()) -> bool:
        """Launch the one step the scheduler plans for `slots` (carrying `rides`: AR with --prefill mixed) behind
        those in flight; False, launching nothing, when it plans none (the cache bound, or two steps in flight)."""
        plan: StepPlan | None = self._scheduler.plan(slots, rides)
        if plan is not None:
            self._run(plan)
        return plan is not None

    def _run(self, plan: StepPlan) -> None:
        self._runner.run(plan)
        self._launched(Launched(len(self._runner.inflight), plan=plan))

    def step(self, slots: list[int]) -> dict[int, list[int]]:
        """Advance every slot in `slots` by one verify (DFlash) or one token (AR); returns the new tokens."""
        if not self.launch(slots):
            raise ValueError(f"a sequence would pass the cache length {self.max_len}")
        return self.collect()

    def collect(self) -> dict[int, list[int]]:
        """The new tokens of the oldest step in flight, per slot (slots released, or re-admitted, since are left
        out); the prompts that rode in it are admitted, their first tokens in `took`."""
        got = self._runner.collect()
        plan = got.plan
        current = self._scheduler.current(plan)
        accepted = {s: got.accepted[s] for s in current}
        self._scheduler.collected(plan, accepted, got.firsts, got.seconds)
        timer = self._runner.timer
        if timer is not None:
            timer.collected(plan, len(current), sum(accepted.values()))
        self.width = plan.width
        return {s: got.tokens[s] for s in current}

    # ---- prompts that ride (AR with --prefill mixed) ----------------------------------------------------
    def rows(self, slots: list[int]) -> list[int]:
        """Of the running `slots`, those a step takes now (not the ones whose prompt waits to ride)."""
        return self._scheduler.rows(slots)

    def wait_to_ride(self, slots: list[int], prompts: list[list[int]], logprobs: bool) -> bool:
        """Whether these admitted prompts wait to ride the next steps rather than be prefilled now (the scheduler's
        `waits_to_ride`); when so, they wait from here on."""
        if not self._scheduler.waits_to_ride(prompts, logprobs):
            return False
        self._scheduler.wait(slots, prompts)
        return True

    @property
    def took(self) -> dict[int, int]:
        """The slots the step collected last prefilled (their prompts rode in it) and their first tokens."""
        return dict(self._scheduler.took)

    @property
    def rode(self) -> int:
        """Prompts prefilled by a decode step's forward so far."""
        return self._scheduler.rode

    def unridden(self) -> list[tuple[int, list[int]]]:
        """With no row left to step, the prompts still waiting to ride (they leave the queue): to prefill now."""
        return self._scheduler.unridden()

    def widths_chosen(self) -> dict[int, int]:
        """Steps per verify width so far, when the width is chosen by load (what a benchmark reads of the chooser)."""
        return self._scheduler.chosen()
