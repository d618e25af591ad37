"""The report's quality table: one row per cell of a speculative mode (DFlash, EAGLE-3) of the plan (engine, mode,
suite, concurrency, ...), its repeats folded: the lossless check and each side's accuracy pooled over them (counts summed, the Wilson interval of the
pooled counts), AR − DFlash per repeat (its paired interval needs each repeat's prompts). What is still to run is
a `todo` of the row, said once above the table, not in every cell."""

from __future__ import annotations

import functools
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dflash_bench.store import CellSummary

# what a row's empty cells wait for (the page says each once, with the folder's command)
TODO_LOSSLESS = "lossless"  # the lossless check never ran
TODO_QUALITY = "quality"  # answer suites: `dflash-bench quality`
TODO_CODE = "score-code"  # code suites: `dflash-bench quality --score-code`
TODO_NONE = "no-answers"  # suites without reference answers: nothing can score them
EMPTY = "–"


def quality_table(path: Path, summaries: list[CellSummary] | None = None) -> list[dict[str, Any]]:
    """One display row per speculative cell that the quality checks annotated (quality.check.quality_rows: of the
    folder's `summaries`, where read already), its repeats folded."""
    from dflash_bench.quality.check import quality_rows
    from dflash_bench.store.cells import CellKey

    fields = [f for f in CellKey.pair_fields() if f != "repeat"] + ["mode"]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in quality_rows(path, summaries):
        if r.get("lossless") or r.get("accuracy") or r.get("accuracy_ar"):
            groups.setdefault(tuple(r[f] for f in fields), []).append(r)
    return [_folded(rows) for rows in groups.values()]


def _folded(rows: list[dict[str, Any]]) -> dict[str, Any]:
    first = rows[0]
    todo = []
    lossless = [r["lossless"] for r in rows if r.get("lossless")]
    checked = [x for x in lossless if x.get("n")]
    if checked:
        n = sum(x["n"] for x in checked)
        exact = f"{sum(x.get('identical', 0) for x in checked) / n:.1%} of {n}"
        kinds: dict[str, int] = {}
        for x in checked:
            for k, v in (x.get("divergences") or {}).items():
                kinds[k] = kinds.get(k, 0) + v
        divergences = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none"
        p50s = [p for x in checked if (p := (x.get("first_divergence") or {}).get("p50")) is not None]
        first_at = statistics.median(p50s) if p50s else None
    else:
        exact = lossless[0].get("status", EMPTY) if lossless else EMPTY
        divergences, first_at = EMPTY, None
        if not lossless:
            todo.append(TODO_LOSSLESS)
    unscored = _unscored(first["suite"])
    acc_ar = _pooled([r.get("accuracy_ar") for r in rows])
    acc_dflash = _pooled([r.get("accuracy") for r in rows])
    if acc_ar is None or acc_dflash is None:
        todo.append(unscored)
    return {**{k: first[k] for k in ("engine", "mode", "suite", "concurrency")}, "repeats": len(rows), "exact": exact,
            "divergences": divergences, "first": first_at, "acc_ar": acc_ar or EMPTY, "acc_dflash": acc_dflash or EMPTY,
            "diff": _differences([(r.get("accuracy") or {}).get("vs_ar") for r in rows]), "todo": todo}


@functools.lru_cache(maxsize=None)
def _unscored(suite: str) -> str:
    """What an accuracy cell the checks never filled waits for."""
    import pandas as pd

    from dflash_bench.analysis import base_suite
    from dflash_bench.quality.accuracy import ANSWER_SUITES, CODE_SUITES

    base = str(base_suite(pd.Series([suite])).iloc[0])
    return TODO_QUALITY if base in ANSWER_SUITES else TODO_CODE if base in CODE_SUITES else TODO_NONE


def _pooled(sections: list[dict[str, Any] | None]) -> str | None:
    """The repeats' accuracy pooled: correct / n summed, with the Wilson interval of those counts; a status where
    none was scored; None where the checks never ran."""
    from dflash_bench.quality.intervals import wilson

    given = [x for x in sections if x]
    if not given:
        return None
    scored = [x for x in given if x.get("accuracy") is not None and x.get("n")]
    if not scored:
        return str(given[0].get("status", EMPTY))
    n, correct = sum(x["n"] for x in scored), sum(x.get("correct", 0) for x in scored)
    lo, hi = wilson(correct, n, scored[0].get("level", 0.95))
    return f"{correct / n:.1%} [{lo:.1%}, {hi:.1%}] n={n}"


def _differences(diffs: list[Any]) -> str:
    """AR − DFlash: one repeat's with its paired interval; several repeats' as their range."""
    given = [d for d in diffs if isinstance(d, dict) and d.get("n") and d.get("ar_minus_dflash") is not None]
    if not given:
        return EMPTY
    if len(given) == 1:
        d = given[0]
        return f"{d['ar_minus_dflash']:+.1%} [{d['ci_low']:+.1%}, {d['ci_high']:+.1%}] n={d['n']}"
    values = [d["ar_minus_dflash"] for d in given]
    if max(values) == min(values):
        return f"{values[0]:+.1%} in each of {len(values)} repeats"
    return f"{min(values):+.1%} to {max(values):+.1%} over {len(values)} repeats"


def todo(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """What the table's rows still wait for, each once: (todo, the suites it concerns), in the rows' order."""
    out: dict[str, list[str]] = {}
    for r in rows:
        for t in r.get("todo") or []:
            suites = out.setdefault(t, [])
            if r["suite"] not in suites:
                suites.append(r["suite"])
    return [(t, ", ".join(suites)) for t, suites in out.items()]
