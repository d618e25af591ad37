"""The gate's inputs: a sweep's cells grouped by CellKey less the repeat (the repeats are the samples), and the
small baseline file `dflash-bench gate --export-baseline` writes from them.

Sweep folders are read through the store only, as typed CellSummary objects. Baseline files of version 1
(untyped provenance) are read as version 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dflash_bench.errors import UserError
from dflash_bench.store.reading import StoreError, parse_json, read_text
from dflash_bench.store import (
    MEASURED, SPECULATIVE, CellKey, CellSummary, Hardware, MachineSpeed, Models, SweepDir, SweepSettings, atomic_write_json, now_iso,
)

BASELINE_KIND: Literal["dflash-bench-baseline"] = "dflash-bench-baseline"
BASELINE_VERSION = 2  # 2: typed provenance; cells carry their CellKey (repeat 0, cell_id)
OLDEST_BASELINE = 1


class CellValues(CellKey):
    """One cell of a sweep with its repeats folded in: its metrics per completed repeat, and the repeats
    that failed. Its key has repeat 0."""

    model_config = ConfigDict(frozen=False)

    repeats: list[int] = Field(default_factory=list)  # repeats that completed, in order
    metrics: dict[str, list[float]] = Field(default_factory=dict)  # per completed repeat that measured it
    failed: dict[str, str] = Field(default_factory=dict)  # cell id -> failure reason
    # cell id -> why a complete speculative cell shows no sign of speculation (CellSummary.dflash_warning)
    no_speculation: dict[str, str] = Field(default_factory=dict)
    # cell id -> (share of its measured requests that failed, why) of a partial cell (its repeats are in `repeats`)
    partial: dict[str, tuple[float, str]] = Field(default_factory=dict)
    # a speculative cell: how the verify width was chosen (CellSummary.width_policy; None: the engine's own fixed way, or a cell
    # written before it was recorded), the acceptance profile of each repeat that has one, and the widths used:
    # what tells which cells' tau compare (gate/tau.py)
    width_policy: str | None = None
    profiles: list[list[tuple[int, int]]] = Field(default_factory=list)
    widths: list[int] = Field(default_factory=list)  # the verify widths its repeats' steps used (CellSummary.verify_widths)
    # the run-to-run noise of each metric: the relative standard deviation of its mean over `noise_runs` runs of
    # the same code (`gate --export-baseline --noise-from`, gate/noise.py); it widens that metric's threshold
    noise: dict[str, float] = Field(default_factory=dict)
    noise_runs: int = 0


class Provenance(BaseModel):
    """Where the baseline's numbers come from: the sweep manifest's sections."""

    models: Models = Field(default_factory=Models)
    hardware: Hardware = Field(default_factory=Hardware)
    settings: SweepSettings | None = None
    machine_speed: MachineSpeed | None = None  # the run's speed probes (None: a run or baseline from before them)

    def section(self, name: str) -> dict[str, Any]:
        value = getattr(self, name)
        return value.model_dump(exclude_none=True) if value is not None else {}


class Baseline(BaseModel):
    """What `--export-baseline` writes: small enough to commit, enough to bootstrap against."""

    kind: Literal["dflash-bench-baseline"] = BASELINE_KIND
    schema_version: int = BASELINE_VERSION
    created_at: str = Field(default_factory=now_iso)
    sweep_id: str
    provenance: Provenance = Field(default_factory=Provenance)
    cells: list[CellValues] = Field(default_factory=list)


GATED = ("output_throughput", "tpot_ms_p50", "acceptance_length", "exact_match_rate", "accuracy")


def gated_values(s: CellSummary) -> dict[str, float | None]:
    """The gated metrics of one complete cell (speedup, a pair's, is added by `collect`)."""
    return {
        "output_throughput": s.output_throughput,
        "tpot_ms_p50": s.tpot_ms.p50 if s.tpot_ms else None,
        "acceptance_length": s.acceptance_length,
        "exact_match_rate": s.lossless.exact_match_rate if s.lossless else None,
        "accuracy": s.accuracy.accuracy if s.accuracy else None,
        # not gated one by one: what the SLO read-off (gate/slo.py) needs of each cell
        "tok_s_user_p50": s.tok_s_user.p50 if s.tok_s_user else None,
        "ttft_ms_p90": s.ttft_ms.p90 if s.ttft_ms else None,
        "tpot_ms_p90": s.tpot_ms.p90 if s.tpot_ms else None,
        # nor these: what makes two engines' tau comparable (gate/reference.py)
        "acceptance_definition": s.acceptance_definition,
        "synthetic_acceptance": s.synthetic_acceptance,
    }


def collect(sweep_dir: Path | str, quiet: bool = False, summaries: list[CellSummary] | None = None) -> Baseline:
    """A sweep folder's cells, grouped by key, as the gate compares them (`quiet`: no migration note, which the
    caller has already printed; `summaries`: the folder's, where the caller has read them already)."""
    sweep = SweepDir.open(Path(sweep_dir))
    manifest = sweep.read_manifest()
    summaries = sorted(sweep.summaries() if summaries is None else summaries, key=lambda s: (s.repeat, s.cell_id))
    if sweep.migration_note and not quiet:
        print(sweep.migration_note, file=sys.stderr)
    out: dict[CellKey, CellValues] = {}
    for s in summaries:
        cell = out.setdefault(s.sample_of(), CellValues(**s.sample_of().model_dump()))
        if s.status == "partial":
            cell.partial[s.cell_id] = (s.num_failed / s.num_requests if s.num_requests else 1.0,
                                       _short(s.failure_reason or "some requests failed"))
        elif s.status != "complete":
            reason = s.failure_reason if s.failure_reason and s.failure_reason.strip() else "failed"
            cell.failed[s.cell_id] = _short(reason)
            continue
        cell.repeats.append(s.repeat)
        if s.mode in SPECULATIVE:
            add_profile(cell, s)
            if s.dflash_warning:
                cell.no_speculation[s.cell_id] = s.dflash_warning
        for name, value in gated_values(s).items():
            if _number(value):
                cell.metrics.setdefault(name, []).append(float(value))  # type: ignore[arg-type]
    _add_speedups(summaries, out)
    provenance = Provenance(models=manifest.models, hardware=manifest.hardware, settings=manifest.settings,
                            machine_speed=manifest.machine_speed)
    return Baseline(sweep_id=manifest.sweep_id, provenance=provenance,
                    cells=[out[k] for k in sorted(out, key=CellKey.sort_key)])


def _add_speedups(summaries: list[CellSummary], out: dict[CellKey, CellValues]) -> None:
    """A speculative mode's (DFlash's, EAGLE-3's) output throughput over its AR partner's, for each complete pair, on
    the speculative cell, in repeat order."""
    done = [s for s in summaries if s.status in MEASURED]
    ar = {s.pair_key(): s for s in done if s.mode == "ar"}
    for df in sorted((s for s in done if s.mode in SPECULATIVE), key=lambda s: s.repeat):
        partner = ar.get(df.pair_key())
        a, d = (partner.output_throughput if partner else None), df.output_throughput
        if _number(a) and _number(d) and a:
            out[df.sample_of()].metrics.setdefault("speedup", []).append(float(d) / float(a))  # type: ignore[arg-type]


def exportable(sweep_dir: Path | str) -> Baseline:
    """A sweep's cells as a baseline to export (a UserError when none completed)."""
    baseline = collect(sweep_dir)
    if not any(c.repeats for c in baseline.cells):
        raise UserError(f"{sweep_dir} has no complete cell: there is nothing to export as a baseline")
    return baseline


def export_baseline(sweep_dir: Path | str, output: Path | str) -> Baseline:
    """Write the small baseline file of a sweep (atomically) and return it."""
    baseline = exportable(sweep_dir)
    atomic_write_json(Path(output), baseline)
    return baseline


def load_baseline(path: Path | str) -> Baseline:
    """A baseline from a sweep folder or from a file written by `--export-baseline` (version 1 or 2)."""
    path = Path(path)
    if path.is_dir():
        return collect(path)
    hint = "give a sweep folder or a file written by `dflash-bench gate --export-baseline`"
    if not path.exists():
        raise UserError(f"baseline {path} does not exist; {hint}")
    try:
        data = parse_json(read_text(path, follow_links=True))
    except StoreError as err:  # unreadable, or bytes that are not UTF-8
        raise UserError(f"baseline {err}") from None
    except ValueError as err:  # JSON that parses yet holds what no export writes (huge numbers, lone surrogates)
        raise UserError(f"baseline {path} {err} (corrupt or truncated); {hint}") from None
    if not isinstance(data, dict) or data.get("kind") != BASELINE_KIND:
        raise UserError(f"{path} is not a dflash-bench baseline file; {hint}")
    if data.get("schema_version") == OLDEST_BASELINE:
        print(f"note: baseline {path} has schema version 1; read as version {BASELINE_VERSION} (the file is unchanged)",
              file=sys.stderr)
        data = baseline_v1(data)
    if data.get("schema_version") != BASELINE_VERSION:
        raise UserError(f"baseline {path} has schema version {data.get('schema_version')}; this dflash-bench "
                        f"reads versions {OLDEST_BASELINE} to {BASELINE_VERSION}: export it again")
    try:
        return Baseline.model_validate(data)
    except ValidationError as err:
        e = err.errors()[0]
        loc = ".".join(str(x) for x in e.get("loc", ()))
        raise UserError(f"baseline {path} is corrupt ({loc}: {e.get('msg')}); {hint}") from None


def baseline_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A v1 baseline's JSON as v2's: provenance sections were the manifest's dicts (settings `{}` for none)."""
    prov = dict(data.get("provenance") or {})
    prov["settings"] = prov.get("settings") or None
    prov["hardware"] = prov.get("hardware") or {}
    prov["models"] = prov.get("models") or {}
    return dict(data, schema_version=BASELINE_VERSION, provenance=prov)


def add_profile(cell: CellValues, s: CellSummary) -> None:
    """A speculative repeat's (DFlash's, EAGLE-3's) width policy, acceptance profile and the verify widths it used
    into its cell: what tells whether its τ compares with the baseline's (gate/tau.py)."""
    if len(cell.repeats) == 1:
        cell.width_policy = s.width_policy
    elif cell.width_policy != s.width_policy:
        cell.width_policy = ",".join(sorted({*(cell.width_policy or "none").split(","), s.width_policy or "none"}))
    if s.acceptance_profile:
        cell.profiles.append(list(s.acceptance_profile))
    cell.widths = sorted({*cell.widths, *(w for w, n in (s.verify_widths or {}).items() if n > 0)})


def _short(reason: str) -> str:
    return reason if len(reason) <= 300 else reason[:297] + "..."


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and bool(np.isfinite(value))
