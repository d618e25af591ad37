"""The machine-speed probe: a fixed, short CPU workload timed by the wall clock, a few times at the start of a
sweep, between its server groups and at its end, kept in manifest.json (store MachineSpeed).

Absolute throughput, TPOT and TTFT follow the machine as much as the code: on a shared host another job's load
can make a whole run several times slower, and a GPU server's host side (scheduling, detokenising, HTTP) slows
with it. Two runs' probes say whether they ran on a machine of one speed; the gate compares their absolute
metrics only then (gate/machine.py), and the ratios measured inside one run (the speedup) and τ always.

The workload is one thread of interpreter-bound arithmetic and a C hash over a fixed buffer: no threads, no
allocation that grows, the same work on every machine. Its name carries a version: runs compare only under one.
"""

from __future__ import annotations

import hashlib
import time

from dflash_bench.store import MachineSpeed, Manifest, SpeedProbe

WORKLOAD = "cpu-v1: 100k interpreted multiply-adds + sha256 of 4 MiB, one thread, wall seconds per trial"
TRIALS = 5
_BLOCK = bytes(range(256)) * 4096  # 1 MiB


def _work() -> int:
    x = 0
    for i in range(100_000):
        x = (x * 31 + i) & 0xFFFFFFFF
    h = hashlib.sha256()
    for _ in range(4):
        h.update(_BLOCK)
    return x ^ h.digest()[0]


def probe(at: str, trials: int = TRIALS) -> SpeedProbe:
    """The workload timed `trials` times back to back (wall seconds each: what a loaded machine stretches)."""
    seconds = []
    for _ in range(trials):
        t0 = time.perf_counter()
        _work()
        seconds.append(round(time.perf_counter() - t0, 6))
    return SpeedProbe(at=at, seconds=seconds)


def record(manifest: Manifest, at: str) -> SpeedProbe | None:
    """One probe into the manifest (the caller writes it): the first of a new record, or the next of the run's (a
    resume's too); None where the folder's probes were taken with another workload (a resume by another version:
    they are kept as they are, and not mixed with this one's)."""
    if manifest.machine_speed is None:
        manifest.machine_speed = MachineSpeed(workload=WORKLOAD)
    elif manifest.machine_speed.workload != WORKLOAD:
        return None
    taken = probe(at)
    manifest.machine_speed.probes.append(taken)
    return taken
