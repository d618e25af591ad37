"""Fixed-shape steps on device-resident state, captured as CUDA graphs per (batch bucket, KV-length bucket).

State lives on the device, one entry per slot: `start` (anchor position = committed KV length) and the
token row `[anchor, drafts]` (the last committed token, then the block's drafts). A DFlash step is: draft
graph (the block from the anchor, over the drafter's context K/V), verify graph (target over the token
row; from its tapped layers the drafter's context K/V of the block's positions, on a second stream beside
the target's last layers; greedy acceptance and the commit: advance `start`, move `anchor`, pack
`[accepted, drafts, bonus]` into `out`), then one device-to-host copy into pinned memory. Nothing else
runs between graphs, so the GPU idles only while the host reads the result and launches the next step.
Capturing runs a graph's body once beforehand (warm-up); the state it commits is put back, so the first
step of a new shape advances exactly once. Rows of a bucket past the last running slot are padding: their
results are discarded and `active` keeps their state still.

Synthetic acceptance (benchmarks only): the verifier accepts a drawn number of drafts instead of comparing
them with the target, each position with probability a, leading run kept, so that E[tokens per step] = tau
over the whole block. That is a geometric curve by position (P(first i accepted) = a^i): a step that verifies
only its first w - 1 drafts (adaptive width, width.py) draws from the same curve, 1 + sum_{k<w} a^k tokens.
The uniforms come from a seeded table on the device, read at a per-row step counter the commit advances.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch

from dflash_bench.engine.fast.accept import SYNTHETIC_STEPS, commit, synthetic_rate
from dflash_bench.engine.fast.draft import FastDrafter
from dflash_bench.engine.fast.mixed import MIXED_ROWS, MixedSteps
from dflash_bench.engine.fast.model import FastTarget, decode_step, matmul, offsets
from dflash_bench.engine.fast.prefill import GRAPHED_ROWS, PREFILL_BUCKET, Prefills
from dflash_bench.engine.fast.width import CPU_DECAY, CPU_WIDTHS, DECAY, WIDTHS, WidthChooser


NARROW_ROWS = 8  # GPU: batch buckets from this size may verify less than the whole block (adaptive width); a
# smaller batch's verify is memory-bound (H100, Qwen3-8B shape: 6.20 ms at 1 x 16 tokens, 5.97 for one token)


@dataclass
class InFlight:
    """A step launched and not yet collected: what it stepped and where its results land."""

    rows: list[tuple[int, int]]  # (slot, admission number) of each row stepped
    bs: int  # batch bucket
    host: torch.Tensor  # the pinned host copy of `out` its results land in
    done: torch.cuda.Event | None  # recorded after that copy (GPU)
    width: int  # tokens verified per row (AR: 1)
    span: tuple | None  # (start, end) marks of its time, when timed
    riders: list[tuple[int, int, int]]  # (slot, admission number, prompt length) of the prompts that rode in it
    first: torch.Tensor  # the pinned host copy of the riders' first tokens


def buckets(max_slots: int) -> list[int]:
    out, b = [], 1
    while b < max_slots:
        out.append(b)
        b *= 2
    return out + [max_slots]


class FastRunner(Prefills, MixedSteps):
    """Greedy AR (no drafter) or DFlash (with a drafter) decoding on the fast path."""

    def __init__(self, target: FastTarget, drafter: FastDrafter | None = None, *, graphs: bool | None = None,
                 kv_block: int = 256, synthetic_tau: float | None = None, seed: int = 0, keep_logits: bool = False,
                 overlap: bool = True, adaptive: bool = False, width: int | None = None, cut_draft: bool = False,
                 mixed: bool = False):
        self.t, self.d = target, drafter
        self.B = drafter.B if drafter else 1
        self.S, self.max_len = target.cache.slots, target.max_len
        dev = self.dev = target.device
        self.graphs_on = dev.type == "cuda" if graphs is None else graphs
        self.kv_block, self.sizes = kv_block, buckets(self.S)
        long = dict(dtype=torch.long, device=dev)
        self.start = torch.zeros(self.S, **long)
        self.active = torch.zeros(self.S, **long)
        # per slot the next verify's tokens: the anchor (last committed token), then the drafts (AR: none)
        self.tokens = torch.zeros(self.S, self.B, **long)
        self.anchor = self.tokens[:, 0]
        self.drafts = self.tokens[:, 1:] if self.B > 1 else torch.zeros(self.S, 1, **long)
        self.pos = torch.zeros(self.S, self.B, **long)  # the step's positions: set by the draft, read by the verify
        self.out = torch.zeros(self.S, self.B + 1, **long)  # per row: accepted, drafts..., bonus (AR: the token)
        # two host copies of `out`: a step's tokens are read while the next one runs
        self.host = [torch.zeros(self.S, self.B + 1, dtype=torch.long, pin_memory=dev.type == "cuda") for _ in range(2)]
        self.inflight: deque[InFlight] = deque()  # per step launched, oldest first
        self.launched = 0
        # target logits of the last step per slot (for logprobs); the prefill's last logits go to position 0
        self.logits = torch.zeros(self.S, self.B, target.vocab_size, dtype=target.dtype, device=dev) if keep_logits else None
        self.taps = tuple(drafter.c.target_layer_ids) if drafter else ()
        # the drafter's context K/V is computed on this stream while the target's last layers run
        self.side = torch.cuda.Stream(dev) if drafter and dev.type == "cuda" and overlap else None
        self.synthetic_tau = synthetic_tau
        self.rate = synthetic_rate(synthetic_tau, self.B) if synthetic_tau is not None else None
        if self.rate is not None:
            gen = torch.Generator().manual_seed(seed)
            self.uniforms = torch.rand(SYNTHETIC_STEPS, self.S, self.B - 1, generator=gen).to(dev)
            self.synth_step = torch.zeros(self.S, **long)  # per row: its commit advances it, no extra launch
        # a prefill's inputs (slot, index of the last prompt token, ids padded to the bucket), copied in one go
        k = max(*GRAPHED_ROWS, *MIXED_ROWS)  # up to k prompts: k slots, k last indices, k padded rows of ids
        self.pre_host = torch.zeros(2 * k + k * self.max_len, dtype=torch.long, pin_memory=dev.type == "cuda")
        self.pre_in = torch.zeros(2 * k + k * self.max_len, **long)
        self.pre_start = torch.zeros(k, **long)
        self.pre_tok = torch.zeros(k, **long)
        self.host_start: dict[int, int] = {}
        # AR with `mixed`: a launch may carry up to max(MIXED_ROWS) prompts (mixed.py), their inputs staged in the
        # host buffer of that launch, their first tokens copied back beside the step's tokens
        self.mixed = mixed and drafter is None
        k = max(MIXED_ROWS)
        self.ride_host = [torch.zeros(2 * k + k * self.max_len, dtype=torch.long, pin_memory=dev.type == "cuda")
                          for _ in self.host] if self.mixed else []
        self.first_host = [torch.zeros(k, dtype=torch.long, pin_memory=dev.type == "cuda") for _ in self.host]
        self.riding: dict[int, int] = {}  # slot -> its admission number, while its prompt's step is in flight
        self.took: dict[int, int] = {}  # the slots a collected step prefilled -> their first tokens
        self.rode = 0  # prompts prefilled by a step's forward
        self.admitted = [0] * self.S  # requests admitted per slot: a step in flight from before is not theirs
        self._stepped: tuple = ()
        self.graphs: dict[tuple, object] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.graphs_on else None
        self.steps = self.accepted = self.row_steps = 0  # steps; accepted drafts and verifies summed over rows
        self.drafted = self.drafting_rows = 0  # drafts verified, and verifies that checked any, summed over rows
        self.timings: list[tuple] = []  # (draft start, draft end / verify start, verify end) when timing
        self.timing = False
        # adaptive: each step verifies the anchor and its first w - 1 drafts, w chosen by load (width.py);
        # else always `width` (default: the whole block)
        self.chooser = (WidthChooser(self.B, WIDTHS if self.graphs_on else CPU_WIDTHS,
                                     narrow_from=NARROW_ROWS if self.graphs_on else 1, explore_block=self.graphs_on,
                                     decay=DECAY if self.graphs_on else CPU_DECAY)
                        if drafter and adaptive else None)
        self.fixed = min(width or self.B, self.B)
        self.widths = self.chooser.widths if self.chooser else [self.fixed]
        self.width = self.fixed  # the width of the step collected last
        # draft only the w positions a step verifies (a block cut to w), not the whole block: for drafters
        # trained on blocks of random length, which draft a cut block as well
        self.cut_draft = cut_draft

    # ---- requests -------------------------------------------------------------------------------
    def release(self, slot: int) -> None:
        """Free the slot; as padding it then writes at positions 0..B-1 of its own row, never past the cache."""
        self.active[slot] = 0
        self.start[slot] = 0
        self.host_start.pop(slot, None)
        self.riding.pop(slot, None)

    @torch.inference_mode()
    def capture_all(self) -> int:
        """Capture the graphs of every (batch bucket, KV-length bucket) now, so serving never stops to capture.

        Only before any request is added: every row is padding, so the bodies compute into free slots (their
        positions 0..B-1, rewritten by the next prefill) and commit nothing. Returns the number of graphs.
        """
        if not self.graphs_on:
            return 0
        if self.host_start:
            raise RuntimeError("capture_all runs before any request is added")
        self.active.zero_()
        self._stepped = ()
        lengths = sorted({min(self.max_len, L) for L in range(self.kv_block, self.max_len + self.kv_block, self.kv_block)})
        for P in sorted({min(P, self.max_len) for P in range(PREFILL_BUCKET, self.max_len + PREFILL_BUCKET,
                                                             PREFILL_BUCKET)}):
            self.prefill_graph(P)
        for P, k in self.grouped_buckets():
            self.prefill_graph(P, k)
        for bs in self.sizes if self.mixed else []:
            for P, k in self.mixed_buckets():
                self._run(("mixed", bs, P, k), lambda: self._mixed(bs, P, k))
        for bs in self.sizes:
            for L in lengths:
                if self.B == 1:
                    self._run(("ar", bs, L), lambda: self._ar(bs, L))
                    continue
                for w in self.chooser.candidates(bs) if self.chooser else self.widths:
                    self._run(("draft", bs, L, w), lambda: self._draft(bs, L, w))
                    self._run(("verify", bs, L, w), lambda: self._verify(bs, L, w))
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
    def launch(self, slots: list[int], rides: list[tuple[int, list[int]]] = ()) -> bool:
        """Enqueue one step for `slots` behind the steps in flight, without waiting for them.

        So the GPU never idles while the host reads a step's tokens: launch step k+1, then `collect` step k.
        The cache bound assumes every step in flight accepts a whole block. Returns False, enqueuing
        nothing, when that bound would pass the cache or two steps are already in flight: collect first.
        `rides`: (a free slot, a prompt) pairs that `can_ride` together, prefilled by the same forward (AR with
        `mixed`); their first tokens come with this step's `collect`, in `took`.
        """
        need = max(self.host_start[s] for s in slots) + self.B * (len(self.inflight) + 1)
        if need > self.max_len or len(self.inflight) >= len(self.host):
            return False
        bs = next(b for b in self.sizes if b > max(slots))
        if tuple(slots) != self._stepped:  # rows outside `slots` (padding, or paused) keep their state
            mask = torch.zeros(self.S, dtype=torch.long, pin_memory=self.dev.type == "cuda")
            mask[list(slots)] = 1
            self.active.copy_(mask, non_blocking=True)  # in stream order: steps in flight keep their mask
            self._stepped = tuple(slots)
        L = min(self.max_len, -(-need // self.kv_block) * self.kv_block)
        w = self.chooser.choose(bs, len(slots)) if self.chooser else self.fixed
        timed = self.timing or self.chooser is not None
        graphs = len(self.graphs)
        t0 = self._mark(timed)
        if rides:
            t1, (P, k) = t0, self._stage_rides(rides)
            self._run(("mixed", bs, P, k), lambda: self._mixed(bs, P, k))
        elif self.B == 1:
            self._run(("ar", bs, L), lambda: self._ar(bs, L))
            t1 = t0
        elif w == 1:  # the anchor alone: no draft
            t1 = t0
            self._run(("verify", bs, L, w), lambda: self._verify(bs, L, w))
        else:
            self._run(("draft", bs, L, w), lambda: self._draft(bs, L, w))
            t1 = self._mark(self.timing)
            self._run(("verify", bs, L, w), lambda: self._verify(bs, L, w))
        t2 = self._mark(timed)
        if self.timing:
            self.timings.append((t0, t1, t2))
        host, first = self.host[self.launched % len(self.host)], self.first_host[self.launched % len(self.host)]
        self.launched += 1
        done = None
        if rides:
            first[:len(rides)].copy_(self.pre_tok[:len(rides)], non_blocking=True)
        if self.dev.type == "cuda":
            host[:bs].copy_(self.out[:bs], non_blocking=True)
            done = torch.cuda.Event(enable_timing=timed)
            done.record()
        else:
            host[:bs].copy_(self.out[:bs])
        # a step that captured a graph ran its body twice, with the host capturing in between: not its time
        span = (t0, done if self.dev.type == "cuda" else t2) if timed and len(self.graphs) == graphs else None
        riders = [(s, self.admitted[s], len(p)) for s, p in rides]
        self.inflight.append(InFlight([(s, self.admitted[s]) for s in slots], bs, host, done, w, span, riders, first))
        return True

    def reach(self) -> int:
        """The most tokens the steps in flight may still add to one row (each: its verify width)."""
        return sum(step.width for step in self.inflight)

    def covers(self, slots: list[int]) -> bool:
        """Whether the newest step in flight steps every one of `slots`, for the requests they hold now."""
        return bool(self.inflight) and {(s, self.admitted[s]) for s in slots} <= set(self.inflight[-1].rows)

    def collect(self) -> dict[int, list[int]]:
        """The new tokens of the oldest step in flight, per slot (slots released, or re-admitted, since are left
        out); the prompts that rode in it are admitted, their first tokens in `took`."""
        step = self.inflight.popleft()
        if step.done is not None:
            step.done.synchronize()
        self._took(step.riders, step.first)
        bs, w, rows = step.bs, step.width, step.host[:step.bs].tolist()
        out, accepted = {}, []
        for s, admitted in step.rows:
            if s not in self.host_start or self.admitted[s] != admitted:
                continue
            a = rows[s][0] if self.B > 1 else 0
            out[s] = rows[s][1:1 + a] + [rows[s][w]]  # accepted drafts, then the bonus (column w)
            self.host_start[s] += a + 1
            accepted.append(a)
        self.accepted += sum(accepted)
        self.steps += 1
        self.row_steps += len(out)
        self.drafting_rows += len(out) if w > 1 else 0
        self.drafted += len(out) * (w - 1)
        self.width = w
        if self.chooser is not None:
            self.chooser.observe(bs, w, accepted, self._seconds(step.span))
        return out

    def reset_counts(self) -> None:
        """Zero the step and acceptance counters (`tau`, `drafted`, ...): a benchmark's measured run starts here."""
        self.steps = self.accepted = self.row_steps = self.drafted = self.drafting_rows = 0

    @property
    def tau(self) -> float:
        """Tokens per verify that checked drafts, bonus included (vLLM's 1 + accepted / drafts)."""
        return 1 + self.accepted / max(self.drafting_rows, 1)

    # ---- the graphed bodies: compute, then commit the step for the active rows --------------------------
    def _ar(self, bs: int, L: int) -> None:
        x, _ = self.t.forward(self.anchor[:bs, None], self.start[:bs], 0, L, head=False)
        self._commit(bs, self._greedy(x, bs, 1))

    def _draft(self, bs: int, L: int, w: int) -> None:
        """The drafter over the whole block, as z-lab's drafters are trained (a block cut to w tokens drafts worse
        with them), or with `cut_draft` over the w positions the verify checks (for drafters trained on cut
        blocks too, as the embedded one); the vocabulary only for the w - 1 drafts the verify checks."""
        n = w if self.cut_draft else self.B
        pos = torch.add(self.start[:bs, None], offsets(n, self.dev), out=self.pos[:bs, :n])
        x = self.d.hidden(self.anchor[:bs], self.start[:bs], 0, L, pos=pos, n=n)
        if w < n:
            x = x.view(bs, n - 1, -1)[:, : w - 1].reshape(bs * (w - 1), -1)
        drafts = self.drafts[:bs, : w - 1]
        if self.t.kernels is not None and self.d.plain_head:
            self.t.kernels.gemm.linear_argmax(x, self.d.lm_head, drafts)
        else:
            self._argmax(self.d.logits(x).view(bs, w - 1, -1), drafts)

    def _verify(self, bs: int, L: int, w: int) -> None:
        """The target over `[anchor, drafts]`, then the commit. The drafter's context K/V of every row's 16
        positions is written from the tapped features here: the accepted ones are the next draft's context,
        and the rest lie at or past the new start, where that draft's own block is written before it is read.
        Rows outside the step write only there too, as their target rows do."""
        ids = self.tokens[:bs, :w]
        if w == 1:  # no draft ran to set the positions
            self.pos[:bs, 0].copy_(self.start[:bs])
        main, keep = torch.cuda.current_stream() if self.side else None, []

        def context(feats, pos):
            if self.side is None:
                self.d.write_context(feats, pos, 0)
                return
            keep.append((feats, pos))  # alive until the join: main's allocator must not reuse it meanwhile
            self.side.wait_stream(main)
            with torch.cuda.stream(self.side):
                self.d.write_context(feats, pos, 0, lane=1)
        x, _ = self.t.forward(ids, self.start[:bs], 0, L, taps=self.taps, on_taps=context, head=False,
                              pos=self.pos[:bs, :w])
        post = self._greedy(x, bs, w)
        if self.side is not None:
            main.wait_stream(self.side)
        self._commit(bs, post, w)

    def _greedy(self, x: torch.Tensor, bs: int, n: int) -> torch.Tensor:
        """The target's greedy tokens `[bs, n]` from its final hidden rows; the logits are written (for
        logprobs) only when the runner keeps them."""
        if self.logits is None and self.t.kernels is not None:
            return self.t.kernels.gemm.linear_argmax(x, self.t.lm_head).view(bs, n)
        logits = matmul(self.t.kernels)(x, self.t.lm_head).view(bs, n, -1)
        if self.logits is not None:
            self.logits[:bs, :n] = logits
        return self._argmax(logits)

    def _argmax(self, logits: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Greedy tokens of `logits` `[bs, n, V]` -> `[bs, n]`, written into `out` when given."""
        if self.t.kernels is not None:
            return self.t.kernels.ops.argmax(logits, out)
        ids = logits.argmax(-1)
        return ids if out is None else out.copy_(ids)

    def _commit(self, bs: int, post: torch.Tensor, w: int = 1) -> None:
        synth = (self.uniforms, self.synth_step[:bs], self.rate) if self.rate is not None else None
        fn = commit if self.t.kernels is None else self.t.kernels.ops.commit  # the kernel: one launch, not a dozen
        fn(post, self.drafts[:bs], self.active[:bs], self.start[:bs], self.anchor[:bs], self.out[:bs, : w + 1], synth)

    def _run(self, key: tuple, body) -> None:
        def fn():
            with decode_step():  # the step's index tensors are made once, outside capture, and kept
                body()
        if not self.graphs_on:
            fn()
            return
        g = self.graphs.get(key)
        if g is None:
            state = [t.clone() for t in self._committed()]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()  # warm-up (lazy inits stay out of the graph); its commit is undone below
            torch.cuda.current_stream().wait_stream(side)
            for t, saved in zip(self._committed(), state):
                t.copy_(saved)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                fn()
            self.graphs[key] = g
        g.replay()

    def _committed(self) -> list[torch.Tensor]:
        """The state a graph body advances (everything else it writes is recomputed identically)."""
        return [self.start, self.anchor] + ([self.synth_step] if self.rate is not None else [])

    def _mark(self, on: bool):
        if not on:
            return None
        if self.dev.type == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def _seconds(self, span) -> float | None:
        """A collected step's time: between its CUDA events on a GPU (already synchronised), else the span of
        its `launch` (a CPU step runs there)."""
        if span is None:
            return None
        t0, t1 = span
        return t0.elapsed_time(t1) / 1e3 if self.dev.type == "cuda" else t1 - t0

    def step_times_ms(self) -> tuple[float, float]:
        """Median ms per draft and per verify (or AR) step over the timed steps."""
        if self.dev.type == "cuda":
            torch.cuda.synchronize()
            d = [a.elapsed_time(b) for a, b, _ in self.timings]
            v = [b.elapsed_time(c) for _, b, c in self.timings]
        else:
            d = [(b - a) * 1e3 for a, b, _ in self.timings]
            v = [(c - b) * 1e3 for _, b, c in self.timings]
        med = lambda xs: sorted(xs)[len(xs) // 2] if xs else 0.0  # noqa: E731
        return med(d), med(v)
