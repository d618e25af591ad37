"""`dflash-bench quality SWEEP_DIR`: run the lossless check and the accuracy scoring on a sweep folder,
write them into it, and print one row per speculative cell (DFlash, EAGLE-3) and its AR partner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dflash_bench.quality.lossless import NEAR_TIE_NATS
from dflash_bench.store import MEASURED, SPECULATIVE, CellSummary, SweepDir


def check_sweep(sweep_dir: Path | str, data_dir: Path | str | None = None, score_code: bool = False,
                near_tie: float = NEAR_TIE_NATS, timeout_s: float = 20.0, workers: int = 2,
                show: bool = True) -> list[dict[str, Any]]:
    """Lossless check, then accuracy (code suites only with score_code), under the folder's writer's lock; returns
    `quality_rows`."""
    from dflash_bench.quality.accuracy import score_sweep
    from dflash_bench.quality.lossless import annotate_sweep
    from dflash_bench.quality.sandbox import Limits

    from dflash_bench.store.lock import writing

    with writing(Path(sweep_dir)):  # summaries, results.csv and the verdicts: one writer at a time
        annotate_sweep(sweep_dir, near_tie)
        score_sweep(sweep_dir, data_dir, score_code, Limits(timeout_s=timeout_s, cpu_s=max(1, int(timeout_s))), workers)
    rows = quality_rows(sweep_dir)
    if show:
        print_rows(rows)
    return rows


def quality_rows(sweep_dir: Path | str, summaries: list[CellSummary] | None = None) -> list[dict[str, Any]]:
    """One dict per cell of a speculative mode (DFlash, EAGLE-3) with what the checks wrote: the key, its `mode`,
    `lossless`, `accuracy` (its own, with `vs_ar`) and `accuracy_ar` (its AR partner's). Reads only the folder (or its `summaries`, as read already);
    for the report and the gate."""
    if summaries is None:
        summaries = SweepDir.open(Path(sweep_dir)).summaries()
    summaries = [s for s in summaries if s.status in MEASURED]
    ar = {s.pair_key(): s for s in summaries if s.mode == "ar"}
    rows = []
    for s in summaries:
        if s.mode not in SPECULATIVE:
            continue
        partner = ar.get(s.pair_key())
        rows.append({**{k: getattr(s, k) for k in s.pair_fields()}, "mode": s.mode, "cell_id": s.cell_id,
                     "lossless": _dump(s.lossless), "accuracy": _dump(s.accuracy),
                     "accuracy_ar": _dump(partner.accuracy) if partner else None})
    return rows


def _dump(section: Any) -> dict[str, Any] | None:
    return section.model_dump() if section is not None else None


def print_rows(rows: list[dict[str, Any]]) -> None:
    from dflash_bench.console import new_console
    from rich.table import Table
    from rich.text import Text

    table = Table(title="Each speculative mode vs AR: lossless at temperature 0, and task accuracy (95% intervals)")
    for col in ("engine", "mode", "suite", "c", "r", "exact match", "divergences", "first at (p50)", "AR acc", "mode acc",
                "AR - mode"):
        table.add_column(col, overflow="fold")
    for r in rows:
        cells = (r["engine"], r["mode"], r["suite"], str(r["concurrency"]), str(r["repeat"]), *_lossless_cells(r["lossless"]),
                 _acc(r["accuracy_ar"]), _acc(r["accuracy"]), _diff(r["accuracy"]))
        table.add_row(*(Text(str(c)) for c in cells))  # Text: no rich markup in statuses
    new_console().print(table)


def _lossless_cells(x: dict | None) -> tuple[str, str, str]:
    if not x:
        return "-", "", ""
    if not x.get("n"):
        return x.get("status", "-"), "", ""
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(x.get("divergences", {}).items())) or "none"
    return f"{x['exact_match_rate']:.1%} of {x['n']}", kinds, str(x.get("first_divergence", {}).get("p50", ""))


def _acc(x: dict | None) -> str:
    if not x:
        return "-"
    if x.get("accuracy") is None:
        return x.get("status", "-")
    return f"{x['accuracy']:.1%} [{x['ci_low']:.1%}, {x['ci_high']:.1%}] n={x['n']}"


def _diff(x: dict | None) -> str:
    v = (x or {}).get("vs_ar")
    if not v or not v.get("n"):
        return "-"
    return f"{v['ar_minus_dflash']:+.1%} [{v['ci_low']:+.1%}, {v['ci_high']:+.1%}] n={v['n']}"
