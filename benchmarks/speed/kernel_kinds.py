"""A device kernel's kind from its name, the kernels a torch.profiler profile saw, and one profiled run summed by
kind: what step_anatomy (replayed decode steps) and gemma_fast --anatomy (a prefill group) report, and what
rows_anatomy's coarser classes are made of (rows_steps.CLASS_OF_KIND); and one run's host time by Python function
(`host_once`, gemma_fast --host): where an eager forward's launches spend the CPU."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from pydantic import BaseModel

# First match wins: a substring of the kernel's name (lower case) -> its kind. Triton's kernels are named after their
# functions (engine/fast/kernels/triton_*.py); SDPA's attention (fmha_cutlassF..., flash..., cudnn ...sdpa...) comes
# before cuBLAS's matmuls (nvjet, sm90_xmma_gemm, cutlass), as its names hold "cutlass" too. Torch's generic kernels
# come last, the specific ones (a mask's compare and masked_fill, index_put, cat, where, copy, fill) before "index" and
# "elementwise", which their names hold too.
KINDS = (
    ("nccl", "collective"),  # tensor parallel's all-reduce and gathers: their names hold "reduce" and "copy" too
    ("memcpy", "memcpy/memset"), ("memset", "memcpy/memset"),  # only when kernels_of(copies=True) keeps them
    ("_split_kernel", "attention"), ("attention", "attention"), ("fmha", "attention"), ("flash", "attention"),
    ("sdpa", "attention"), ("softmax", "softmax"),  # softmax: SDPA's math backend (its matmuls are bmm gemms)
    ("skinny", "matmul"), ("gemm", "matmul"), ("nvjet", "matmul"), ("gemv", "matmul"), ("cutlass", "matmul"),
    ("splitk", "matmul"), ("xmma", "matmul"), ("cublas", "matmul"),
    ("embed_norm", "embedding+norm"), ("rms_norm", "norm"), ("norm_add_norm", "norm"),
    ("qk_rope", "qk norm+rope+store"), ("_qkv_kernel", "qk norm+rope+store"),
    ("silu", "act*up"), ("gelu", "act*up"), ("act_mul", "act*up"),  # the gate's SiLU or tanh GELU (GeGLU) times up
    ("argmax", "argmax"), ("commit", "commit"),
    ("philox", "sampling"), ("uniform", "sampling"), ("distribution", "sampling"),  # a draw's random numbers
    ("masked_fill", "mask/compare"), ("compare", "mask/compare"), ("bitwise", "mask/compare"),
    ("index_put", "cache store (index_put)"), ("gather", "gather (index)"), ("index_kernel_impl", "gather (index)"),
    ("indexselect", "gather (index)"),  # index_select: a prefill's gather of its slots' cached keys
    ("cat", "copy/cat/where"), ("copy", "copy/cat/where"), ("where", "copy/cat/where"),
    ("fill", "fill/arange"), ("arange", "fill/arange"), ("scatter", "scatter"), ("reduce", "reduce"),
    ("embedding", "embedding"), ("index", "embedding"), ("elementwise", "elementwise"),
)


def kind(name: str) -> str:
    low = name.lower()
    return next((k for s, k in KINDS if s in low), "other")


def kernels_of(prof, copies: bool = False) -> list[tuple[str, float, float]]:
    """(name, start us, duration us) of every device kernel in the profile, by start; with `copies`, the memcpy and
    memset activities too."""
    out = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0 and \
                (copies or ("Memcpy" not in e.name and "Memset" not in e.name)):
            out.append((e.name, e.time_range.start, e.time_range.end - e.time_range.start))
    return sorted(out, key=lambda k: k[1])


def tally(kernels: Iterable[tuple[str, float, float]], key: Callable[[str], str] = kind) -> dict[str, list[float]]:
    """[device us, launches] by key(name)."""
    by: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, _, dur in kernels:
        by[key(name)][0] += dur
        by[key(name)][1] += 1
    return dict(by)


class KindTime(BaseModel):
    ms: float
    launches: int


class KernelTime(BaseModel):
    name: str  # the first NAME_CHARS of it
    kind: str
    ms: float
    launches: int


class Anatomy(BaseModel):
    """One profiled run: device time by kind, the busy time (the kernels' durations summed), the span from the first
    kernel's start to the last one's end, the idle time inside it (no kernel running: the host's launch gaps, or a
    wait on the host), and the kernels that took longest. `wall_ms` is the run's host time under the profiler, which
    slows the launches: set the span beside the unprofiled time."""

    classes: dict[str, KindTime]
    launches: int
    busy_ms: float
    span_ms: float
    idle_ms: float
    wall_ms: float
    top: list[KernelTime]
    note: str | None = None  # why the profile holds no kernels, when it holds none


NAME_CHARS = 120


def summarise(kernels: list[tuple[str, float, float]], wall_ms: float, top: int = 12) -> Anatomy:
    """The `Anatomy` of `kernels_of`'s list (by start)."""
    if not kernels:
        return Anatomy(classes={}, launches=0, busy_ms=0.0, span_ms=0.0, idle_ms=0.0, wall_ms=wall_ms, top=[],
                       note="the profiler saw no device kernels")
    idle, reach = 0.0, kernels[0][1]
    for _, start, dur in kernels:  # a gap: no kernel running (kernels of other streams may overlap)
        idle += max(0.0, start - reach)
        reach = max(reach, start + dur)
    classes = {k: KindTime(ms=us / 1e3, launches=int(n)) for k, (us, n) in sorted(tally(kernels).items())}
    names = sorted(tally(kernels, key=lambda n: n).items(), key=lambda kv: -kv[1][0])[:top]
    return Anatomy(classes=classes, launches=len(kernels), busy_ms=sum(d for _, _, d in kernels) / 1e3,
                   span_ms=(reach - kernels[0][1]) / 1e3, idle_ms=idle / 1e3, wall_ms=wall_ms,
                   top=[KernelTime(name=n[:NAME_CHARS], kind=kind(n), ms=us / 1e3, launches=int(c)) for n, (us, c) in names])


def profile_once(run: Callable[[], None], cuda: bool, top: int = 12) -> Anatomy:
    """Profile one call of `run` (which must synchronise the device before it returns) for its device kernels and
    copies. Without `cuda` the run is timed but not profiled: a CPU runs no device kernels."""
    if not cuda:
        t0 = time.perf_counter()
        run()
        return summarise([], 1e3 * (time.perf_counter() - t0)).model_copy(
            update={"note": "no CUDA device: a CPU runs no device kernels to profile"})
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        run()
        wall_ms = 1e3 * (time.perf_counter() - t0)
    return summarise(kernels_of(prof, copies=True), wall_ms, top)


class HostCall(BaseModel):
    name: str  # function (file:line, the file's last two parts) or builtin
    calls: int
    self_ms: float  # in the function itself, under cProfile (which slows Python calls: compare the shares)
    total_ms: float  # with what it calls


class HostTime(BaseModel):
    """One run of `run` under cProfile: its wall time, the time the host waited on the device (inside the
    synchronising calls WAITS names), the host's own time (the rest), and the functions that took most of it by self
    time. A wait inside another call (a device tensor's item set from the host, which synchronises) counts as that
    call's own time: read `top` for one."""

    wall_ms: float
    device_wait_ms: float
    host_ms: float
    top: list[HostCall]


# builtins that block the host until the device has run what is queued, as cProfile names them
WAITS = ("<method 'tolist' of", "<method 'item' of", "_cuda_synchronize>")


def host_once(run: Callable[[], None], top: int = 20) -> HostTime:
    """Profile one call of `run` with cProfile: where the host's time goes (`HostTime`)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.runcall(run)
    wall_ms = 1e3 * (time.perf_counter() - t0)
    stats: dict = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = []
    for (file, line, fn), (_, calls, tt, ct, _) in stats.items():
        name = fn if file == "~" else f"{'/'.join(Path(file).parts[-2:])}:{line}:{fn}"
        rows.append(HostCall(name=name[:NAME_CHARS], calls=calls, self_ms=1e3 * tt, total_ms=1e3 * ct))
    wait = sum(r.self_ms for r in rows if any(w in r.name for w in WAITS))
    rows.sort(key=lambda r: -r.self_ms)
    return HostTime(wall_ms=wall_ms, device_wait_ms=wait, host_ms=wall_ms - wait, top=rows[:top])
