"""Whether the sweep's machine ran at the baseline's speed: the rule for the absolute metrics.

Output throughput, TPOT and DFlash tok/s at the SLO are paced by the machine as much as by the code. Each sweep
times a fixed CPU workload at its start, between its server groups and at its end (telemetry/speed_probe.py,
manifest.json `machine_speed`). The ratio of the two runs' probe medians says how much slower (or faster) the
sweep's machine ran. Where it lies inside the band

    1 + speed_tolerance + z x sqrt(2) x cv

(cv: the probes' own spread, their trials pooled over both runs, as gate/noise.py pools repeats; z at the
configured confidence), the machines count as one speed and every metric is gated as measured. Beyond it, the
absolute checks are not comparable: each is reported with its change and the sentence "this machine ran N times
slower than the baseline's", skipped, never failed. Scaling them by the probe's ratio instead would claim that the
served engine slows exactly as the probe does, which nothing measures (a GPU server's device time does not slow
with its host). What stays gated is what one run measures against itself: the speedup (DFlash over AR, the two
measured together, paired or interleaved) and τ at a fixed width, so a DFlash server 30% slower still fails.

A baseline or sweep with no probe (written before runs were probed, or by a Slurm sweep), or probes of another
workload: the absolute metrics are compared as measured, as before, and a note says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dflash_bench.gate.baseline import Baseline
from dflash_bench.gate.config import GateConfig
from dflash_bench.gate.noise import allowance, pooled_cv
from dflash_bench.store import MachineSpeed

# the checks a machine's speed moves by itself: judged only between runs of one speed (compare.set_aside)
ABSOLUTE = ("output_throughput", "tpot_ms_p50", "slo_dflash_tok_s")


@dataclass(frozen=True)
class MachineSpeeds:
    """The two runs' machine speeds, compared. `slower`: how many times longer the sweep's probe took than the
    baseline's (None: not both probed with one workload); `band`: the largest ratio either way still one speed."""

    slower: float | None
    band: float
    note: str

    @property
    def comparable(self) -> bool:
        return self.slower is None or 1 / self.band <= self.slower <= self.band

    def words(self) -> str:
        """'ran 3.9 times slower than the baseline's' (or faster)."""
        assert self.slower is not None
        factor, way = (self.slower, "slower") if self.slower >= 1 else (1 / self.slower, "faster")
        return f"this machine ran {factor:.2f} times {way} than the baseline's"


def machine_speeds(sweep: Baseline, base: Baseline, config: GateConfig) -> MachineSpeeds:
    """The rule above, on the two runs' probes."""
    now, then = sweep.provenance.machine_speed, base.provenance.machine_speed
    missing = [side for side, speed in (("baseline", then), ("sweep", now)) if not _probed(speed)]
    if missing:
        return MachineSpeeds(None, math.inf, f"the {' and the '.join(missing)} recorded no machine-speed probe (written "
                             "before runs were probed): throughput and TPOT are compared as measured, whatever the "
                             "machine's speed")
    assert now is not None and then is not None
    if now.workload != then.workload:
        return MachineSpeeds(None, math.inf, f"the sweep's machine-speed probe ran another workload than the baseline's "
                             f"({now.workload!r} against {then.workload!r}): throughput and TPOT are compared as measured")
    a, b = then.seconds(), now.seconds()
    slower = float(np.median(b)) / float(np.median(a))
    cv = pooled_cv([a, b]) or 0.0
    band = 1 + config.machine.speed_tolerance + allowance(cv, config.bootstrap.confidence)
    speeds = MachineSpeeds(slower, band, "")
    how = (f"speed probe median {1000 * float(np.median(b)):.1f} ms against {1000 * float(np.median(a)):.1f} ms, "
           f"one speed within {band:.2f} times either way")
    if speeds.comparable:
        note = f"machine speed: the sweep's probe took {slower:.2f} times the baseline's ({how}): every metric is gated"
    else:
        note = (f"not comparable: {speeds.words()} ({how}): output throughput, TPOT and DFlash tok/s at the SLO are "
                "reported, not gated; the speedup (DFlash/AR, measured together in each run) and τ are gated")
    return MachineSpeeds(slower, band, note)


def _probed(speed: MachineSpeed | None) -> bool:
    return speed is not None and bool(speed.seconds())

