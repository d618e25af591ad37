"""Tidy pandas tables from sweep folders: one row per cell, each speculative cell (DFlash, EAGLE-3) beside its AR cell
with its speedup, and DFlash against EAGLE-3.

Everything here reads only the sweep folder (through dflash_bench.store), so it works on a folder copied from
another machine. The report and the gate both start from `cells()` and `pairs()`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from dflash_bench.speedup import speedup_of
from dflash_bench.store import RESULTS_COLUMNS, SPECULATIVE, CellKey, CellSummary, SweepDir, results_row

KEY = CellKey.pair_fields()  # what an AR cell and its speculative cell share: engine, suite, concurrency, repeat


def cells(*sweep_dirs: Path | str) -> pd.DataFrame:
    """One row per cell on disk (complete or failed): the columns of results.csv (store.RESULTS_COLUMNS,
    typed values: per-position acceptance stays a list) plus `sweep`."""
    frames = []
    for path in sweep_dirs:
        sweep = SweepDir.open(Path(path))
        frame = cells_of(sweep.summaries(), sweep.read_manifest().sweep_id)
        if not frame.empty:
            frames.append(frame)
    if not frames:
        return _no_cells()
    return pd.concat(frames, ignore_index=True)


def cells_of(summaries: Iterable[CellSummary], sweep_id: str) -> pd.DataFrame:
    """`cells` of one sweep from its summaries, as read already (the report reads a folder's summaries once)."""
    rows = [results_row(s) for s in summaries]
    if not rows:
        return _no_cells()
    frame = pd.DataFrame(rows, columns=list(RESULTS_COLUMNS))
    # a suite's own prompts (None) as 0: a key column must hold no NaN, or grouping and merging drop the cell
    frame["input_len"] = pd.to_numeric(frame["input_len"]).fillna(0).astype(int)
    frame = _thinking_arms(frame)
    frame.insert(0, "sweep", sweep_id)
    return frame


def _no_cells() -> pd.DataFrame:
    return pd.DataFrame(columns=["sweep", *CellKey.model_fields, "status"])


def _thinking_arms(frame: pd.DataFrame) -> pd.DataFrame:
    """--thinking both: each arm shown as a suite of its own ("gsm8k (thinking on)"), so every table and figure
    keeps the arms apart; the key column becomes "on", "off" or "" (never NaN, which grouping would drop)."""
    arm = frame["thinking_asked"].map({True: "on", False: "off"}).fillna("")
    frame = frame.assign(thinking_asked=arm)
    frame["suite"] = [f"{s}{ARM_SUFFIX.format(a)}" if a else s for s, a in zip(frame["suite"], arm)]
    return frame


ARM_SUFFIX = " (thinking {})"


def base_suite(suites: pd.Series) -> pd.Series:
    """The suites' own names, with the --thinking both arm _thinking_arms appended taken off again."""
    return suites.str.replace(r" \(thinking (on|off)\)$", "", regex=True)


def complete(frame: pd.DataFrame) -> pd.DataFrame:
    """Only the cells that were measured, complete or partial (failed cells carry no measurements)."""
    return frame[frame["status"].isin(["complete", "partial"])]


def pairs(frame: pd.DataFrame, metrics: Iterable[str] = ("output_throughput", "acceptance_length",
                                                         "tpot_ms_p50", "ttft_ms_p50", "j_per_token")) -> pd.DataFrame:
    """Each speculative cell (SPECULATIVE: DFlash, EAGLE-3) beside its AR cell of the same sweep, engine, suite,
    concurrency and repeat.

    Columns: the key, `mode` (the speculative cell's), `<metric>_ar` and `<metric>_spec` for each metric, and
    `speedup` = the speculative cell's output throughput / AR's. Cells with no partner are dropped.
    """
    done = complete(frame)
    key = ["sweep", *KEY] if "sweep" in done.columns else KEY
    cols = [m for m in metrics if m in done.columns]
    ar = done[done["mode"] == "ar"][key + cols]
    spec = done[done["mode"].isin(SPECULATIVE)][key + ["mode"] + cols]
    out = ar.merge(spec, on=key, suffixes=("_ar", "_spec"))
    if "output_throughput" in cols:
        out["speedup"] = out["output_throughput_spec"] / out["output_throughput_ar"]
    return out.sort_values([*key, "mode"], key=_mode_order).reset_index(drop=True)


def _mode_order(col: pd.Series) -> pd.Series:
    """Sort key: modes in their own order (AR, then SPECULATIVE's), any other column as it is."""
    order = {m: i for i, m in enumerate(("ar", *SPECULATIVE))}
    return col.map(lambda m: order.get(m, len(order))) if col.name == "mode" else col


def headline(frame: pd.DataFrame) -> pd.DataFrame:
    """The model card's table, per speculative mode: suite x concurrency -> AR tok/s, the mode's tok/s (`spec_tok_s`)
    and tau (repeats averaged), and the speedup (speedup.py `speedup_of`: the median over repeats of each repeat's
    mode / AR), with the repeats' lowest and highest as `speedup_min` and `speedup_max`. `mode` says which
    speculative mode a row is (DFlash, EAGLE-3): rows of two modes are never one row."""
    p = pairs(frame)
    if p.empty:
        return pd.DataFrame(columns=["engine", "mode", "suite", "concurrency", "ar_tok_s", "spec_tok_s", "speedup",
                                     "speedup_min", "speedup_max", "tau"])
    group = [c for c in ("sweep", *KEY) if c in p.columns and c != "repeat"] + ["mode"]
    return p.groupby(group, as_index=False).agg(
        ar_tok_s=("output_throughput_ar", "mean"),
        spec_tok_s=("output_throughput_spec", "mean"),
        tau=("acceptance_length_spec", "mean"),
        repeats=("repeat", "count"),
        speedup=("speedup", speedup_of),
        speedup_min=("speedup", "min"),
        speedup_max=("speedup", "max"),
    )


def versus(frame: pd.DataFrame) -> pd.DataFrame:
    """DFlash against each other speculative mode (EAGLE-3) per sweep, engine, suite and concurrency where both ran:
    each one's tok/s and tau (repeats averaged), and `ratio`, DFlash's tok/s over the other's, as a speedup is (the
    median of the repeats' ratios, speedup.py `speedup_of`), with its lowest and highest; `mode`: the other mode."""
    columns = ["engine", "mode", "suite", "concurrency", "dflash_tok_s", "other_tok_s", "dflash_tau", "other_tau",
               "ratio", "ratio_min", "ratio_max", "repeats"]
    done = complete(frame)
    key = ["sweep", *KEY] if "sweep" in done.columns else KEY
    if done.empty:
        return pd.DataFrame(columns=columns)
    cols = ["output_throughput", "acceptance_length"]
    mine = done[done["mode"] == "dflash"][key + cols]
    other = done[done["mode"].isin([m for m in SPECULATIVE if m != "dflash"])][key + ["mode"] + cols]
    both = mine.merge(other, on=key, suffixes=("_dflash", "_other"))
    if both.empty:
        return pd.DataFrame(columns=columns)
    both["ratio"] = both["output_throughput_dflash"] / both["output_throughput_other"]
    group = [c for c in key if c != "repeat"] + ["mode"]
    return both.groupby(group, as_index=False).agg(
        dflash_tok_s=("output_throughput_dflash", "mean"),
        other_tok_s=("output_throughput_other", "mean"),
        dflash_tau=("acceptance_length_dflash", "mean"),
        other_tau=("acceptance_length_other", "mean"),
        ratio=("ratio", speedup_of),
        ratio_min=("ratio", "min"),
        ratio_max=("ratio", "max"),
        repeats=("repeat", "count"),
    )


def power_timeline(sweep_dir: Path | str, cid: str) -> pd.DataFrame | None:
    """A cell's GPU power over its measured window: columns `t_s` and `power_w` (summed over its GPUs),
    from the instantaneous reading where the driver gives it, else the 1 s averaged one.

    None when the cell has no telemetry.csv, or it holds no sample of power; a StoreError naming the file when it
    does not read back as samples (`sweep --resume` measures such a cell again).
    """
    from dflash_bench.store import TELEMETRY
    from dflash_bench.store.layout import present
    from dflash_bench.store.telemetry_csv import read_csv

    file = SweepDir(Path(sweep_dir)).cell_dir(cid) / TELEMETRY
    if not present(file):
        return None
    raw = pd.DataFrame([{"t_s": s.t_s, "gpu": s.gpu, "power_instant_w": s.power_instant_w, "power_w": s.power_w}
                        for s in read_csv(file)], columns=["t_s", "gpu", "power_instant_w", "power_w"])
    column = next((c for c in ("power_instant_w", "power_w") if raw[c].notna().any()), None)
    if raw.empty or column is None:
        return None
    raw = raw.dropna(subset=["t_s", column])
    series = [g.sort_values("t_s") for _, g in raw.groupby("gpu")]
    grid = series[0]["t_s"].to_numpy(dtype=float)
    total = sum(np.interp(grid, s["t_s"].to_numpy(dtype=float), s[column].to_numpy(dtype=float)) for s in series)
    return pd.DataFrame({"t_s": grid, "power_w": total})
