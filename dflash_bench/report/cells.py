"""What the report says about single cells: failed or unfinished ones, speculative cells that did not speculate,
cells whose prompts the server partly read from its prefix cache, cells measured as a steady stream, and sample
outputs (escaped by the page, never here)."""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from dflash_bench import analysis
from dflash_bench.store import SPECULATIVE, Manifest, SteadyPlan, SweepDir

SAMPLE_CHARS = 600
CACHED_SHARE = 0.01  # a cell whose server read at least this share of its prompt tokens from its prefix cache


NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
SHOWN_CELLS = 6  # a folded line names this many of its cells, then says how many more


def fold(items: list[tuple[str, str]], numbers: bool = True) -> list[dict[str, Any]]:
    """Per-cell sentences (cell id, text) that differ only in their numbers, as one line each: the text with every
    number that varies shown as its lowest-highest over the cells, and the cells it covers (`cells`, `more`: how
    many past the SHOWN_CELLS named). In first-seen order. `numbers=False`: only sentences alike to the letter
    fold (a failure's HTTP status is no range)."""
    groups: dict[tuple[str, ...], list[tuple[str, list[str]]]] = {}
    for cid, text in items:
        words = tuple(NUMBER.split(text)) if numbers else (text,)  # the text between its numbers
        groups.setdefault(words, []).append((cid, NUMBER.findall(text) if numbers else []))
    out = []
    for words, members in groups.items():
        text = words[0]
        for i, word in enumerate(words[1:]):
            values = sorted({m[1][i] for m in members}, key=_number)
            text += (values[0] if len(values) == 1 else f"{values[0]}-{values[-1]}") + word
        ids = [cid for cid, _ in members]
        out.append({"text": text, "cells": ids[:SHOWN_CELLS], "more": max(0, len(ids) - SHOWN_CELLS), "n": len(ids)})
    return out


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:  # "1.2.3": a version, not a number; its place in the order does not matter
        return 0.0


def no_speculation(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Complete speculative cells (DFlash, EAGLE-3) that show no sign of speculation (the silent fallback to AR),
    with why."""
    if frame.empty or "dflash_warning" not in frame:
        return []
    rows = frame[frame["mode"].isin(SPECULATIVE) & frame["dflash_warning"].map(lambda w: isinstance(w, str) and bool(w))]
    return [{"cell_id": r["cell_id"], "warning": r["dflash_warning"]} for _, r in rows.iterrows()]


def prefix_cached(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Complete cells whose server read at least CACHED_SHARE of their prompt tokens from its prefix cache
    (`metrics/cache.py`), with the share, where it was read, and what the sweep did to the cache before the cell
    (`prefix_cache_reset`; None where the cell does not say)."""
    if frame.empty or "prefix_cache_hit_rate" not in frame:
        return []
    done = analysis.complete(frame)
    share = pd.to_numeric(done["prefix_cache_hit_rate"], errors="coerce")
    return [{"cell_id": r["cell_id"], "share": float(r["prefix_cache_hit_rate"]), "source": r["prefix_cache_source"],
             "reset": r["prefix_cache_reset"] if isinstance(r.get("prefix_cache_reset"), str) else None}
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
