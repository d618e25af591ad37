"""What rows_anatomy measures and writes: its results file's schema, the kernel classes, the floors and the growth
per row; the shapes it builds (random weights on the device), the cores it steps, and the one function that reaches
into the engine (`drive`: what a step costs the host and the device, as the served core runs it), so that a change
of the engine's layout touches `drive` alone."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from benchmarks.speed.kernel_kinds import kind

CLASSES = ("gemm", "attention", "sampling+commit", "norms/rope/elementwise", "other")
# a kernel's class is its kind (kernel_kinds, the one classifier of kernel names) coarsened: tensor parallel's
# collectives, copies to and from the host, and what no rule knows are "other"
CLASS_OF_KIND = {"matmul": "gemm", "attention": "attention", "softmax": "attention", "argmax": "sampling+commit",
                 "commit": "sampling+commit", "sampling": "sampling+commit",
                 **{k: "norms/rope/elementwise" for k in (
                     "embedding+norm", "norm", "qk norm+rope+store", "act*up", "mask/compare",
                     "cache store (index_put)", "gather (index)", "copy/cat/where", "fill/arange", "scatter",
                     "reduce", "embedding", "elementwise")}}


def kernel_class(name: str) -> str:
    """The class of a device kernel, from its name (`CLASSES`)."""
    return CLASS_OF_KIND.get(kind(name), "other")


class Point(BaseModel):
    """One shape, mode and row count: per step, averaged over the pass."""

    shape: str
    mode: Literal["ar", "dflash"]
    width_policy: Literal["ar", "full", "auto"]
    rows: int
    width: int  # tokens verified per row and step (AR: 1); auto: the width the chooser picked
    chosen: dict[int, int] = {}  # auto: steps per width the chooser took in its learning steps
    steps: int
    context_first: int  # committed tokens of a row at the first and the last profiled step
    context_last: int
    tokens_per_row_step: float  # committed per row and step (DFlash: the realized tau)
    wall_us: float  # the engine loop, end to end, per step (timed pass)
    host_us: float  # the loop's own time: schedule + collect, without the wait for the device
    wait_us: float  # collect's wait for the device
    busy_us: float | None  # the device's kernels, summed (profiled pass; None on a CPU)
    span_us: float | None  # first kernel start to last kernel end
    launches: float | None  # kernels per step
    classes_us: dict[str, float] = {}  # per kernel class, device us per step
    weight_floor_us: float  # the weights one step reads, over the measured bandwidth
    kv_floor_us: float  # the KV the rows read at the mean profiled context, over the same
    captured_in_window: int = 0  # graphs captured inside the timed or profiled pass (then its numbers hold a capture)


class Growth(BaseModel):
    """How a class grows with rows, us per added row per step (least squares over the row counts from 32 up)."""

    shape: str
    width_policy: str
    rows: list[int]
    us_per_row: dict[str, float]


class ShapeInfo(BaseModel):
    weight_bytes: int  # the target's, one step
    draft_weight_bytes: int  # the drafter's (with the lm_head it borrows), one draft
    kv_bytes_per_token: int  # the target's, a token of context in every layer (below a sliding window)
    draft_kv_bytes_per_token: int
    windows: list[int | None]  # per cache kind of the target: its sliding window (None: full attention)
    max_len: int
    build_s: float


class RowsAnatomy(BaseModel):
    """rows_anatomy's results file."""

    schema_version: int = 1
    command: str
    device: str
    torch: str
    dtype: str
    bandwidth_GBps: float  # a device-to-device copy, bytes read + written per second
    context: int  # each prompt's tokens (the context at the first step)
    tau: float
    shapes: dict[str, ShapeInfo] = {}
    points: list[Point] = []
    growth: list[Growth] = []
    errors: dict[str, str] = Field(default_factory=dict)  # shape -> why it was not measured


def floors_us(weight_bytes: int, kv_bytes_per_row: float, rows: int, bandwidth: float) -> tuple[float, float]:
    """(weight read, KV read) of one step in us at `bandwidth` bytes/s (a copy's read + written)."""
    return 1e6 * weight_bytes / bandwidth, 1e6 * rows * kv_bytes_per_row / bandwidth


def kv_bytes_per_row(per_token: int, windows: list[int | None], kinds_tokens: list[int], context: float) -> float:
    """The KV one row reads at `context`: each cache kind's bytes per token (`kinds_tokens`) times the context, a
    sliding kind's at most its window. `per_token` is unused when kinds are given (kept for the dense one-kind case)."""
    if not kinds_tokens:
        return per_token * context
    return sum(b * (min(context, w) if w else context) for b, w in zip(kinds_tokens, windows))


def growth(points: list[Point], low: int = 32) -> list[Growth]:
    """Per (shape, width policy), the least-squares slope of each class (and busy, wall) over rows >= `low`."""
    out = []
    keys = sorted({(p.shape, p.width_policy) for p in points})
    for shape, policy in keys:
        ps = sorted((p for p in points if (p.shape, p.width_policy) == (shape, policy) and p.rows >= low),
                    key=lambda p: p.rows)
        if len(ps) < 2:
            continue
        xs = [float(p.rows) for p in ps]
        series = {c: [p.classes_us.get(c, 0.0) for p in ps] for c in CLASSES if any(c in p.classes_us for p in ps)}
        series["busy"] = [p.busy_us or 0.0 for p in ps]
        series["wall"] = [p.wall_us for p in ps]
        series["host"] = [p.host_us for p in ps]
        out.append(Growth(shape=shape, width_policy=policy, rows=[p.rows for p in ps],
                          us_per_row={k: round(_slope(xs, ys), 3) for k, ys in series.items()}))
    return out


def _slope(xs: list[float], ys: list[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0



# name -> (family of builder, the recorded shape it builds): engine_speed's Qwen3 shapes, or a pair of
# dflash_bench/model_shapes.py written by benchmarks/peers/big_shape.py ("gemma-tiny": its layout, shrunk, for a CPU)
SHAPES = {"qwen3-8b": ("qwen3", "qwen3-8b"), "tiny": ("qwen3", "tiny"), "gemma-4-31B-it": ("recorded", "gemma-4-31B-it"),
          "gemma-tiny": ("recorded", "gemma-4-31B-it")}
PREFILL_BUCKET = 256  # max_len is rounded up to this


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bandwidth(device: str) -> float:
    """Bytes a second a device-to-device copy moves (read + written): 2 GiB on a GPU, 64 MiB on a CPU."""
    from benchmarks.speed.gemma_fast import copy_bandwidth

    return copy_bandwidth("cuda" if device.startswith("cuda") else "cpu")


@dataclass
class Built:
    """A shape's fast-path target and drafter over `slots` slots, and the cores stepping them (by width policy)."""

    name: str
    device: str
    target: Any
    drafter: Any
    info: ShapeInfo
    kinds_tokens: list[int]  # the target's KV bytes per token, per cache kind
    context: int
    tau: float
    cores: dict[Any, Any] = field(default_factory=dict)

    def core(self, width: str | int) -> Any:
        """The core of a width policy: "ar", "full", "auto", or a fixed width (made once, its graphs captured as its
        steps need them)."""
        if width not in self.cores:
            from dflash_bench.engine.config import StepConfig
            from dflash_bench.engine.fast.core import EngineCore

            if width == "ar":
                cfg, drafter = StepConfig(verify_width="full"), None
            else:
                cfg, drafter = StepConfig(verify_width=width, synthetic_acceptance=self.tau), self.drafter
            self.cores[width] = EngineCore(self.target, drafter, cfg, keep_logits=True)  # keep_logits: as serve's
        return self.cores[width]

    def close(self) -> None:
        for core in self.cores.values():
            core.drop_graphs()
        self.cores.clear()


def build(name: str, device: str, dtype: torch.dtype, *, slots: int, context: int, steps: int, tau: float,
          work: Path) -> Built:
    """The shape's target and drafter, random weights created on the device, its cache long enough for a pass of
    `steps` DFlash steps accepting whole blocks past `context`."""
    from dflash_bench.engine.fast.models.draft import FastDrafter
    from dflash_bench.engine.fast.models.family import load_target
    from dflash_bench.engine.fast.models.cache_layout import drafter_kind

    t0 = time.perf_counter()
    kind, shape = SHAPES[name]
    torch.manual_seed(0)
    if kind == "qwen3":
        from benchmarks.speed.engine_speed import SHAPES as QWEN, build_pair

        hf, drafter = build_pair(QWEN[shape], torch.device(device), dtype)
    else:
        from benchmarks.fixtures.shape_folders import write_shape
        from dflash_bench.engine.fast.make import load_pair

        if name == "gemma-tiny":
            from benchmarks.speed.gemma_fast import shrink

            shrink(shape)
        folders = write_shape(shape, work)
        hf, drafter = load_pair(folders["target"], folders["drafter"], dtype=dtype, device=device, dummy=True)
    block = drafter.config.block_size
    max_len = -(-(context + (steps + 4) * block) // PREFILL_BUCKET) * PREFILL_BUCKET
    target = load_target(hf, max_slots=slots, max_len=max_len, consume=True)
    fd = FastDrafter(drafter, target.embed, target.head, max_slots=slots, max_len=max_len)
    del hf, drafter
    elem = torch.finfo(dtype).bits // 8
    kinds = [2 * k.layers * k.hkv * k.hd * elem for k in target.caches]
    dk = drafter_kind(fd.c, max_len)
    info = ShapeInfo(weight_bytes=target.weight_bytes(), draft_weight_bytes=fd.weight_bytes(),
                     kv_bytes_per_token=sum(kinds), draft_kv_bytes_per_token=2 * dk.layers * dk.hkv * dk.hd * elem,
                     windows=[k.window for k in target.caches], max_len=max_len, build_s=time.perf_counter() - t0)
    return Built(name, device, target, fd, info, kinds, context, tau)


def prompts(rows: int, length: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(rows)
    return torch.randint(10, max(11, min(vocab, 30000)), (rows, length), generator=g).tolist()


def drive(core: Any, rows: int, context: int, steps: int, *, profile: bool = False) -> dict[str, Any]:
    """Prefill `rows` prompts of `context` tokens into slots 0..rows-1, step them `steps` times as the served core does
    (`schedule`, then `collect`: the next step launched before this one's tokens are read), release them. Returns the
    host's and the device's time and what the steps committed; with `profile`, the device's kernels too.

    What it reads of the engine beyond the core's calls, it reads through the core's probe (its steps in flight, its
    graphs, its synthetic draws, each row's committed length)."""
    from dflash_bench.engine.fast.scheduling.scheduler import Row

    probe = core.probe
    device = str(core.dev)
    probe.restart_draws()  # every pass draws the same synthetic acceptances: the same trajectory
    slots = list(range(rows))
    core.add_many(slots, prompts(rows, context, core.vocab_size))
    sync(device)
    graphs, launched = len(probe.graphs), probe.launched
    first = sum(probe.running[s] for s in slots) / rows
    host = wait = 0.0
    tokens = 0
    prof = None
    if profile and device.startswith("cuda"):
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as profiler

        prof = profiler(activities=[ProfilerActivity.CUDA])
        prof.__enter__()
    t0 = time.perf_counter()
    for _ in range(steps):
        a = time.perf_counter()
        core.schedule([Row(s) for s in slots])
        b = time.perf_counter()
        probe.wait_oldest()
        c = time.perf_counter()
        got = core.collect()
        d = time.perf_counter()
        host, wait = host + (b - a) + (d - c), wait + (c - b)
        tokens += sum(len(v) for v in got.values())
    last = sum(probe.running[s] for s in slots) / rows
    while core.inflight:
        core.collect()
    sync(device)
    wall = time.perf_counter() - t0
    ks = None
    if prof is not None:
        prof.__exit__(None, None, None)
        from benchmarks.speed.kernel_kinds import kernels_of

        ks = kernels_of(prof)
    out = dict(wall_us=1e6 * wall / steps, host_us=1e6 * host / steps, wait_us=1e6 * wait / steps,
               tokens_per_row_step=tokens / (steps * rows), context_first=round(first), context_last=round(last),
               captured=len(probe.graphs) - graphs, launched=probe.launched - launched, kernels=ks)
    for s in slots:
        core.release(s)
    return out


def classify(kernels: list[tuple[str, float, float]], steps: int) -> dict[str, Any]:
    """Per step: busy us, span us, launches, and us per class, from (name, start us, duration us) kernels."""
    by = Counter[str]()
    for name, _, dur in kernels:
        by[kernel_class(name)] += dur
    span = kernels[-1][1] + kernels[-1][2] - kernels[0][1] if kernels else 0.0
    return dict(busy_us=sum(d for _, _, d in kernels) / steps, span_us=span / steps, launches=len(kernels) / steps,
                classes_us={c: round(by[c] / steps, 1) for c in CLASSES if c in by})


def measure_point(built: Built, mode: str, rows: int, *, steps: int, learn: int, bandwidth: float) -> Point:
    """One point: AR ("ar"), DFlash verifying the whole block ("full"), or at the width the chooser picks after
    `learn` steps of its own at these rows ("auto"): warm-up, timed and profiled passes of `steps` steps."""
    B = built.drafter.B
    chosen: dict[int, int] = {}
    if mode == "auto":
        learner = built.core("auto")
        drive(learner, rows, built.context, max(2, learn // 2))
        before = dict(learner.widths_chosen())
        drive(learner, rows, built.context, max(2, learn - learn // 2))
        chosen = {w: n - before.get(w, 0) for w, n in learner.widths_chosen().items() if n > before.get(w, 0)}
        width = max(chosen, key=lambda w: (chosen[w], w)) if chosen else B
        core = built.core("full" if width == B else width)
    else:
        width = 1 if mode == "ar" else B
        core = built.core(mode)
    drive(core, rows, built.context, steps)  # warm-up: captures what the steps need
    timed = drive(core, rows, built.context, steps)
    prof = drive(core, rows, built.context, steps, profile=True)
    dev = classify(prof["kernels"], prof["launched"]) if prof["kernels"] is not None else {}
    mean_ctx = (prof["context_first"] + prof["context_last"]) / 2
    wbytes = built.info.weight_bytes + (built.info.draft_weight_bytes if mode != "ar" else 0)
    kv_row = kv_bytes_per_row(built.info.kv_bytes_per_token, built.info.windows, built.kinds_tokens, mean_ctx)
    if mode != "ar":
        kv_row += built.info.draft_kv_bytes_per_token * mean_ctx
    w_us, kv_us = floors_us(wbytes, kv_row, rows, bandwidth)
    return Point(shape=built.name, mode="ar" if mode == "ar" else "dflash",
                 width_policy=mode if mode in ("ar", "full", "auto") else "full", rows=rows, width=width,
                 chosen=chosen, steps=steps, context_first=prof["context_first"], context_last=prof["context_last"],
                 tokens_per_row_step=timed["tokens_per_row_step"], wall_us=timed["wall_us"], host_us=timed["host_us"],
                 wait_us=timed["wait_us"], busy_us=dev.get("busy_us"), span_us=dev.get("span_us"),
                 launches=dev.get("launches"), classes_us=dev.get("classes_us", {}), weight_floor_us=w_us,
                 kv_floor_us=kv_us, captured_in_window=timed["captured"] + prof["captured"])
