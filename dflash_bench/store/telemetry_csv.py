"""A cell's telemetry.csv: its row (`Sample`, one reading of one GPU), its text (`samples_to_csv`; telemetry/sampler.py
takes the samples and writes the file) and the file read back (`read_csv`): every value a finite number of its
column's type, or a StoreError naming the file, so a report never meets text where a reading should be and a
resume measures the cell again (`SweepDir.damage`)."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from dflash_bench.store.reading import StoreError, holdable, read_text, remedy


@dataclass(slots=True)
class Sample:
    """One reading of one GPU. `t_s` is seconds on the monotonic clock since the window started."""

    t_s: float
    gpu: int  # physical NVML index
    time_unix: float
    power_w: float | None = None  # nvmlDeviceGetPowerUsage (a 1 s average on Ampere and newer)
    power_instant_w: float | None = None  # NVML_FI_DEV_POWER_INSTANT where the driver has it
    energy_mj: int | None = None  # total-energy counter (mJ since the driver loaded)
    gpu_util_pct: int | None = None
    mem_util_pct: int | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    mem_used_mib: float | None = None
    temp_c: int | None = None
    throttle_reasons: int | None = None  # bit mask of nvmlClocksEventReason*


SAMPLE_COLUMNS: list[str] = [f.name for f in fields(Sample)]
INT_COLUMNS = {"gpu", "energy_mj", "gpu_util_pct", "mem_util_pct", "sm_clock_mhz", "mem_clock_mhz", "temp_c", "throttle_reasons"}


def samples_to_csv(samples: list[Sample]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(SAMPLE_COLUMNS)
    for s in samples:
        w.writerow(["" if getattr(s, c) is None else _fmt(getattr(s, c)) for c in SAMPLE_COLUMNS])
    return buf.getvalue()


def _fmt(v: float | int) -> str:
    return str(v) if isinstance(v, int) else f"{v:.6f}".rstrip("0").rstrip(".")


def read_csv(path: Path) -> list[Sample]:
    """Samples back from a telemetry.csv (columns it lacks stay None; unknown columns are ignored); a StoreError
    naming the file when it does not read back as samples (any bytes, a value that is not a finite number)."""
    path = Path(path)
    try:
        rows = list(csv.DictReader(io.StringIO(read_text(path), newline="")))
    except csv.Error:
        raise StoreError(f"{path} is not a telemetry CSV: it is corrupt; {remedy(path)}") from None
    out = []
    for n, row in enumerate(rows, start=2):
        try:
            values: dict[str, Any] = {c: _parse(c, row[c]) for c in SAMPLE_COLUMNS if c in row}
            out.append(Sample(**values))
        except (TypeError, ValueError):
            raise StoreError(f"{path} line {n} is not a telemetry sample: it is corrupt; {remedy(path)}") from None
    return out


def _parse(column: str, text: str | None) -> float | int | None:
    if text is None or text == "":
        return None
    value = int(text) if column in INT_COLUMNS else float(text)  # int() refuses past 4300 digits: a ValueError
    if not holdable(value):
        raise ValueError(f"{column} is {text}")
    return value
