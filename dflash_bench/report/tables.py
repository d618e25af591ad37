"""What the report's per-sweep section shows, as plain data: the headline matrix, the best and worst cells, the
acceptance and DFlash-against-EAGLE-3 tables, the side-by-side statistics of AR and each speculative mode, energy,
and several sweeps' speedups side by side; each from one `SweepView` (views.py).

Nothing here formats HTML (page.py does, with autoescape) or draws (figures.py does).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from dflash_bench import analysis, profiles
from dflash_bench.errors import UserError
from dflash_bench.report.views import SweepView, in_order
from dflash_bench.store import SPECULATIVE, mode_name

SIDES = ("ar", *SPECULATIVE)  # the modes a row of stat_table sets side by side


def best_and_worst(headline: pd.DataFrame) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """Per speculative mode (DFlash, EAGLE-3: never one against the other), the cell of the highest speedup and, where
    there is another, of the lowest."""
    out = []
    for _, rows in _by_mode(headline.dropna(subset=["speedup"]) if not headline.empty else headline):
        best = rows.loc[rows["speedup"].idxmax()].to_dict()
        worst = rows.loc[rows["speedup"].idxmin()].to_dict()
        out.append((best | {"mode_name": mode_name(best["mode"])}, (worst | {"mode_name": mode_name(worst["mode"])})
                    if len(rows) > 1 else None))
    return out


def _by_mode(table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """A table's rows per speculative mode, in SPECULATIVE's order."""
    if table.empty:
        return []
    return [(m, table[table["mode"] == m]) for m in SPECULATIVE if (table["mode"] == m).any()]


def headline_matrix(headline: pd.DataFrame) -> tuple[list[int], list[dict[str, Any]]]:
    """The model card's layout: one row per engine x speculative mode x suite, one column per concurrency; each
    mode's best and worst cell marked among its own."""
    if headline.empty:
        return [], []
    concs = sorted(int(c) for c in headline["concurrency"].unique())
    marks = {(b["engine"], b["mode"], b["suite"], b["concurrency"]): "best" for b, _ in best_and_worst(headline)}
    marks |= {(w["engine"], w["mode"], w["suite"], w["concurrency"]): "worst" for _, w in best_and_worst(headline) if w}
    rows = []
    for (engine, mode, suite), group in headline.groupby(["engine", "mode", "suite"], sort=False):
        cells: list[dict[str, Any] | None] = []
        by_c: dict[int, dict[str, Any]] = {}
        for r in group.to_dict("records"):
            by_c.setdefault(int(r["concurrency"]), r)
        for c in concs:
            if c not in by_c:
                cells.append(None)
                continue
            r = by_c[c]
            mark = marks.get((engine, mode, suite, r["concurrency"]))
            r["best"], r["worst"] = mark == "best", mark == "worst"
            cells.append(r)
        rows.append({"engine": engine, "mode": mode, "mode_name": mode_name(mode), "suite": suite, "cells": cells})
    return concs, rows


def comparison(views: list[SweepView]) -> tuple[list[str], list[dict[str, Any]]]:
    """Speedup and tau of several sweeps side by side: one row per engine-free suite x concurrency x speculative
    mode."""
    labels = [v.label for v in views]
    keys: list[tuple[str, int, str]] = []
    per: list[dict[tuple[str, int, str], dict[str, Any]]] = []
    for v in views:
        d: dict[tuple[str, int, str], dict[str, Any]] = {}
        for r in v.headline.to_dict("records"):
            k = (str(r["suite"]), int(r["concurrency"]), str(r["mode"]))
            d[k] = {"speedup": r["speedup"], "tau": r["tau"], "engine": r["engine"]}
            if k not in keys:
                keys.append(k)
        per.append(d)
    first = {s: i for i, s in reversed(list(enumerate(k[0] for k in keys)))}
    order = {m: i for i, m in enumerate(SPECULATIVE)}
    keys.sort(key=lambda k: (first[k[0]], k[1], order.get(k[2], len(order))))
    rows = [{"suite": s, "concurrency": c, "mode_name": mode_name(m), "cells": [d.get((s, c, m)) for d in per]}
            for s, c, m in keys]
    return labels, rows


def tau_matrix(view: SweepView) -> tuple[list[int], list[dict[str, Any]]]:
    """Acceptance length per engine x speculative mode x suite (rows) and concurrency (columns)."""
    done = view.done
    if done.empty or "acceptance_length" not in done.columns:
        return [], []
    df = done[done["mode"].isin(SPECULATIVE) & done["acceptance_length"].notna()]
    if df.empty:
        return [], []
    concs = sorted(int(c) for c in df["concurrency"].unique())
    rows = []
    for (engine, mode, suite), group in df.groupby(["engine", "mode", "suite"], sort=False):
        by_c = {int(r["concurrency"]): r for r in group.to_dict("records")}
        rows.append({"engine": engine, "mode": mode, "mode_name": mode_name(mode), "suite": suite,
                     "cells": [by_c.get(c) for c in concs]})
    return concs, rows


def versus_rows(view: SweepView) -> list[dict[str, Any]]:
    """DFlash against each other speculative mode (analysis.versus) per engine, suite and concurrency where both ran."""
    table = analysis.versus(view.frame) if not view.frame.empty else view.frame
    if table.empty:
        return []
    out = in_order(table, view.suite_rank).to_dict("records")
    for r in out:
        r["mode_name"] = mode_name(r["mode"])
        r["concurrency"] = int(r["concurrency"])
    return out


def energy_rows(view: SweepView) -> list[dict[str, Any]]:
    """AR and DFlash energy per token side by side. A cell whose energy is invalid (too short for its source, a
    gap) shows no J/token but why; a pair whose cells read different sources (NVML's counter, integrated power)
    shows no ratio (`ratio_note` says why): the two disagree by tens of percent on short windows."""
    rows = stat_table(view, ["j_per_token", "avg_power_w", "energy_source", "energy_valid", "energy_note"])
    for r in rows:
        for mode in SIDES:
            valid = r.get(f"energy_valid_{mode}")
            if _present(valid) and valid in (False, "False", "false"):
                r[f"j_per_token_{mode}"] = None
                r[f"invalid_{mode}"] = r.get(f"energy_note_{mode}") or "energy not valid"
        sources = {r.get(f"energy_source_{m}") for m in ("ar", "dflash")}
        if len(sources) > 1 and None not in sources and all(_present(r.get(f"j_per_token_{m}")) for m in ("ar", "dflash")):
            r["ratio_note"] = (f"no ratio: AR energy from the {r['energy_source_ar']} source, DFlash from the "
                               f"{r['energy_source_dflash']} one")
    return rows


def _present(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def tau_counting(view: SweepView) -> list[tuple[str, str]]:
    """(engine, how its counters differ from metrics/definitions.py's tau) for the sweep's engines that differ."""
    out = []
    for engine in sorted(set(view.done["engine"])) if not view.done.empty else []:
        try:
            note = profiles.get(engine).tau_counting
        except UserError:  # an engine this version does not know: nothing to say about it
            continue
        if note:
            out.append((engine, note))
    return out


def stat_table(view: SweepView, metrics: list[str]) -> list[dict[str, Any]]:
    """AR and each speculative mode side by side per engine x suite x concurrency, for the given flattened columns
    (`<metric>_ar`, `<metric>_dflash`, `<metric>_eagle3`)."""
    done = view.done
    if done.empty:
        return []
    key = ["engine", "suite", "concurrency"]
    groups = done[key].drop_duplicates()  # in done's order
    for mode in SIDES:
        side = done[done["mode"] == mode].drop_duplicates(key)
        cols = {m: f"{m}_{mode}" for m in metrics if m in side.columns}
        groups = groups.merge(side[key + list(cols)].rename(columns=cols), on=key, how="left")
        for m in metrics:
            if f"{m}_{mode}" not in groups.columns:
                groups[f"{m}_{mode}"] = None
    out = groups.astype(object).where(groups.notna(), None).to_dict("records")
    for row in out:
        row["concurrency"] = int(row["concurrency"])
    return out


def later_turns(view: SweepView) -> list[dict[str, Any]]:
    """stat_table's rows of TTFT p50 over every request and over the second and later turns alone, for the cells of
    multi-turn suites (any mode with `ttft_ms_later_turns`); empty where the sweep has none."""
    rows = stat_table(view, ["ttft_ms_p50", "ttft_ms_later_turns_p50"])  # a column no cell has comes back None
    return [r for r in rows if any(r[f"ttft_ms_later_turns_p50_{m}"] is not None for m in SIDES)]
