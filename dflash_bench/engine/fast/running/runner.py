"""Fixed-shape steps on device-resident state, captured as CUDA graphs per (batch bucket, KV-length bucket).

`FastRunner` executes plans (nano-vllm's ModelRunner): a `StepPlan` the scheduler made (`run`), a prefill group
(`prefill`), the graphs of every shape the scheduler may plan (`capture`). It decides nothing: `core.EngineCore`
holds it beside the `Scheduler` and hands it each decision. Its parts, by composition: the slots' device state
and the graph cache (device_state.py), the step bodies (steps.py), the prefills (prefill.py). A step runs its graphs
(steps.py: draft, then verify; AR; mixed), then one device-to-host copy into pinned memory. Nothing else runs
between graphs, so the GPU idles only while the host reads the result and launches the next step; two host
copies let step k+1 run while step k's tokens are read.
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass
from typing import Any, ContextManager

import torch

from dflash_bench.engine.config import StepConfig
from dflash_bench.engine.fast.models.family import Drafter, Target
from dflash_bench.engine.fast.running.prefill import Prefiller
from dflash_bench.engine.fast.scheduling.scheduler import GRAPHED_ROWS, MIXED_ROWS, StepPlan
from dflash_bench.engine.fast.running.device_state import GraphCache, SlotState
from dflash_bench.engine.fast.running.steps import StepBodies
from dflash_bench.engine.fast.running.timer import StepTimer, mark, seconds


__all__ = ["Collected", "FastRunner", "InFlight"]


@dataclass
class InFlight:
    """A step launched and not yet collected: its plan, and where its results land."""

    plan: StepPlan
    host: torch.Tensor  # the pinned host copy of `out` its results land in
    done: torch.cuda.Event | None  # recorded after that copy (GPU)
    span: tuple | None  # (start, end) marks of its time, when timed
    first: torch.Tensor  # the pinned host copy of the rides' first tokens


@dataclass(frozen=True)
class Collected:
    """A collected step's results: per row of its plan, the tokens it committed (accepted drafts, then the bonus)
    and the drafts accepted; the first tokens of the prompts that rode in it; its time, when measured."""

    plan: StepPlan
    tokens: dict[int, list[int]]
    accepted: dict[int, int]
    firsts: list[int]
    seconds: float | None


class FastRunner:
    """Greedy AR (no drafter) or DFlash (with a drafter) decoding on the fast path."""

    def __init__(self, target: Target, drafter: Drafter | None, config: StepConfig, *, graphs: bool | None = None,
                 keep_logits: bool = False, overlap: bool = True):
        """`config`: how it steps (serve's options); `graphs` (default: on CUDA) captures each step shape once;
        `keep_logits`: the target's logits of each step per slot (for logprobs); `overlap`: the drafter's context
        beside the target's last layers, on a second stream."""
        self.t, self.d, self.config = target, drafter, config
        self.B = drafter.B if drafter else 1
        self.S, self.max_len = target.slots, target.max_len
        dev = self.dev = target.device
        self.graphs_on = dev.type == "cuda" if graphs is None else graphs
        k = max(*GRAPHED_ROWS, *MIXED_ROWS)  # the most prompts one graph stages
        self.state = SlotState(slots=self.S, block=self.B, max_len=self.max_len, vocab=target.vocab_size,
                               dtype=target.dtype, device=dev, keep_logits=keep_logits, prompts=k)
        self.bodies = StepBodies(target, drafter, self.state, overlap=overlap,
                                 synthetic=config.synthetic(self.B), seed=config.seed,
                                 cut_draft=config.cut_draft)
        self.graphs = GraphCache(self.graphs_on, self.bodies.committed,
                                 [target.index] + ([drafter.index] if drafter is not None else []))
        self.prefills = Prefiller(target, drafter, self.state, self.graphs, prompts=k)
        pin = dev.type == "cuda"
        # two host copies of `out`: a step's tokens are read while the next one runs
        self.host = [torch.zeros(self.S, self.B + 1, dtype=torch.long, pin_memory=pin) for _ in range(2)]
        # a launch may carry up to max(MIXED_ROWS) prompts (AR, --prefill mixed: `Target.forward_mixed`), their inputs
        # staged in the host buffer of that launch (made at the first such step), their first tokens copied back
        # beside the step's tokens
        self.ride_host: list[torch.Tensor] = []
        self.first_host = [torch.zeros(max(MIXED_ROWS), dtype=torch.long, pin_memory=pin) for _ in self.host]
        self.inflight: deque[InFlight] = deque()  # per step launched, oldest first
        self.launched = 0
        self._stepped: tuple = ()
        self.timer: StepTimer | None = None  # a benchmark's, attached (`StepTimer.attach`)
        # tensor parallel, on rank 0: the other ranks, told each call that changes the device state (`ranks.py`)
        self.followers: Any = None

    @property
    def logits(self) -> torch.Tensor | None:
        """Target logits of the last step per slot (for logprobs); a prefill's last logits at position 0."""
        return self.state.logits

    # ---- requests -------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, slots: list[int], prompts: list[list[int]], P: int | None,
                starts: list[int] | None = None) -> list[int]:
        """One prefill group as the scheduler made it: padded to P tokens, the graph of its rows (its bucket, a
        multiple of PREFILL_BUCKET: eagerly, a prefill's ~400 kernel launches cost the host 3-4x the GPU's time),
        or with P None one eager forward. The padding's K/V lands past each prompt, where no query looks before a
        step rewrites it. `starts` (eager only): each prompt goes at that position of its slot, whose positions
        below it hold what the prompt follows (a prefix cache's resume). The slots' device state is set; returns
        their first tokens."""
        with self._replayed("prefill", slots, prompts, P, starts):
            tok = self.prefills.graphed(slots, prompts, P) if P is not None else \
                self.prefills.rows(slots, prompts, starts)
            for i, (s, p, t) in enumerate(zip(slots, prompts, tok)):
                self.prefills.admit(s, (starts[i] if starts else 0) + len(p), t)
            return tok.tolist()

    def _replayed(self, name: str, *args: Any) -> ContextManager[Any]:
        """Tensor parallel, on rank 0: the other ranks run the same call (`ranks.Followers.send`), and this rank's
        part of it is watched (a call that makes no progress ends the server, naming the rank and the step)."""
        if self.followers is None:
            return contextlib.nullcontext()
        if name != "collect":  # a collect is replayed once this rank has read the step (`collect`)
            self.followers.send(name, *args)
        return self.followers.call(name)

    def release(self, slot: int, keep: bool = False) -> None:
        """Free the slot; as padding it then writes a block at its start, never past the cache: at positions
        0..B-1 of its row, or with `keep` past what its request committed, which the row keeps for a prompt that
        resumes it (`scheduling/prefix.py`)."""
        if self.followers is not None:
            self.followers.send("release", slot, keep)
        self.state.active[slot] = 0
        if not keep:
            self.state.start[slot] = 0

    @torch.inference_mode()
    def capture(self, keys: list[tuple], watch: Any = None) -> int:
        """Capture the graph of every step shape in `keys` now (the scheduler's `graph_keys`), so serving never
        stops to capture. Only before any request is added: every row is padding, so the bodies compute into free
        slots (their positions 0..B-1, rewritten by the next prefill) and commit nothing. Returns the number of
        graphs. `watch`: a tensor-parallel rank's `ranks.Watch`, each graph one call."""
        if not self.graphs_on:
            return 0
        self.state.active.zero_()
        self._stepped = ()
        b = self.bodies
        for key in keys:
            kind = key[0]
            with watch.call("capture", f"capturing the graph of {key}", start=True) if watch else contextlib.nullcontext():
                if kind == "prefill":
                    self.prefills.graph(*key[1:])
                elif kind == "mixed":
                    self._ride_buffers()
                    self.graphs.run(key, lambda: b.mixed(*key[1:]))
                elif kind == "ar":
                    self.graphs.run(key, lambda: b.ar(*key[1:]))
                elif kind == "draft":
                    self.graphs.run(key, lambda: b.draft(*key[1:]))
                else:
                    self.graphs.run(key, lambda: b.verify(*key[1:]))
                torch.cuda.synchronize()
        return len(self.graphs)

    def _ride_buffers(self) -> list[torch.Tensor]:
        if not self.ride_host:
            k = max(MIXED_ROWS)
            self.ride_host = [torch.zeros(2 * k + k * self.max_len, dtype=torch.long,
                                          pin_memory=self.dev.type == "cuda") for _ in self.host]
        return self.ride_host

    # ---- one step for every running slot ------------------------------------------------------------
    @torch.inference_mode()
    def run(self, plan: StepPlan) -> None:
        """Execute `plan` behind the steps in flight, without waiting for them: its graphs, then the copy of its
        results to the host; `collect` reads them."""
        with self._replayed("run", plan):
            self._run(plan)

    def _run(self, plan: StepPlan) -> None:
        bs, L, w = plan.bs, plan.L, plan.width
        if tuple(plan.slots) != self._stepped:  # rows outside the plan (padding, or paused) keep their state
            mask = torch.zeros(self.S, dtype=torch.long, pin_memory=self.dev.type == "cuda")
            mask[plan.slots] = 1
            self.state.active.copy_(mask, non_blocking=True)  # in stream order: steps in flight keep their mask
            self._stepped = tuple(plan.slots)
        timer = self.timer
        timed = timer is not None or plan.timed  # the width chooser weighs widths by measured step times
        graphs, b = len(self.graphs), self.bodies
        t0 = mark(self.dev) if timed else None
        t1 = t0
        if plan.kind == "mixed":
            # this launch's host buffer: free, for the launch before last was collected
            self.prefills.stage_in(self._ride_buffers()[self.launched % len(self.host)], [r.slot for r in plan.rides],
                                   [r.prompt for r in plan.rides], plan.P)
            P, k = plan.P, len(plan.rides)
            self.graphs.run(("mixed", bs, P, k), lambda: b.mixed(bs, P, k))
        elif plan.kind == "ar":
            self.graphs.run(("ar", bs, L), lambda: b.ar(bs, L))
        elif plan.kind == "verify":  # the anchor alone: no draft
            self.graphs.run(("verify", bs, L, w), lambda: b.verify(bs, L, w))
        else:
            self.graphs.run(("draft", bs, L, w), lambda: b.draft(bs, L, w))
            t1 = mark(self.dev) if timer is not None else None
            self.graphs.run(("verify", bs, L, w), lambda: b.verify(bs, L, w))
        t2 = mark(self.dev) if timed else None
        if timer is not None:
            timer.launched(t0, t1, t2)
        host, first = self.host[self.launched % len(self.host)], self.first_host[self.launched % len(self.host)]
        self.launched += 1
        done = None
        if plan.rides:
            first[:len(plan.rides)].copy_(self.state.pre_tok[:len(plan.rides)], non_blocking=True)
        if self.dev.type == "cuda":
            host[:bs].copy_(self.state.out[:bs], non_blocking=True)
            done = torch.cuda.Event(enable_timing=timed)
            done.record()
        else:
            host[:bs].copy_(self.state.out[:bs])
        # a step that captured a graph ran its body twice, with the host capturing in between: not its time
        span = (t0, done if self.dev.type == "cuda" else t2) if timed and len(self.graphs) == graphs else None
        self.inflight.append(InFlight(plan, host, done, span, first))

    def retire(self) -> None:
        """A tensor-parallel follower's collect: wait for the oldest step's copy, read nothing (rank 0 reads)."""
        step = self.inflight.popleft()
        if step.done is not None:
            step.done.synchronize()

    def collect(self) -> Collected:
        """The results of the oldest step in flight, for every row of its plan (`EngineCore.collect` keeps those
        whose slot still holds the request stepped)."""
        step = self.inflight.popleft()
        with self._replayed("collect"):
            if step.done is not None:
                step.done.synchronize()
        plan, w = step.plan, step.plan.width
        rows = step.host[:plan.bs].tolist()
        if self.followers is not None:
            self.followers.send("collect")
        tokens, accepted = {}, {}
        for s in plan.slots:
            a = rows[s][0] if self.B > 1 else 0
            tokens[s] = rows[s][1:1 + a] + [rows[s][w]]  # accepted drafts, then the bonus (column w)
            accepted[s] = a
        # a collected step's time: between its CUDA events on a GPU (synchronised above), else the span of its
        # `run` (a CPU step runs there)
        secs = seconds(self.dev, *step.span) if step.span is not None else None
        return Collected(plan, tokens, accepted, step.first[:len(plan.rides)].tolist(), secs)
