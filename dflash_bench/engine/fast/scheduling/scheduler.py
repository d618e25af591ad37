"""The fast path's scheduler: the one place that decides what a step runs (nano-vllm's `Scheduler` is the model).

It keeps the host's facts about the slots, and every decision made from them:
- which rows a step takes, its batch bucket, KV-length bucket and verify width (`width.WidthChooser` picks by
  load), and the cache bound: every step in flight may accept a whole block, so a step is planned only while
  that many positions still fit, and at most DEPTH steps are in flight;
- step-ahead (`schedule`): the next step is planned before this one's tokens are read, unless a row wants
  logprobs (read from the last step's logits) or could reach its max_tokens with the steps in flight;
- prefills: which prompts go together into one forward, graphed or eager (`prefill_groups`);
- riding (AR with `mixed`): which prompts wait to ride in the rows' next steps and which go together.

It decides and emits a `StepPlan`; `FastRunner` executes plans on the device, and `core.EngineCore`, which holds
both, tells it what a collected step committed (`collected`). Nothing here touches the device: the facts are the host's (committed lengths,
admission numbers, the plans in flight).

Prefill against decode (prefill first, as nano-vllm's scheduler; docs/ARCHITECTURE.md "Prefill against decode" has
the measurements). The serving loop admits before each step: it asks `admission` how many of the waiting prompts,
oldest first, go into the next batch (at most the free slots, k x longest <= PREFILL_TOKENS padded tokens), and
hands each batch to `EngineCore.add_many`, which `prefill_groups` splits by length under the same bound (so a
batch is in practice one forward): one prompt, or 2-3 with graphs, run a captured graph of its bucket; more run
one eager forward padded to the longest. On tensor-parallel ranks with graphs a batch takes at most 3 whole
prompts (`whole_rows`): one graph, where an eager forward's launches and collectives cost the host more than the
device's time. A batch's first tokens go out when its forwards are done. No decode
step is launched while prompts wait: the step already in flight (step-ahead) runs first, the prefills queue
behind it on the stream, and every decoding row waits for them. A prompt is prefilled whole (no chunking), or,
when a freed slot still holds its first tokens (a chat's next turn: `prefix.PrefixCache`, `match`), from where they
part, in eager forwards of their own (`resume_groups`). Only with `mixed` (AR, a family that `rides`, so not Gemma 4) do prompts
admitted while rows decode ride in the rows' next steps instead, up to max(MIXED_ROWS) a step and MIXED_TOKENS
padded tokens. vLLM v1 has no phases: each step has a token budget (--max-num-batched-tokens), spent on the
running requests first (a token each, or the anchor and drafts), then on waiting prompts oldest first, a prompt
longer than what is left cut into chunks over the next steps; prefill chunks and decode rows share one forward
over unpadded tokens, and its prefix cache skips prompt blocks seen before.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Protocol, Sequence

from dflash_bench.engine.bookkeeping import admission_cut, length_groups
from dflash_bench.engine.config import StepConfig
from dflash_bench.engine.fast.scheduling.prefix import PrefixCache
from dflash_bench.engine.fast.scheduling.width import CPU_DECAY, CPU_WIDTHS, DECAY, WIDTHS, WidthChooser

PREFILL_BUCKET = 64  # prompts are padded to a multiple of this: one prefill graph per multiple
# Prefilling k prompts (benchmarks/speed/prefill_speed.py, H100, Qwen3-8B shape), ms per prompt at k = 1, 2, 4, 8, 32,
# one eager forward for k > 1: 128 tokens 7.7, 11.8, 6.8, 3.4, 3.3; 320 tokens 11.8, 13.7, 8.7, 8.7, 8.3 (one graph
# each: 7.7 and 11.5 at any k). Past ~1-2k tokens a forward is compute-bound: a larger group only delays its first
# tokens. Under 4 prompts the eager forward's launches (~20 ms of host time) cost more than the graphs.
PREFILL_TOKENS = 2048  # padded prompt tokens per batched prefill forward at most
# GPU: groups of 2 or 3 prompts run one graph of k rows padded to the longest (its bucket): one forward reads the
# weights once and fills more of the GPU than k one-row graphs, without an eager forward's ~20 ms of launches
GRAPHED_ROWS = (2, 3)
# Tensor parallel: an eager forward's ~1,350 launches and 121 all-reduces cost the host ~85 ms at TP 2 whatever its size
# (Gemma 4 31B, two H200s: 8 and 11 prompts of 60-110 tokens take 91 and 84 ms, 18 take 95; the device is busy 38-53
# ms of the small ones; gemma4_31b_prefill_anatomy_h200_tp2.json), where one graph of 3 prompts replays in one
# launch: whole prompts are admitted at most max(GRAPHED_ROWS) a batch there, each batch one graph, its first tokens
# out before the next batch starts
MIXED_TOKENS = 1024  # padded prompt tokens a step may carry: one prompt up to this, k prompts up to this / k each
MIXED_ROWS = (1, 2, 3)  # prompts a step may carry (a group of more is prefilled in one forward of its own)
# prompts that may wait to ride (a burst past it is prefilled at once). On the 8B shape at 32 rows (H100, README)
# every prompt riding beat six at most: 3236.4 against 3170.2 tok/s
RIDE_QUEUE = 64
DEPTH = 2  # steps in flight at most: step k+1 is launched before step k's tokens are read
NARROW_ROWS = 8  # GPU: batch buckets from this size may verify less than the whole block (adaptive width); a
# smaller batch's verify is memory-bound (H100, Qwen3-8B shape: 6.20 ms at 1 x 16 tokens, 5.97 for one token)


class Chooser(Protocol):
    """The verify width by load (`width.WidthChooser`)."""

    widths: list[int]
    chosen: dict[int, int]  # width -> steps that used it

    def choose(self, bucket: int, rows: int) -> int: ...

    def candidates(self, bucket: int) -> list[int]: ...

    def observe(self, bucket: int, w: int, accepted: list[int], seconds: float | None) -> None: ...


def buckets(max_slots: int) -> list[int]:
    """The batch buckets: powers of two below `max_slots`, then `max_slots`."""
    out, b = [], 1
    while b < max_slots:
        out.append(b)
        b *= 2
    return out + [max_slots]


def fits(k: int, longest: int) -> bool:
    """Whether k prompts, the longest of `longest` tokens, go together into one prefill forward: k x longest
    within PREFILL_TOKENS (the admission cut and the prefill groups both ask this)."""
    return k * longest <= PREFILL_TOKENS


@dataclass(frozen=True)
class Ride:
    """A prompt prefilled by a step's forward (AR with `mixed`): its free slot, admission number and tokens."""

    slot: int
    admission: int
    prompt: list[int]


@dataclass(frozen=True)
class StepPlan:
    """One decode step as the scheduler decided it; `FastRunner.run` executes it."""

    kind: str  # "ar", "mixed" (AR carrying `rides`), "dflash" (draft, then verify), "verify" (the anchor alone)
    rows: tuple[tuple[int, int], ...]  # (slot, admission number) of each row stepped
    bs: int  # batch bucket: rows 0..bs-1 run, those not stepped as padding
    L: int  # KV-length bucket: keys in [0, L)
    width: int  # tokens verified per row (the anchor and width - 1 drafts; AR: 1)
    rides: tuple[Ride, ...] = ()
    P: int = 0  # the rides' prompt bucket
    timed: bool = False  # its time is measured (the width chooser learns from it)

    @property
    def slots(self) -> list[int]:
        return [s for s, _ in self.rows]


@dataclass(frozen=True)
class Row:
    """What step-ahead needs to know of a running request: its slot, whether it wants logprobs, and how many
    tokens it may still take before max_tokens."""

    slot: int
    logprobs: bool = False
    left: int = 1 << 30


class Scheduler:
    """Decides each step of one `EngineCore` (see the module) from the host's facts about its slots."""

    def __init__(self, config: StepConfig, *, slots: int, block: int, max_len: int, graphs: bool = False,
                 rides: bool = True, ride_queue: int = RIDE_QUEUE, parallel: bool = False,
                 resumable: Callable[[int, int], bool] = lambda p, hi: True):
        """`config.verify_width` auto (DFlash): each step verifies the anchor and its first w - 1 drafts, w chosen
        by load (width.py; a GPU's candidates and decay, or a CPU's, by `graphs`); else always that width (full:
        the whole block). `config.prefill` mixed (AR, a target whose family `rides`): prompts admitted while rows
        decode may ride in their steps. `config.prefix_caching`: freed slots keep their tokens for a prompt that
        starts with them, as far as the target's `resumable(p, hi)` allows (`prefix.PrefixCache`). `parallel`: the
        target is a tensor-parallel rank's shard: with graphs, whole prompts go max(GRAPHED_ROWS) a batch, each batch
        one graph (`whole_rows`)."""
        self.config = config
        self.S, self.B, self.max_len, self.kv_block = slots, block, max_len, config.kv_block
        self.sizes = buckets(slots)
        self.chooser: Chooser | None = (
            WidthChooser(block, WIDTHS if graphs else CPU_WIDTHS, narrow_from=NARROW_ROWS if graphs else 1,
                         explore_block=graphs, decay=DECAY if graphs else CPU_DECAY)
            if config.adaptive and block > 1 else None)
        chooser = self.chooser
        self.fixed = min(config.width or block, block)
        self.widths = chooser.widths if chooser else [self.fixed]
        self.mixed = config.prefill == "mixed" and rides and block == 1  # prompts ride in AR steps only
        self.graphs, self.step_ahead, self.ride_queue = graphs, config.step_ahead, ride_queue
        # whole prompts one prefill batch takes at most (None: as many as the tokens' bound lets)
        self.whole_rows = max(GRAPHED_ROWS) if graphs and parallel else None
        self.lengths: dict[int, int] = {}  # running slot -> committed tokens (as of the last step collected)
        self.admitted = [0] * slots  # requests admitted per slot: a step in flight from before is not theirs
        self.riding: dict[int, int] = {}  # slot -> its admission number, while its prompt's step is in flight
        self.queue: deque[tuple[int, list[int]]] = deque()  # (slot, prompt) waiting to ride, oldest first
        self.inflight: deque[StepPlan] = deque()  # planned and not yet collected, oldest first
        self.took: dict[int, int] = {}  # the slots the step collected last prefilled -> their first tokens
        self.rode = 0  # prompts prefilled by a step's forward
        self.prefix = PrefixCache(resumable) if config.prefix_caching else None

    # ---- the shapes a plan may take (every graph `EngineCore.capture_all` captures) -----------------------
    def kv_buckets(self) -> list[int]:
        """Every KV-length bucket a plan may take: multiples of `kv_block`, the cache length last."""
        return sorted({min(self.max_len, L) for L in range(self.kv_block, self.max_len + self.kv_block, self.kv_block)})

    def candidates(self, bucket: int) -> list[int]:
        """The verify widths a step of this batch bucket may take."""
        return self.chooser.candidates(bucket) if self.chooser else self.widths

    def graph_keys(self) -> list[tuple]:
        """Every step shape a plan or a prefill group may take, as the runner's graph keys (`FastRunner.capture`):
        one-prompt and grouped prefills, mixed steps (riding), then per batch bucket and KV bucket the AR step or
        each candidate width's draft and verify."""
        keys: list[tuple] = [("prefill", P) for P in self.prefill_buckets()]
        keys += [("prefill", P, k) for P, k in self.grouped_buckets()]
        keys += [("mixed", bs, P, k) for bs in (self.sizes if self.mixed else []) for P, k in self.mixed_buckets()]
        for bs in self.sizes:
            for L in self.kv_buckets():
                if self.B == 1:
                    keys.append(("ar", bs, L))
                    continue
                for w in self.candidates(bs):
                    keys += [("draft", bs, L, w), ("verify", bs, L, w)]
        return keys

    def chosen(self) -> dict[int, int]:
        """How many steps took each verify width so far, when the width is chosen by load (else empty)."""
        return dict(self.chooser.chosen) if self.chooser is not None else {}

    def prefill_buckets(self) -> list[int]:
        """Every prompt bucket of a one-prompt prefill graph."""
        return sorted({min(P, self.max_len) for P in range(PREFILL_BUCKET, self.max_len + PREFILL_BUCKET,
                                                           PREFILL_BUCKET)})

    # ---- prefills ---------------------------------------------------------------------------------
    def padded(self, n: int) -> int:
        """A prompt's length bucket: `n` up to a multiple of PREFILL_BUCKET (at most the cache)."""
        return min(-(-n // PREFILL_BUCKET) * PREFILL_BUCKET, self.max_len)

    def admission(self, prompts: Iterable[tuple[int, bool]], free: int) -> int:
        """How many of the waiting prompts (oldest first, each as (tokens left to prefill, whether it resumes a kept
        prefix)) the next prefill takes: at most `free`, while they fit one prefill forward (`fits`;
        bookkeeping.admission_cut), and at most `whole_rows` whole prompts (tensor parallel: one graph's)."""
        whole = 0

        def lengths() -> Iterator[int]:
            nonlocal whole
            for n, resumed in prompts:
                whole += not resumed
                yield n

        return admission_cut(lengths(), free, lambda k, longest: fits(k, longest) and self._rows_allow(whole))

    def _rows_allow(self, whole: int) -> bool:
        """Whether a prefill batch may hold `whole` whole prompts (`whole_rows`)."""
        return self.whole_rows is None or whole <= self.whole_rows

    def runs_graph(self, k: int) -> bool:
        """Whether a prefill group of k prompts runs a captured graph: one prompt, or with graphs a group of
        GRAPHED_ROWS (more run one eager forward)."""
        return k == 1 or (self.graphs and k in GRAPHED_ROWS)

    def prefill_groups(self, lengths: Sequence[int]) -> list[tuple[list[int], bool]]:
        """The prompts of these lengths in prefill groups: (indices, graphed). Prompts of similar length go
        together, in forwards of at most PREFILL_TOKENS padded tokens: the group reads the weights once, and the
        host launches one forward, not one per prompt. A single prompt, or (with graphs) a group of GRAPHED_ROWS,
        runs a captured graph (an eager forward's launches cost the host more than such a group's GPU time)."""
        for n in lengths:
            if not 0 < n <= self.max_len:
                raise IndexError(f"a prompt of {n} tokens does not fit the cache of {self.max_len} positions")
        groups = length_groups(lengths, lambda k, longest: fits(k, longest) and self._rows_allow(k))
        return [(g, self.runs_graph(len(g))) for g in groups]

    def grouped_buckets(self) -> list[tuple[int, int]]:
        """(P, k) of every graph of several rows a group may need: k in GRAPHED_ROWS, k * P within a group's
        tokens (a group of k is cut at PREFILL_TOKENS before padding, so its bucket may pass it by < k buckets)."""
        out = []
        for k in GRAPHED_ROWS:
            top = self.padded(-(-PREFILL_TOKENS // k))
            out += [(P, k) for P in range(PREFILL_BUCKET, min(top, self.max_len) + 1, PREFILL_BUCKET)]
        return out

    def resume_groups(self, starts: Sequence[int], suffixes: Sequence[int]) -> list[list[int]]:
        """Resumed prompts (`match`: each at `starts[i]`, `suffixes[i]` tokens left to prefill) in groups, each one
        eager forward (the graphs are captured from position 0): similar lengths together, within PREFILL_TOKENS
        padded tokens as `prefill_groups`, and each row's padding within its slot (its start plus the group's
        longest within the cache)."""
        groups: list[list[int]] = [[]]
        top = 0  # the group's latest start
        for i in sorted(range(len(suffixes)), key=lambda i: suffixes[i]):  # the newcomer is its group's longest
            g = groups[-1]
            if g and not (fits(len(g) + 1, suffixes[i]) and max(top, starts[i]) + suffixes[i] <= self.max_len):
                groups.append([])
                top = 0
            groups[-1].append(i)
            top = max(top, starts[i])
        return [g for g in groups if g]

    def prefilled(self, slot: int, n: int) -> None:
        """A prompt of `n` tokens was prefilled into `slot`: it runs from the next step planned."""
        self.lengths[slot] = n
        self.admitted[slot] += 1

    # ---- the prefix cache ---------------------------------------------------------------------------
    def match(self, prompt: Sequence[int], free: Sequence[int]) -> tuple[int, int] | None:
        """The free slot whose kept tokens `prompt` resumes, and how many it shares (None: prefill it whole)."""
        return self.prefix.match(prompt, free) if self.prefix is not None else None

    def claim(self, slot: int) -> None:
        """`slot` holds a new request from now on: what it kept is no longer there to resume."""
        if self.prefix is not None:
            self.prefix.drop(slot)

    def forget(self) -> None:
        """Every slot's kept tokens are forgotten (the next prompts are prefilled whole)."""
        if self.prefix is not None:
            self.prefix.clear()

    def release(self, slot: int, keep: Sequence[int] | None = None) -> bool:
        """The slot is free; `keep`: the tokens whose K/V it holds from position 0 (its request's prompt and
        output but the last), kept for a later prompt that starts with them. What else may be written there bounds
        the resume: the steps in flight may still commit for it, and as a padding row it writes a block at its
        start. Whether the prefix cache kept them (the slot's device state must then stay as it is)."""
        kept = keep is not None and self.prefix is not None and slot in self.lengths and \
            self.prefix.keep(slot, keep, self.lengths[slot] + self.reach() + self.B)
        self.lengths.pop(slot, None)
        self.riding.pop(slot, None)
        self.queue = deque(q for q in self.queue if q[0] != slot)
        return kept

    # ---- riding (AR with `mixed`) --------------------------------------------------------------------
    def mixed_buckets(self) -> list[tuple[int, int]]:
        """(P, k) of every step that may carry prompts: k in MIXED_ROWS, each padded to P, a multiple of
        PREFILL_BUCKET with k * P <= MIXED_TOKENS (and P below the cache)."""
        return [(P, k) for k in MIXED_ROWS
                for P in range(PREFILL_BUCKET, min(MIXED_TOKENS // k, self.max_len - 1) + 1, PREFILL_BUCKET)]

    def can_ride(self, prompts: Sequence[Sequence[int]]) -> bool:
        """Whether `prompts` may ride in one step together (a mixed graph of their count and longest bucket: see
        `mixed_buckets`)."""
        k = len(prompts)
        return (self.mixed and k in MIXED_ROWS and all(prompts)
                and self.padded(max(map(len, prompts))) <= min(MIXED_TOKENS // k, self.max_len - 1))

    def waits_to_ride(self, prompts: Sequence[Sequence[int]], logprobs: bool) -> bool:
        """Whether these prompts, admitted together, wait to ride in the next steps (up to max(MIXED_ROWS) a step):
        with `mixed`, while rows decode, with at most `ride_queue` waiting (a larger burst is prefilled in one
        forward: riding, its rows' starts would be staggered by steps), none wanting logprobs (the step after may
        overwrite its prefill's logits row)."""
        return (self.mixed and bool(self.lengths) and len(self.queue) + len(prompts) <= self.ride_queue
                and not logprobs and all(self.can_ride([p]) for p in prompts))

    def wait(self, slots: Sequence[int], prompts: Sequence[Sequence[int]]) -> None:
        """These admitted prompts wait to ride (`waits_to_ride` said so), oldest first."""
        self.queue.extend(zip(slots, map(list, prompts)))

    def unridden(self) -> list[tuple[int, list[int]]]:
        """No row is left to step while prompts wait to ride (once the steps in flight are collected): they are
        prefilled the usual way instead, all of them, and leave the queue."""
        out, self.queue = list(self.queue), deque()
        return out

    def waiting(self) -> set[int]:
        """The slots whose prompt waits to ride or rides in a step in flight: no step takes them as rows yet."""
        return {s for s, _ in self.queue} | set(self.riding)

    def _next_rides(self) -> list[tuple[int, list[int]]]:
        """The oldest prompts waiting to ride, as many as may go together."""
        rides: list[tuple[int, list[int]]] = []
        for slot, prompt in list(self.queue)[:max(MIXED_ROWS)]:
            if not self.can_ride([p for _, p in rides] + [prompt]):
                break
            rides.append((slot, prompt))
        return rides

    # ---- steps ------------------------------------------------------------------------------------
    def plan(self, slots: Sequence[int], rides: Sequence[tuple[int, list[int]]] = ()) -> StepPlan | None:
        """The next step for `slots` behind the steps in flight, carrying `rides` ((free slot, prompt) pairs that
        `can_ride` together); None when the cache bound (every step in flight accepting a whole block) would pass
        the cache, or DEPTH steps are already in flight: collect first."""
        need = max(self.lengths[s] for s in slots) + self.B * (len(self.inflight) + 1)
        if need > self.max_len or len(self.inflight) >= DEPTH:
            return None
        bs = next(b for b in self.sizes if b > max(slots))
        L = min(self.max_len, -(-need // self.kv_block) * self.kv_block)
        w = self.chooser.choose(bs, len(slots)) if self.chooser else self.fixed
        P, taken = 0, []
        if rides:
            prompts = [p for _, p in rides]
            if not self.can_ride(prompts):
                raise ValueError(f"prompts of {[len(p) for p in prompts]} tokens cannot ride in one step")
            P = self.padded(max(map(len, prompts)))
            for s, p in rides:
                self.admitted[s] += 1
                self.riding[s] = self.admitted[s]
                taken.append(Ride(s, self.admitted[s], p))
        kind = "mixed" if rides else "ar" if self.B == 1 else "verify" if w == 1 else "dflash"
        plan = StepPlan(kind, tuple((s, self.admitted[s]) for s in slots), bs, L, w, tuple(taken), P,
                        timed=self.chooser is not None)
        self.inflight.append(plan)
        return plan

    def _plan_riding(self, slots: Sequence[int]) -> StepPlan | None:
        """`plan`, carrying the oldest prompts that wait to ride; those it takes leave the queue."""
        rides = self._next_rides()
        plan = self.plan(slots, rides)
        for _ in rides if plan is not None else []:
            self.queue.popleft()
        return plan

    def rows(self, slots: Sequence[int]) -> list[int]:
        """Of the running `slots`, those a step takes now (not waiting to ride)."""
        waiting = self.waiting()
        return [s for s in slots if s not in waiting]

    def schedule(self, rows: Sequence[Row], ahead: bool | None = None) -> list[StepPlan]:
        """The steps to launch now for `rows` (0, 1 or 2), before the oldest in flight is collected.

        A step is planned unless the newest in flight already steps every row, or one in flight may hold the
        logits of a row that wants logprobs (the next launch rewrites them). A second runs ahead (`ahead`,
        default `step_ahead`) while one is in flight, no row wants logprobs and none could reach max_tokens with
        the steps in flight; near the cache bound it is declined, and the next call plans it.
        """
        slots = [r.slot for r in rows]
        plans = []
        wait = bool(self.inflight) and any(r.logprobs for r in rows)
        if not self.covers(slots) and not wait:
            plan = self._plan_riding(slots)
            if plan is None and not self.inflight:
                raise ValueError(f"a sequence would pass the cache length {self.max_len}")
            plans += [plan] if plan is not None else []
        ahead = self.step_ahead if ahead is None else ahead
        if ahead and len(self.inflight) == 1 and self.covers(slots) and all(
                not r.logprobs and self.reach() < r.left for r in rows):
            plan = self._plan_riding(slots)
            plans += [plan] if plan is not None else []
        return plans

    def reach(self) -> int:
        """The most tokens the steps in flight may still add to one row (each: its verify width)."""
        return sum(p.width for p in self.inflight)

    def covers(self, slots: Sequence[int]) -> bool:
        """Whether the newest step in flight steps every one of `slots`, for the requests they hold now."""
        return bool(self.inflight) and {(s, self.admitted[s]) for s in slots} <= set(self.inflight[-1].rows)

    def current(self, plan: StepPlan) -> list[int]:
        """The rows of `plan` whose slot still holds the request it stepped (not released or re-admitted since)."""
        return [s for s, a in plan.rows if s in self.lengths and self.admitted[s] == a]

    def collected(self, plan: StepPlan, accepted: dict[int, int], firsts: Sequence[int],
                  seconds: float | None) -> None:
        """The oldest step in flight is done: each current row committed its accepted drafts and the bonus, each
        ride still wanted (its first token in `firsts`, in order) is admitted; its time (when measured) and
        acceptance go to the width chooser."""
        if not self.inflight or self.inflight[0] is not plan:
            raise RuntimeError("steps are collected in the order they were planned")
        self.inflight.popleft()
        self.took = {}
        for i, ride in enumerate(plan.rides):
            if self.riding.get(ride.slot) == ride.admission:
                del self.riding[ride.slot]
                self.lengths[ride.slot] = len(ride.prompt)
                self.took[ride.slot] = firsts[i]
                self.rode += 1
        for s, a in accepted.items():
            self.lengths[s] += a + 1
        if self.chooser is not None:
            self.chooser.observe(plan.bs, plan.width, list(accepted.values()), seconds)
