"""A cell's telemetry.csv read back (telemetry/sampler.py writes it): every value a finite number of its column's
type, or a StoreError naming the file, so a report never meets text where a reading should be and a resume
measures the cell again (`SweepDir.damage`)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from dflash_bench.store.reading import StoreError, holdable, read_text, remedy
from dflash_bench.telemetry.nvml import INT_COLUMNS, SAMPLE_COLUMNS, Sample


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
