"""What the report says about single cells: failed or unfinished ones, DFlash cells that did not speculate,
cells whose prompts the server partly read from its prefix cache, cells measured as a steady stream, the quality checks' verdict per AR/DFlash
pair, and sample outputs (escaped by the page, never here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from dflash_bench import analysis
from dflash_bench.store import Manifest, SteadyPlan, SweepDir

SAMPLE_CHARS = 600
CACHED_SHARE = 0.01  # a cell whose server read at least this share of its prompt tokens from its prefix cache


def no_speculation(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Complete DFlash cells that show no sign of speculation (the silent fallback to AR), with why."""
    if frame.empty or "dflash_warning" not in frame:
        return []
    rows = frame[(frame["mode"] == "dflash") & frame["dflash_warning"].map(lambda w: isinstance(w, str) and bool(w))]
    return [{"cell_id": r["cell_id"], "warning": r["dflash_warning"]} for _, r in rows.iterrows()]


def prefix_cached(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Complete cells whose server read at least CACHED_SHARE of their prompt tokens from its prefix cache
    (`metrics/cache.py`), with the share and where it was read."""
    if frame.empty or "prefix_cache_hit_rate" not in frame:
        return []
    done = analysis.complete(frame)
    share = pd.to_numeric(done["prefix_cache_hit_rate"], errors="coerce")
    return [{"cell_id": r["cell_id"], "share": float(r["prefix_cache_hit_rate"]), "source": r["prefix_cache_source"]}
            for _, r in done[share >= CACHED_SHARE].iterrows()]


def steady(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Complete cells measured as a steady stream (--steady-requests): their throughput and latencies are the
    window's, not a closed batch's; each with its window as the store labels it."""
    if frame.empty or "settings_steady_requests" not in frame:
        return []
    done = analysis.complete(frame)
    requests = pd.to_numeric(done["settings_steady_requests"], errors="coerce")
    ramps = pd.to_numeric(done["settings_steady_ramp"], errors="coerce").fillna(0)
    return [{"cell_id": r["cell_id"], "engine": r["engine"], "suite": r["suite"], "concurrency": int(r["concurrency"]),
             "label": SteadyPlan(ramp=int(ramp), requests=int(n)).label()}
            for (_, r), n, ramp in zip(done.iterrows(), requests, ramps) if pd.notna(n)]


def mark_steady(matrix: list[dict[str, Any]], marks: list[dict[str, Any]]) -> None:
    """The headline matrix's cells with a steady-stream cell behind them get its label (`steady`)."""
    where = {(m["engine"], m["suite"], m["concurrency"]): m["label"] for m in marks}
    for row in matrix:
        for cell in row["cells"]:
            if cell is not None:
                cell["steady"] = where.get((row["engine"], row["suite"], int(cell["concurrency"])))


def failures(manifest: Manifest, frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Failed and partial cells and why (from their summary, else from the plan), plus planned cells never
    finished."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    if not frame.empty:
        for _, row in frame[frame["status"].isin(["failed", "partial"])].iterrows():
            reason = row.get("failure_reason")
            if not isinstance(reason, str) or not reason:
                try:
                    reason = manifest.cell(row["cell_id"]).reason
                except KeyError:
                    reason = None
            out.append({"cell_id": row["cell_id"], "status": row["status"], "reason": reason or "no reason recorded"})
            seen.add(row["cell_id"])
    on_disk = set(frame["cell_id"]) if not frame.empty else set()
    for cell in manifest.plan:
        if cell.cell_id in seen or cell.cell_id in on_disk:
            continue
        if cell.status == "failed" or cell.status in ("pending", "running"):
            out.append({"cell_id": cell.cell_id, "status": cell.status, "reason": cell.reason or "no summary on disk"})
    return out


def quality_pairs(path: Path) -> list[dict[str, Any]]:
    """One display row per DFlash cell that the quality checks annotated (quality.check.quality_rows):
    exact-match rate of the lossless check, divergence kinds, first divergence, AR and DFlash accuracy."""
    from dflash_bench.quality.check import quality_rows

    out = []
    for r in quality_rows(path):
        lossless, acc, acc_ar = r.get("lossless") or {}, r.get("accuracy") or {}, r.get("accuracy_ar") or {}
        if not (lossless or acc or acc_ar):
            continue
        kinds = lossless.get("divergences") or {}
        unscored = _unscored(r["suite"])
        out.append({
            "engine": r["engine"], "suite": r["suite"], "concurrency": r["concurrency"], "repeat": r["repeat"],
            "exact": (f"{lossless['exact_match_rate']:.1%} of {lossless.get('n')}" if lossless.get("exact_match_rate") is not None
                      else lossless.get("status", NOT_CHECKED)),
            "divergences": ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or ("none" if lossless.get("n") else "–"),
            "first": (lossless.get("first_divergence") or {}).get("p50"),
            "acc_ar": _accuracy(acc_ar, unscored), "acc_dflash": _accuracy(acc, unscored),
            "diff": _paired(acc.get("vs_ar")) if acc else unscored,
        })
    return out


NOT_CHECKED = "not checked: run dflash-bench quality"


def _unscored(suite: str) -> str:
    """What an accuracy cell the checks never filled says: the command that fills it, or that none can."""
    from dflash_bench.analysis import base_suite
    from dflash_bench.quality.accuracy import ANSWER_SUITES, CODE_SUITES

    base = str(base_suite(pd.Series([suite])).iloc[0])
    if base in ANSWER_SUITES:
        return "not scored: run dflash-bench quality"
    if base in CODE_SUITES:
        return "not scored: run dflash-bench quality --score-code"
    return "no reference answers to score"


def _accuracy(x: dict[str, Any], unscored: str = "–") -> str:
    if not x:
        return unscored
    if x.get("accuracy") is None:
        return str(x.get("status", "–"))
    interval = f" [{x['ci_low']:.1%}, {x['ci_high']:.1%}]" if x.get("ci_low") is not None and x.get("ci_high") is not None else ""
    return f"{x['accuracy']:.1%}{interval} n={x.get('n')}"


def _paired(v: Any) -> str:
    if not isinstance(v, dict) or not v.get("n") or v.get("ar_minus_dflash") is None:
        return "–"
    return f"{v['ar_minus_dflash']:+.1%} [{v['ci_low']:+.1%}, {v['ci_high']:+.1%}] n={v['n']}"


def sample_outputs(sweep: SweepDir, frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The first measured successful output of each complete cell at its suite's lowest concurrency, shortened."""
    if frame.empty:
        return []
    done = analysis.complete(frame)
    out = []
    for (_, suite), group in done.groupby(["engine", "suite"], sort=False):
        lowest = group[group["concurrency"] == group["concurrency"].min()]
        for _, row in lowest[lowest["repeat"] == lowest["repeat"].min()].iterrows():
            record = next((r for r in sweep.read_requests(row["cell_id"]) if r.ok and not r.warmup and r.output_text), None)
            if record is None:
                continue
            text = record.output_text or ""
            cut = len(text) > SAMPLE_CHARS
            out.append({"cell_id": row["cell_id"], "suite": suite, "mode": row["mode"], "prompt_id": record.prompt_id,
                        "text": text[:SAMPLE_CHARS] + ("…" if cut else "")})
    return out
