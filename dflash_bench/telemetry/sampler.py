"""Background sampling of GPUs during a measured window, and the telemetry.csv it leaves.

    sampler = TelemetrySampler(gpus=[0, 1], interval_s=0.1)
    with sampler.window():
        run_the_cell()
    sampler.write_csv(cell_dir / "telemetry.csv")
    energy = sampler.summarize(output_tokens)  # EnergySummary; .summary_fields() for the cell summary

Without NVML or a GPU the sampler is off: `status` says why, `samples` stays empty, no thread starts.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Iterator

from dflash_bench.errors import UserError
from dflash_bench.telemetry.energy import EnergySummary, summarize
from dflash_bench.telemetry import nvml
from dflash_bench.telemetry.nvml import TelemetryStatus
from dflash_bench.store import atomic_write_text
from dflash_bench.store.telemetry_csv import Sample, samples_to_csv

class TelemetrySampler:
    """Samples `gpus` (physical NVML indices; None: every GPU) every `interval_s` in a daemon thread.

    A sample of every GPU is taken synchronously at `start()` and at `stop()`, so the samples bracket the
    window exactly; the thread fills in between on a fixed schedule (late ticks are skipped, not bunched).
    One sampler can measure several windows in turn; each `start()` clears the previous samples.
    """

    def __init__(self, gpus: list[int] | None = None, interval_s: float = 0.1):
        if interval_s <= 0:
            raise UserError(f"the telemetry interval must be positive, not {interval_s} s.")
        self.interval_s = interval_s
        self.status: TelemetryStatus = nvml.probe(gpus)
        self._samples: list[Sample] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._reader: nvml.Reader | None = None
        self._t0 = 0.0
        self.window_s: float | None = None  # length of the last finished window
        self.cpu_s: float = 0.0  # CPU time the sampling thread used in the last window
        self.error: str | None = None  # set if sampling broke off mid-window

    @property
    def enabled(self) -> bool:
        return self.status.enabled

    @property
    def samples(self) -> list[Sample]:
        return list(self._samples)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("telemetry sampler already running")
        self._samples, self.window_s, self.cpu_s, self.error = [], None, 0.0, None
        if not self.enabled:
            return
        why = nvml.init()
        if why:  # the driver went away since the probe
            self.status = TelemetryStatus(False, why)
            return
        try:
            self._reader = nvml.Reader(self.status.gpus)
            self._stop.clear()
            self._t0 = time.perf_counter()
            self._samples.extend(self._reader.read(self._t0))
        except Exception as err:  # noqa: BLE001 - a GPU that vanished must not break the cell
            self.status = TelemetryStatus(False, f"NVML failed on the assigned GPUs ({err})")
            self._reader, self._samples = None, []
            nvml.shutdown()
            return
        self._thread = threading.Thread(target=self._run, name="dflash-telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        assert self._reader is not None  # start() opened it before the thread
        try:
            self._samples.extend(self._reader.read(self._t0))
        except Exception as err:  # noqa: BLE001 - the missing edge shows as a gap
            self.error = self.error or f"telemetry's last sample failed: {err}"
        finally:
            self.window_s = time.perf_counter() - self._t0
            self._reader = None
            nvml.shutdown()

    @contextlib.contextmanager
    def window(self) -> Iterator[TelemetrySampler]:
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def _run(self) -> None:
        cpu0 = time.thread_time()
        next_t = self._t0 + self.interval_s
        reader = self._reader
        assert reader is not None  # start() opens it before the thread
        try:
            while not self._stop.wait(max(0.0, next_t - time.perf_counter())):
                self._samples.extend(reader.read(self._t0))
                next_t += self.interval_s
                now = time.perf_counter()
                if now > next_t:  # fell behind (a stall): resume the schedule from now
                    next_t = now + self.interval_s
        except Exception as err:  # noqa: BLE001 - the cell goes on; the gap shows in the energy's validity
            self.error = f"telemetry sampling stopped: {err}"
        finally:
            self.cpu_s = time.thread_time() - cpu0

    def summarize(self, output_tokens: int) -> EnergySummary:
        """Energy and J per output token of the last window (an 'off' summary when telemetry was off)."""
        e = summarize(self._samples, output_tokens, interval_s=self.interval_s, window_s=self.window_s,
                      off_reason=None if self.enabled else self.status.reason)
        if self.error:
            e.reason = "; ".join(r for r in (e.reason, self.error) if r)
        return e

    def write_csv(self, path: Path) -> None:
        """Write the last window's samples to `path` atomically (an empty table when telemetry was off)."""
        write_csv(path, self._samples)


def write_csv(path: Path, samples: list[Sample]) -> None:
    atomic_write_text(Path(path), samples_to_csv(samples))
