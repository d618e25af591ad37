"""Schema of results.csv: one row per cell, a declared column list, no JSON inside a cell.

The columns follow from CellSummary's schema (never from the data, so every results.csv of one version has
the same header): scalar fields as they are, each Stat as `<metric>_<stat>`, the client's settings as
`settings_<key>` (its steady stream as `settings_steady_<field>`), a steady stream's window as `steady_<field>`, the quality summaries' scalars as `lossless_<field>` and `accuracy_<field>` (the paired
AR difference as `accuracy_vs_ar_<field>`), failure counts as `failures` text ("kind: n; ...", the verify widths alike), the acceptance profile as
"verified/accepted; ..." per position and the
per-position acceptance and a synthetic profile's rates as numbers joined by ';'. Nested details stay in summary.json.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Literal, Optional, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, create_model, field_validator

from dflash_bench.store.reading import StoreError, read_text
from dflash_bench.store.cells import (
    STAT_FIELDS, AccuracySummary, CellSettings, CellSummary, LosslessSummary, PairedDiff, Stat, SteadyPlan, SteadyWindow,
)

LIST_SEP = ";"
LIST_COLUMNS = ("acceptance_per_position", "synthetic_rates")  # numbers joined by LIST_SEP


def _scalar_fields(model: type[BaseModel]) -> dict[str, Any]:
    """Fields of `model` whose type is a scalar (str, int, float, bool, or one of them or None)."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        ann = info.annotation
        args = [a for a in get_args(ann) if a is not type(None)] if get_origin(ann) in (Union, type(int | None)) else [ann]
        if len(args) == 1 and get_origin(args[0]) is Literal:
            out[name] = str
        elif len(args) == 1 and args[0] in (str, int, float, bool):
            out[name] = args[0]
    return out


def _columns() -> dict[str, Any]:
    """Column name -> value type, in results.csv order."""
    cols: dict[str, Any] = {}
    for name in CellSummary.model_fields:
        if name in STAT_FIELDS:
            cols.update({f"{name}_{s}": t for s, t in _scalar_fields(Stat).items()})
        elif name == "settings":
            cols.update({f"settings_{k}": t for k, t in _scalar_fields(CellSettings).items()})
            cols.update({f"settings_steady_{k}": t for k, t in _scalar_fields(SteadyPlan).items()})
        elif name == "steady":
            cols.update({f"steady_{k}": t for k, t in _scalar_fields(SteadyWindow).items()})
        elif name == "lossless":
            cols.update({f"lossless_{k}": t for k, t in _scalar_fields(LosslessSummary).items()})
        elif name == "accuracy":
            cols.update({f"accuracy_{k}": t for k, t in _scalar_fields(AccuracySummary).items()})
            cols.update({f"accuracy_vs_ar_{k}": t for k, t in _scalar_fields(PairedDiff).items()})
        elif name in ("failures", "not_measured", "verify_widths", "acceptance_profile"):  # text, never JSON
            cols[name] = str
        elif name in LIST_COLUMNS:
            cols[name] = list[float]
        else:
            scalar = _scalar_fields(CellSummary).get(name)
            assert scalar is not None, f"CellSummary.{name} needs a results.csv column rule"
            cols[name] = scalar
    return cols


COLUMNS: dict[str, Any] = _columns()
RESULTS_COLUMNS: tuple[str, ...] = tuple(COLUMNS)


class _RowBase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _blank_is_none(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator(*LIST_COLUMNS, mode="before", check_fields=False)
    @classmethod
    def _split(cls, value: Any) -> Any:
        return [float(x) for x in value.split(LIST_SEP)] if isinstance(value, str) and value else value or None


ResultsRow: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "ResultsRow", __base__=_RowBase, __doc__="One results.csv row (one cell); every column may be empty.",
    **{name: (Optional[t], None) for name, t in COLUMNS.items()},
)


def results_row(summary: CellSummary) -> dict[str, Any]:
    """A cell's results.csv row as typed values (lists stay lists): every column, None where empty."""
    data = summary.model_dump()
    sections = {prefix: _section(data, prefix) for prefix in _PREFIXES}
    row: dict[str, Any] = {}
    for col, where in _WHERE.items():
        if where is None:
            row[col] = _value(data, col)
        else:
            part = sections[where[0]]
            row[col] = part.get(where[1]) if isinstance(part, dict) else None
    return row


_PREFIXES = (*STAT_FIELDS, "settings_steady", "settings", "steady", "accuracy_vs_ar", "lossless", "accuracy")


def _where(col: str) -> tuple[str, str] | None:
    """(section, key) of a column read from a nested section of the summary; None for a top-level one. The longest
    prefix names it (ttft_ms_later_turns_p50 is ttft_ms_later_turns' p50, not ttft_ms' "later_turns_p50")."""
    for prefix in sorted(_PREFIXES, key=len, reverse=True):
        if col.startswith(prefix + "_") and prefix != col:
            return prefix, col[len(prefix) + 1:]
    return None


_WHERE = {col: _where(col) for col in RESULTS_COLUMNS}  # worked out once: a report reads thousands of rows


def _value(data: dict[str, Any], col: str) -> Any:
    if col in ("failures", "not_measured", "verify_widths"):
        return "; ".join(f"{k}: {v}" for k, v in (data[col] or {}).items()) or None
    if col == "acceptance_profile":  # per position "verified/accepted"
        return "; ".join(f"{v}/{a}" for v, a in data[col] or ()) or None
    return data.get(col)


def _section(data: dict[str, Any], prefix: str) -> Any:
    if prefix == "accuracy_vs_ar":
        return (data.get("accuracy") or {}).get("vs_ar")
    if prefix == "settings_steady":
        return (data.get("settings") or {}).get("steady")
    return data.get(prefix)


def csv_text(summaries: list[CellSummary]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=RESULTS_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for s in summaries:
        row = results_row(s)
        for col in LIST_COLUMNS:
            values = row[col]
            row[col] = LIST_SEP.join(repr(float(x)) for x in values) if values else None
        writer.writerow(row)
    return buf.getvalue()


def read_results_csv(path: Path) -> list[BaseModel]:
    """The typed rows of a results.csv (what a CI job reads without the sweep folder)."""
    try:
        return [ResultsRow.model_validate(r) for r in csv.DictReader(io.StringIO(read_text(path), newline=""))]
    except (csv.Error, ValueError) as err:  # pydantic's ValidationError is a ValueError
        raise StoreError(f"{path} is not a results.csv of this version ({str(err).splitlines()[0][:120]})") from None
