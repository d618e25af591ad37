"""The gate's inputs: a sweep's cells grouped by (engine, mode, suite, concurrency), and the small baseline
file `dflash-bench gate --export-baseline` writes from them. Sweep folders are read through store.py and
analysis.py only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from dflash_bench.errors import UserError
from dflash_bench.store import SweepDir, atomic_write_json, now_iso

BASELINE_KIND = "dflash-bench-baseline"
BASELINE_VERSION = 1

Key = tuple[str, str, str, int]  # engine, mode, suite, concurrency


class CellValues(BaseModel):
    """One cell key of a sweep: its metrics per completed repeat, and the repeats that failed."""

    engine: str
    mode: str
    suite: str
    concurrency: int
    repeats: list[int] = Field(default_factory=list)  # repeats that completed, in order
    metrics: dict[str, list[float]] = Field(default_factory=dict)  # per completed repeat that measured it
    failed: dict[str, str] = Field(default_factory=dict)  # cell id -> failure reason

    @property
    def key(self) -> Key:
        return (self.engine, self.mode, self.suite, self.concurrency)


class Baseline(BaseModel):
    """What `--export-baseline` writes: small enough to commit, enough to bootstrap against."""

    kind: Literal["dflash-bench-baseline"] = BASELINE_KIND
    schema_version: int = BASELINE_VERSION
    created_at: str = Field(default_factory=now_iso)
    sweep_id: str
    provenance: dict[str, Any] = Field(default_factory=dict)  # models, hardware, settings of the sweep
    cells: list[CellValues] = Field(default_factory=list)


def cell_name(key: Key) -> str:
    engine, mode, suite, concurrency = key
    return f"{engine}/{mode}/{suite}/c{concurrency}"


def collect(sweep_dir: Path | str) -> Baseline:
    """A sweep folder's cells, grouped by key, as the gate compares them."""
    from dflash_bench import analysis  # pandas: only when a sweep is read

    sweep = SweepDir.open(Path(sweep_dir))
    manifest = sweep.read_manifest()
    frame = analysis.cells(sweep.path).sort_values(["repeat", "cell_id"], kind="stable")
    out: dict[Key, CellValues] = {}
    for row in frame.to_dict("records"):
        key: Key = (str(row["engine"]), str(row["mode"]), str(row["suite"]), int(row["concurrency"]))
        cell = out.setdefault(key, CellValues(engine=key[0], mode=key[1], suite=key[2], concurrency=key[3]))
        if row["status"] != "complete":
            reason = row.get("failure_reason")
            reason = reason if isinstance(reason, str) and reason.strip() else "failed"
            cell.failed[str(row["cell_id"])] = reason if len(reason) <= 300 else reason[:297] + "..."
            continue
        cell.repeats.append(int(row["repeat"]))
        values = {m: row.get(m) for m in ("output_throughput", "tpot_ms_p50", "acceptance_length")}
        extra = _extra(row.get("extra"))
        values["exact_match_rate"] = _nested(extra, "lossless", "exact_match_rate")
        values["accuracy"] = _nested(extra, "accuracy", "accuracy")
        for name, value in values.items():
            if _number(value):
                cell.metrics.setdefault(name, []).append(float(value))
    pairs = analysis.pairs(frame)
    if "speedup" in pairs.columns:
        for row in pairs.sort_values("repeat", kind="stable").to_dict("records"):
            key = (str(row["engine"]), "dflash", str(row["suite"]), int(row["concurrency"]))
            if key in out and _number(row["speedup"]):
                out[key].metrics.setdefault("speedup", []).append(float(row["speedup"]))
    provenance = {"models": manifest.models, "hardware": manifest.hardware, "settings": manifest.settings}
    return Baseline(sweep_id=manifest.sweep_id, provenance=provenance, cells=[out[k] for k in sorted(out)])


def export_baseline(sweep_dir: Path | str, output: Path | str) -> Baseline:
    """Write the small baseline file of a sweep (atomically) and return it."""
    baseline = collect(sweep_dir)
    if not any(c.repeats for c in baseline.cells):
        raise UserError(f"{sweep_dir} has no complete cell: there is nothing to export as a baseline")
    atomic_write_json(Path(output), baseline)
    return baseline


def load_baseline(path: Path | str) -> Baseline:
    """A baseline from a sweep folder or from a file written by `--export-baseline`."""
    path = Path(path)
    if path.is_dir():
        return collect(path)
    hint = "give a sweep folder or a file written by `dflash-bench gate --export-baseline`"
    if not path.exists():
        raise UserError(f"baseline {path} does not exist; {hint}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"baseline {path} is not valid JSON (corrupt or truncated); {hint}") from None
    except OSError as err:
        raise UserError(f"cannot read baseline {path}: {err.strerror}") from None
    if not isinstance(data, dict) or data.get("kind") != BASELINE_KIND:
        raise UserError(f"{path} is not a dflash-bench baseline file; {hint}")
    if data.get("schema_version") != BASELINE_VERSION:
        raise UserError(f"baseline {path} has schema version {data.get('schema_version')}; this dflash-bench "
                        f"reads version {BASELINE_VERSION}: export it again")
    try:
        return Baseline.model_validate(data)
    except ValidationError as err:
        e = err.errors()[0]
        loc = ".".join(str(x) for x in e.get("loc", ()))
        raise UserError(f"baseline {path} is corrupt ({loc}: {e.get('msg')}); {hint}") from None


def _extra(text: Any) -> dict[str, Any]:
    """A results row's `extra` (JSON text there): what later issues add, such as lossless and accuracy."""
    if not text or not isinstance(text, str):
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _nested(extra: dict[str, Any], section: str, name: str) -> float | None:
    """`extra[section][name]` when the sweep measured it (`extra.lossless.exact_match_rate`, ...)."""
    part = extra.get(section)
    value = part.get(name) if isinstance(part, dict) else None
    return value if _number(value) else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and bool(np.isfinite(value))
