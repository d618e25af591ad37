"""The processes of a tensor-parallel fast engine (`serve --fast --tensor-parallel-size N`): one per rank, started and
stopped together.

Rank 0 is the server's process: it runs the scheduler, the HTTP server and its own shard. It starts ranks 1..N-1
(`multiprocessing` spawn, daemonic), which load the same weights, keep their own shard (`shard.py`) and replay
what rank 0's runner does, call by call (`Followers.send`: each prefill, step plan, collect and release, through a
pipe per rank), so every rank runs the same kernels and collectives in the same order. The tensors' collectives go
through torch.distributed: NCCL on GPUs (a rank per device, rank r on cuda:r), gloo on the CPU.

Faults: a rank that fails sends its error to rank 0 and exits; rank 0's watcher (`Followers._watch`) then prints
it, ends the other ranks and exits the server within a second, without waiting on a collective that would never
finish. A rank whose rank 0 is gone exits: its pipe reads end-of-file, and the kernel kills it when rank 0's
process dies (Linux's parent-death signal) even inside a collective. Rank 0 ends them on stop.

Hangs: every rank watches its own calls (`Watch`): a call that makes no progress for `STALL_S` seconds (a
collective another rank never entered, a device that never finishes) ends the server with one sentence naming the
rank, the call and the step, as a failed rank does; a rank above 0 reports it to rank 0 first.

Stop: the process group ends only after the CUDA graphs that captured its collectives are gone (`Followers.on_stop`):
NCCL (2.26 and later) waits, inside the group's destroy, until every graph holding its communicator is destroyed, so
ending it under live graphs never returns.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Iterator

import torch

from dflash_bench.engine.config import EngineConfig
from dflash_bench.engine.fast.models.shard import Shard
from dflash_bench.errors import UserError

log = logging.getLogger("dflash_bench.engine")
JOIN_S = 10.0  # how long a stopping rank 0 waits for the others to exit before killing them
# how long one call of a rank (a step, a collect, a prefill) may make no progress before the server ends, naming the
# rank and the step (a tensor-parallel hang becomes a failure); START_S: the same for joining the group (the other
# ranks start and import meanwhile), capturing one graph, waiting for the others to be ready
STALL_S = 120.0
START_S = 600.0


@dataclass
class Watch:
    """What this rank is doing and since when, for the watchdog: one call at a time (`doing`), and the steps it has
    launched (every rank counts the same calls, so "step 12" is the same step on each)."""

    rank: int
    stall_s: float = STALL_S  # a call's limit
    start_s: float = START_S  # a starting phase's (`call(..., start=True)`)
    doing: tuple[str, float, float] | None = None  # (what, since: time.monotonic(), its limit)
    steps: int = 0  # `run` calls so far
    counts: dict[str, int] = field(default_factory=dict)

    @contextmanager
    def call(self, name: str, what: str | None = None, *, start: bool = False) -> Iterator[None]:
        """Watch this call (a runner call's `name`, or a phase's `what`; `start`: a starting phase's limit) while it
        runs."""
        n = self.counts[name] = self.counts.get(name, 0) + 1
        if name == "run":
            self.steps += 1
        label = what or (f"step {self.steps}" if name == "run" else f"{name} #{n} (after step {self.steps})")
        self.doing = (label, time.monotonic(), self.start_s if start else self.stall_s)
        try:
            yield
        finally:
            self.doing = None

    def stalled(self) -> str | None:
        """One sentence when the call under way has run past its limit, else None."""
        doing = self.doing
        if doing is None or time.monotonic() - doing[1] < doing[2]:
            return None
        return (f"tensor-parallel rank {self.rank} made no progress for {time.monotonic() - doing[1]:.0f} s in "
                f"{doing[0]} (a collective that another rank did not enter, or a device that does not finish)")

    @property
    def tick(self) -> float:
        """How often a watchdog looks."""
        return max(0.05, min(1.0, self.stall_s / 8))


def watchdog(watch: Watch, report: Callable[[str], None]) -> threading.Thread:
    """A daemon thread that calls `report` once with `watch`'s sentence when its call stalls past its limit."""
    def loop() -> None:
        while True:
            time.sleep(watch.tick)
            why = watch.stalled()
            if why is not None:
                report(why)
                return
    t = threading.Thread(target=loop, daemon=True, name=f"dflash-bench-rank{watch.rank}-watchdog")
    t.start()
    return t


def free_address() -> str:
    """A rendezvous address for torch.distributed: a free port of this host."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def rank_device(config: EngineConfig, rank: int) -> str:
    """The device of rank `rank`: cuda:<rank> on GPUs, else the CPU."""
    return f"cuda:{rank}" if config.device.startswith("cuda") else "cpu"


def join_group(config: EngineConfig, address: str, rank: int) -> Shard:
    """This rank in the ranks' process group (NCCL on GPUs, gloo on the CPU), of `config.tensor_parallel_size`."""
    import torch.distributed as dist

    cuda, size = config.device.startswith("cuda"), config.tensor_parallel_size
    if cuda:
        torch.cuda.set_device(rank)
    kw: dict[str, Any] = {"device_id": torch.device(f"cuda:{rank}")} if cuda else {}
    dist.init_process_group("nccl" if cuda else "gloo", init_method=address, rank=rank, world_size=size,
                            timeout=timedelta(minutes=30), **kw)
    return Shard(rank, size)


def _die_with_parent() -> None:
    """Linux: the kernel kills this process when the process that started it dies (even inside a collective)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def check_parallel(model: str, draft: str | None, size: int, *, device: str) -> None:
    """What `size` ranks cannot run, in one sentence, before any process starts: more ranks than visible GPUs, or a
    target or drafter whose heads (or rows) `size` does not divide (`family.check_split`)."""
    import json
    from pathlib import Path

    from transformers import AutoConfig

    from dflash_bench.engine.reference.drafter import DrafterConfig
    from dflash_bench.engine.fast.models.family import check_split
    from dflash_bench.engine.fast.models.cache_layout import check_drafter_split

    if device.startswith("cuda") and torch.cuda.device_count() < size:
        n = torch.cuda.device_count()
        raise UserError(f"--tensor-parallel-size {size} needs {size} GPUs, one a rank, but {n} "
                        f"{'is' if n == 1 else 'are'} visible")
    try:
        cfg = AutoConfig.from_pretrained(model).get_text_config()
    except (OSError, ValueError, KeyError) as err:
        raise UserError(f"the builtin engine could not read the target's config from {model!r}: "
                        f"{str(err).strip().splitlines()[0]}") from err
    dc = None
    if draft is not None and (Path(draft) / "config.json").is_file():
        dc = DrafterConfig.from_dict(json.loads((Path(draft) / "config.json").read_text()))
    check_split(cfg, size)
    if dc is not None:
        check_drafter_split(dc, size)


# what a rank above 0 builds (`make.rank_core`): the config, its rank and shard, a call that returns rank 0's slot
# count (anything else: rank 0 stopped before sending it) and the rank's watchdog; returns the core that replays
# rank 0's runner calls, or None
RankBuild = Callable[[EngineConfig, int, Shard, Callable[[], object], "Watch"], Any]


def run_rank(config: EngineConfig, address: str, rank: int, conn: Connection, build: RankBuild, stall_s: float,
             start_s: float) -> None:
    """A rank above 0 (its process): join the group, `build` its core with rank 0's slots, then replay rank 0's
    runner calls until it stops (or is gone); every call watched (`Watch`: `stall_s`, `start_s`)."""
    _die_with_parent()
    if not config.device.startswith("cuda"):
        torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: rank 0 decides
    watch = Watch(rank, stall_s, start_s)

    def stalled(why: str) -> None:  # this rank hangs: rank 0 says why and stops the server
        try:
            conn.send(("stalled", why))
        except OSError:
            pass
        print(f"error: {why}", file=sys.stderr, flush=True)
        os._exit(1)
    try:
        watchdog(watch, stalled)
        with watch.call("join", "joining the process group", start=True):
            shard = join_group(config, address, rank)
        core = build(config, rank, shard, conn.recv, watch)
        if core is None:
            os._exit(0)
        conn.send(("ready", None))
        follow(core, conn, watch)
    except EOFError:
        os._exit(0)  # rank 0 is gone
    except BaseException as err:  # noqa: BLE001 - whatever it was, rank 0 says it and stops the server
        msg = str(err) if isinstance(err, UserError) else f"{type(err).__name__}: {err}"
        try:
            conn.send(("error", msg))
        except OSError:
            pass
        if not isinstance(err, UserError):
            import traceback

            traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)


def follow(core: Any, conn: Connection, watch: Watch | None = None) -> None:
    """Replay rank 0's runner calls (`Followers.send`) on this rank's core (`EngineCore.replay`) until it says stop,
    each under `watch` (the rank's watchdog)."""
    watch = watch or Watch(-1)
    while True:
        name, args, kw = conn.recv()
        if name == "stop":
            return
        with watch.call(name):
            core.replay(name, *args, **kw)


class Followers:
    """Rank 0's side of ranks 1..N-1: started with `start`, told each runner call (`send`), watched, stopped. Each
    rank runs `build` (`run_rank`) with the same config."""

    def __init__(self, config: EngineConfig, build: RankBuild, on_death: Callable[[str], None] | None = None):
        self.config, self.build = config, build
        self.address = free_address()
        self.stall_s, self.start_s = STALL_S, START_S  # the ranks' watchdogs' limits, as set when they start
        self.on_death = on_death or _exit_server
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        self.stopping = False
        self.ready = threading.Event()
        self._ready: set[int] = set()
        self.watch = Watch(0, self.stall_s, self.start_s)  # rank 0's calls, watched by `_watch`
        # run before the group ends: drop what holds its communicator (the engine's CUDA graphs)
        self.on_stop: list[Callable[[], None]] = []

    def start(self) -> "Followers":
        ctx = mp.get_context("spawn")
        for rank in range(1, self.config.tensor_parallel_size):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=run_rank, daemon=True,
                            args=(self.config, self.address, rank, theirs, self.build, self.stall_s, self.start_s),
                            name=f"dflash-bench-rank{rank}")
            p.start()
            theirs.close()
            self.procs.append(p)
            self.conns.append(mine)
        threading.Thread(target=self._watch, daemon=True, name="dflash-bench-ranks").start()
        return self

    def join(self) -> Shard:
        """Rank 0 in the group (after `start`), watched as the others' joins are."""
        with self.call("join", "joining the process group", start=True):
            return join_group(self.config, self.address, 0)

    def send(self, name: str, *args: Any, **kw: Any) -> None:
        """Every other rank runs `runner.<name>(*args, **kw)` next (a rank that is gone is `_watch`'s to report)."""
        for c in self.conns:
            try:
                c.send((name, args, kw))
            except OSError:
                pass

    def call(self, name: str, what: str | None = None, *, start: bool = False) -> Any:
        """Watch rank 0's part of a call (`Watch.call`): its watchdog ends the server when it stalls."""
        return self.watch.call(name, what, start=start)

    def slots(self, n: int) -> None:
        for c in self.conns:
            c.send(n)

    def wait_ready(self) -> None:
        with self.call("ready", "waiting for the other ranks to load and capture their graphs", start=True):
            self.ready.wait()

    def _watch(self) -> None:
        """Rank 0's watcher: the others' messages and deaths, and rank 0's own calls. A rank that fails, exits before
        stop or stalls (`Watch`) ends the server."""
        live = {c: r + 1 for r, c in enumerate(self.conns)}
        sentinels = {p.sentinel: r + 1 for r, p in enumerate(self.procs)}
        while live or sentinels:
            why = self.watch.stalled()
            if why is not None and not self.stopping:
                self._died(why)
                return
            for ready in wait([*live, *sentinels], timeout=self.watch.tick):
                if ready in sentinels:
                    rank = sentinels.pop(ready)
                    if not self.stopping:
                        self.procs[rank - 1].join(1.0)  # reaped: its exit code is known
                        code = self.procs[rank - 1].exitcode
                        self._died(f"tensor-parallel rank {rank} exited (code {code})")
                        return
                    continue
                assert isinstance(ready, Connection)
                rank = live[ready]
                try:
                    kind, msg = ready.recv()
                except (EOFError, OSError):
                    live.pop(ready)
                    continue
                if kind == "ready":
                    self._ready.add(rank)
                    if len(self._ready) == len(self.conns):
                        self.ready.set()
                elif not self.stopping:
                    self._died(msg if kind == "stalled" else f"tensor-parallel rank {rank} failed: {msg}")
                    return

    def _died(self, why: str) -> None:
        self.kill()
        self.on_death(why)

    def stop(self) -> None:
        """Drop what holds the group's communicator (`on_stop`: the engine's graphs, once the device has run what was
        queued, while the other ranks still run their part), tell the ranks to stop, wait for them a while, kill what
        is left, then end the group. A device wait or a destroy that does not return within `stall_s` is one
        sentence (a RuntimeError), not a hang."""
        if self.stopping:
            return
        self.stopping = True
        released = bounded(lambda: [release() for release in self.on_stop], self.stall_s)
        for c in self.conns:
            try:
                c.send(("stop", (), {}))
            except OSError:
                pass
        for p in self.procs:
            p.join(JOIN_S)
        self.kill()
        if not released:
            raise RuntimeError(f"tensor-parallel rank 0 made no progress for {self.stall_s:.0f} s in releasing its "
                               "CUDA graphs at stop (a collective that another rank did not enter)")
        end_group(self.stall_s)

    def kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(JOIN_S)


def bounded(fn: Callable[[], Any], limit: float) -> bool:
    """Run `fn` on a thread of its own for at most `limit` seconds: whether it returned (an error it raised is
    raised here). One that never returns (a device wait, a destroy) is left behind, a daemon."""
    err: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            err.append(e)
    t = threading.Thread(target=run, daemon=True, name="dflash-bench-bounded")
    t.start()
    t.join(limit)
    if err:
        raise err[0]
    return not t.is_alive()


def end_group(limit: float) -> None:
    """End this process's group (a new engine may make another) within `limit` seconds, or one sentence: NCCL's destroy
    never returns while a CUDA graph that captured the group's collectives is alive."""
    import torch.distributed as dist

    if dist.is_initialized() and not bounded(dist.destroy_process_group, limit):
        raise RuntimeError(f"tensor-parallel rank 0 made no progress for {limit:.0f} s in ending the process group "
                           "(a CUDA graph that captured its collectives still alive?)")


def _exit_server(why: str) -> None:
    """A rank died while serving: the server goes down now, saying why (no collective is waited on)."""
    print(f"error: {why}; the server stops", file=sys.stderr, flush=True)
    log.error("%s; the server stops", why)
    os._exit(1)
