"""Fixed-shape steps on device-resident state, captured as CUDA graphs per (batch bucket, KV-length bucket).

`FastRunner` executes what its `Scheduler` plans (scheduler.py: a step's rows, buckets, verify width, rides,
prefill groups, step-ahead and the cache bound are decided there). Its parts, by composition: the slots'
device state and the graph cache (slots.py), the step bodies (steps.py), the prefills (prefill.py). A step
runs its graphs (steps.py: draft, then verify; AR; mixed), then one device-to-host copy into pinned memory.
Nothing else runs between graphs, so the GPU idles only while the host reads the result and launches the
next step; two host copies let step k+1 run while step k's tokens are read.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from dflash_bench.engine.fast.family import Drafter, Target
from dflash_bench.engine.fast.prefill import Prefiller
from dflash_bench.engine.fast.scheduler import GRAPHED_ROWS, MIXED_ROWS, Scheduler, StepPlan, buckets
from dflash_bench.engine.fast.slots import GraphCache, SlotState
from dflash_bench.engine.fast.steps import StepBodies
from dflash_bench.engine.fast.timer import StepTimer, mark, seconds


__all__ = ["FastRunner", "InFlight", "buckets"]


@dataclass
class InFlight:
    """A step launched and not yet collected: its plan, and where its results land."""

    plan: StepPlan
    host: torch.Tensor  # the pinned host copy of `out` its results land in
    done: torch.cuda.Event | None  # recorded after that copy (GPU)
    span: tuple | None  # (start, end) marks of its time, when timed
    first: torch.Tensor  # the pinned host copy of the rides' first tokens


class FastRunner:
    """Greedy AR (no drafter) or DFlash (with a drafter) decoding on the fast path."""

    def __init__(self, target: Target, drafter: Drafter | None = None, *, graphs: bool | None = None,
                 kv_block: int = 256, synthetic_tau: float | None = None, seed: int = 0, keep_logits: bool = False,
                 overlap: bool = True, adaptive: bool = False, width: int | None = None, cut_draft: bool = False,
                 mixed: bool = False, step_ahead: bool = True):
        self.t, self.d = target, drafter
        self.B = drafter.B if drafter else 1
        self.S, self.max_len = target.slots, target.max_len
        dev = self.dev = target.device
        self.graphs_on = dev.type == "cuda" if graphs is None else graphs
        self.kv_block = kv_block
        self.sched = Scheduler(slots=self.S, block=self.B, max_len=self.max_len, kv_block=kv_block,
                               adaptive=adaptive, width=width, mixed=mixed, graphs=self.graphs_on,
                               step_ahead=step_ahead)
        self.chooser = self.sched.chooser  # the scheduler's width chooser (benchmarks read what it chose)
        k = max(*GRAPHED_ROWS, *MIXED_ROWS)  # the most prompts one graph stages
        self.state = SlotState(slots=self.S, block=self.B, max_len=self.max_len, vocab=target.vocab_size,
                               dtype=target.dtype, device=dev, keep_logits=keep_logits, prompts=k)
        self.bodies = StepBodies(target, drafter, self.state, overlap=overlap, synthetic_tau=synthetic_tau, seed=seed,
                                 cut_draft=cut_draft)
        self.graphs = GraphCache(self.graphs_on, self.bodies.committed)
        self.prefills = Prefiller(target, drafter, self.state, self.graphs, prompts=k)
        pin = dev.type == "cuda"
        # two host copies of `out`: a step's tokens are read while the next one runs
        self.host = [torch.zeros(self.S, self.B + 1, dtype=torch.long, pin_memory=pin) for _ in range(2)]
        # AR with `mixed`: a launch may carry up to max(MIXED_ROWS) prompts (`Target.forward_mixed`), their inputs staged in the
        # host buffer of that launch, their first tokens copied back beside the step's tokens
        k = max(MIXED_ROWS)
        self.ride_host = [torch.zeros(2 * k + k * self.max_len, dtype=torch.long, pin_memory=pin)
                          for _ in self.host] if self.sched.mixed else []
        self.first_host = [torch.zeros(k, dtype=torch.long, pin_memory=pin) for _ in self.host]
        self.inflight: deque[InFlight] = deque()  # per step launched, oldest first
        self.launched = 0
        self._stepped: tuple = ()
        self.timer: StepTimer | None = None  # a benchmark's, attached (`StepTimer.attach`)
        self.width = self.sched.fixed  # the width of the step collected last
        # tensor parallel, on rank 0: the other ranks, told each call that changes the device state (`ranks.py`)
        self.followers: Any = None

    @property
    def logits(self) -> torch.Tensor | None:
        """Target logits of the last step per slot (for logprobs); a prefill's last logits at position 0."""
        return self.state.logits

    # ---- requests -------------------------------------------------------------------------------
    @torch.inference_mode()
    def add(self, slot: int, prompt: list[int]) -> int:
        """Prefill `prompt` into `slot`; returns the first generated token.

        The prompt is padded to its length bucket (a multiple of PREFILL_BUCKET) and run by that bucket's
        graph, whatever the slot: eagerly, a prefill's ~400 kernel launches cost the host 3-4x the GPU's
        time. The padding's K/V lands past the prompt, where no query looks before a step rewrites it.
        """
        return self.add_many([slot], [prompt])[0]

    @torch.inference_mode()
    def add_many(self, slots: list[int], prompts: list[list[int]]) -> list[int]:
        """Prefill `prompts[i]` into `slots[i]`, in the groups the scheduler makes (`Scheduler.prefill_groups`);
        returns each one's first generated token, in input order. Nothing is run unless every prompt fits."""
        toks: dict[int, int] = {}
        for g, graphed in self.sched.prefill_groups([len(p) for p in prompts]):
            toks.update(zip(g, self.prefill([slots[i] for i in g], [prompts[i] for i in g], graphed=graphed)))
        return [toks[i] for i in range(len(prompts))]

    @torch.inference_mode()
    def prefill(self, slots: list[int], prompts: list[list[int]], *, graphed: bool) -> list[int]:
        """One prefill group as the scheduler made it: the graph of its k rows, padded to its longest prompt's
        bucket, or one eager forward; the slots are admitted. Returns their first tokens."""
        if self.followers is not None:
            self.followers.send("prefill", slots, prompts, graphed=graphed)
        tok = (self.prefills.graphed(slots, prompts, self.sched.padded(max(map(len, prompts)))) if graphed
               else self.prefills.rows(slots, prompts))
        for s, p, t in zip(slots, prompts, tok):
            self.prefills.admit(s, len(p), t)
            self.sched.prefilled(s, len(p))
        return tok.tolist()

    def release(self, slot: int) -> None:
        """Free the slot; as padding it then writes at positions 0..B-1 of its own row, never past the cache."""
        if self.followers is not None:
            self.followers.send("release", slot)
        self.state.active[slot] = 0
        self.state.start[slot] = 0
        self.sched.release(slot)

    @torch.inference_mode()
    def capture_all(self) -> int:
        """Capture the graphs of every (batch bucket, KV-length bucket) now, so serving never stops to capture.

        Only before any request is added: every row is padding, so the bodies compute into free slots (their
        positions 0..B-1, rewritten by the next prefill) and commit nothing. Returns the number of graphs.
        """
        if not self.graphs_on:
            return 0
        if self.sched.lengths:
            raise RuntimeError("capture_all runs before any request is added")
        self.state.active.zero_()
        self._stepped = ()
        for P in self.sched.prefill_buckets():
            self.prefills.graph(P)
        for P, k in self.sched.grouped_buckets():
            self.prefills.graph(P, k)
        b = self.bodies
        for bs in self.sched.sizes if self.sched.mixed else []:
            for P, k in self.sched.mixed_buckets():
                self.graphs.run(("mixed", bs, P, k), lambda: b.mixed(bs, P, k))
        for bs in self.sched.sizes:
            for L in self.sched.kv_buckets():
                if self.B == 1:
                    self.graphs.run(("ar", bs, L), lambda: b.ar(bs, L))
                    continue
                for w in self.sched.candidates(bs):
                    self.graphs.run(("draft", bs, L, w), lambda: b.draft(bs, L, w))
                    self.graphs.run(("verify", bs, L, w), lambda: b.verify(bs, L, w))
        torch.cuda.synchronize()
        return len(self.graphs)

    # ---- one step for every running slot ------------------------------------------------------------
    @torch.inference_mode()
    def step(self, slots: list[int]) -> dict[int, list[int]]:
        """Advance every slot in `slots` by one verify (DFlash) or one token (AR); returns the new tokens."""
        if not self.launch(slots):
            raise ValueError(f"a sequence would pass the cache length {self.max_len}")
        return self.collect()

    @torch.inference_mode()
    def launch(self, slots: list[int], rides: Sequence[tuple[int, list[int]]] = ()) -> bool:
        """Enqueue the step the scheduler plans for `slots` (carrying `rides`, AR with `mixed`), behind the steps
        in flight; False, enqueuing nothing, when it plans none (the cache bound, or two steps in flight)."""
        plan = self.sched.plan(slots, rides)
        if plan is None:
            return False
        self.run(plan)
        return True

    @torch.inference_mode()
    def run(self, plan: StepPlan) -> None:
        """Execute `plan` behind the steps in flight, without waiting for them: its graphs, then the copy of its
        results to the host; `collect` reads them."""
        if self.followers is not None:
            self.followers.send("run", plan)
        bs, L, w = plan.bs, plan.L, plan.width
        if tuple(plan.slots) != self._stepped:  # rows outside the plan (padding, or paused) keep their state
            mask = torch.zeros(self.S, dtype=torch.long, pin_memory=self.dev.type == "cuda")
            mask[plan.slots] = 1
            self.state.active.copy_(mask, non_blocking=True)  # in stream order: steps in flight keep their mask
            self._stepped = tuple(plan.slots)
        timer = self.timer
        timed = timer is not None or self.chooser is not None  # the chooser weighs widths by measured step times
        graphs, b = len(self.graphs), self.bodies
        t0 = mark(self.dev) if timed else None
        t1 = t0
        if plan.kind == "mixed":
            # this launch's host buffer: free, for the launch before last was collected
            self.prefills.stage_in(self.ride_host[self.launched % len(self.host)], [r.slot for r in plan.rides],
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

    def reach(self) -> int:
        """The most tokens the steps in flight may still add to one row (each: its verify width)."""
        return self.sched.reach()

    def collect(self) -> dict[int, list[int]]:
        """The new tokens of the oldest step in flight, per slot (slots released, or re-admitted, since are left
        out); the prompts that rode in it are admitted, their first tokens in `sched.took`."""
        step = self.inflight.popleft()
        if step.done is not None:
            step.done.synchronize()
        plan, w = step.plan, step.plan.width
        rows = step.host[:plan.bs].tolist()
        if self.followers is not None:
            self.followers.send("collect")
        out, accepted = {}, {}
        for s in self.sched.current(plan):
            a = rows[s][0] if self.B > 1 else 0
            out[s] = rows[s][1:1 + a] + [rows[s][w]]  # accepted drafts, then the bonus (column w)
            accepted[s] = a
        # a collected step's time: between its CUDA events on a GPU (synchronised above), else the span of its
        # `run` (a CPU step runs there)
        secs = seconds(self.dev, *step.span) if step.span is not None else None
        self.sched.collected(plan, accepted, step.first[:len(plan.rides)].tolist(), secs)
        if self.timer is not None:
            self.timer.collected(plan, len(out), sum(accepted.values()))
        self.width = w
        return out
