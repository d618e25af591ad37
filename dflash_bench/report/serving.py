"""What a serving team asks of the report: throughput at their SLO, and the model card beside their numbers.

Both are read from the sweep as the rest of the page is (typed summaries, the headline table); every string
reaches the page through the escaping template.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from dflash_bench import analysis
from dflash_bench import published as card
from dflash_bench import slo as slo_mod
from dflash_bench.errors import UserError
from dflash_bench.store import mode_name
from dflash_bench.report.views import SweepView, gpu_names


def slo_context(view: SweepView, slo_text: str | None) -> dict[str, Any] | None:
    """The SLO read-off of every AR/DFlash group of the sweep: `--slo` given to the report, else the sweep's own."""
    settings = view.manifest.settings
    text = slo_text or (settings.slo if settings is not None else None)
    if not text:
        return None
    target = slo_mod.parse_slo(text)
    groups = slo_mod.read_sweep(view.summaries, target, view.gpus)
    return {"target": target.label(), "source": "report --slo" if slo_text else "the sweep's --slo",
            "per": "per GPU" if view.gpus else "per server (the GPUs per server are not recorded)",
            "groups": [{"label": g.label, "headline": g.result.headline, "ar": g.result.ar.status,
                        "dflash": g.result.dflash.status} for g in groups],
            "how": slo_mod.HOW_READ}


def card_context(view: SweepView) -> dict[str, Any] | None:
    """The model card's table beside the sweep's cells of the same suite and concurrency, and the settings that
    differ, when the sweep's model is a known pair whose card publishes one."""
    from dflash_bench.models import resolve

    settings = view.manifest.settings
    if settings is None:
        return None
    try:
        table = resolve(settings.model).published()
    except UserError:
        return None
    if table is None:
        return None
    head, arm = card_arm(view.headline, table.settings.thinking)
    head = head[head["mode"] == "dflash"] if not head.empty else head  # the card publishes DFlash's numbers
    engines = list(head["engine"].unique()) if not head.empty else []
    engine = table.settings.engine if table.settings.engine in engines else (engines[0] if engines else None)
    measured = [card.MeasuredRow(suite=r["suite"], concurrency=int(r["concurrency"]), ar_tok_s=_f(r["ar_tok_s"]),
                                 dflash_tok_s=_f(r["spec_tok_s"]), tau=_f(r["tau"]), speedup=_f(r["speedup"]))
                for _, r in head.iterrows() if r["engine"] == engine]
    asked = {"on": True, "off": False}.get(arm or "")
    cells = [s for s in view.summaries if s.engine == engine
             and (arm is None or s.thinking_asked is asked)]
    modes = {s.thinking for s in cells} - {None, "unknown"}
    hashes = {s.template_hash for s in cells} - {None}
    run = card.RunSettings(gpu=gpu_names(view.manifest.hardware) or None, engine=engine,
                           # as the cells' rendered prompts show it, never the flag; not stated when they disagree
                           thinking=(modes == {"on"}) if len(modes) == 1 else None,
                           template_hash=hashes.pop() if len(hashes) == 1 else None,
                           max_tokens=settings.max_tokens, temperature=settings.temperature,
                           block_size=view.manifest.models.block_size)
    rows = card.side_by_side(table, measured)
    return {"card": table.card, "pair": table.pair, "arm": arm, "engine": engine,
            "settings": table.settings, "notes": table.notes,
            "rows": rows, "gaps": card.setting_gaps(table.settings, run),
            "measured_any": any(r.measured is not None for r in rows)}


def card_arm(head: pd.DataFrame, card_thinking: bool | None) -> tuple[pd.DataFrame, str | None]:
    """A --thinking both sweep is read beside the card through the arm the card's own setting names (on where
    the card does not say), its suites under their own names; any other sweep as it is, with no arm."""
    if head.empty or "thinking_asked" not in head.columns or not (head["thinking_asked"] != "").any():
        return head, None
    arm = "off" if card_thinking is False else "on"
    picked = head[head["thinking_asked"] == arm]
    return picked.assign(suite=analysis.base_suite(picked["suite"])), arm


def _f(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def thinking_pairs(view: SweepView) -> list[dict[str, Any]]:
    """--thinking both: per engine, speculative mode, suite and concurrency, speedup and τ with thinking off beside on."""
    head = view.headline
    if head.empty or "thinking_asked" not in head.columns or not (head["thinking_asked"] != "").any():
        return []
    arms = head[head["thinking_asked"] != ""]
    arms = arms.assign(base=analysis.base_suite(arms["suite"]))
    rows = []
    for (engine, mode, suite, conc), g in arms.groupby(["engine", "mode", "base", "concurrency"], sort=False):
        side = {arm: g[g["thinking_asked"] == arm].iloc[0] for arm in ("off", "on") if (g["thinking_asked"] == arm).any()}
        rows.append({"engine": engine, "mode": mode_name(mode), "suite": suite, "concurrency": int(conc),
                     **{f"{k}_{arm}": _f(side[arm][k]) if arm in side else None
                        for arm in ("off", "on") for k in ("speedup", "tau")}})
    return rows
