"""The report page: one self-contained HTML file (figures as base64 PNG data URIs, CSS inline, no script)
plus the same figures as files under figures/ beside it.

Every string reaches the page through Jinja2 with autoescape on: model output, dataset text, manifest
values, sweep ids and failure reasons show as text, never as markup.
"""

from __future__ import annotations

import base64
import json
import math
import shlex
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2

from dflash_bench import __version__
from dflash_bench.errors import UserError
from dflash_bench.metrics.phases import PHASES
from dflash_bench.speedup import SPEEDUP_DEFINITION
from dflash_bench.report import card, cells, engines, figures, measured, quality, serving, tables
from dflash_bench.report.views import SweepView, load, plain, redact
from dflash_bench.store import MANIFEST, SPECULATIVE, atomic_write_bytes, mode_name

TEMPLATES = Path(__file__).parent / "templates"
MATRIX_COLUMNS = 8  # a sweep of more concurrencies shows its headline as a row per concurrency, not a column each
FIGURE_TITLES = {
    "input_length": "Speedup and τ by prompt length",
    "pareto": "Throughput vs interactivity",
    "pareto_p90": "Throughput vs interactivity at p90 TPOT (the tail)",
    "acceptance": "Acceptance length τ by concurrency",
    "acceptance_positions": "Acceptance rate per draft position",
    "verify_width": "Tokens verified per row and step by concurrency",
    "latency": "TTFT and TPOT percentiles",
    "energy": "Energy per output token",
    "power": "GPU power over the measured window (first repeat)",
}


def build_report(sweep_dirs: list[Path], out: Path | None = None, slo: str | None = None) -> Path:
    """Write report.html (default: inside the first sweep folder) and figures/*.png beside it; return the page's path.

    `slo`: the interactivity target to read off (`--slo`), else each sweep's own."""
    if not sweep_dirs:
        raise UserError("give at least one sweep folder")
    if slo is not None:
        from dflash_bench.slo import parse_slo

        parse_slo(slo)  # a bad target is one sentence before anything is read
    for path in sweep_dirs:
        if not (Path(path) / MANIFEST).exists() and Path(path).is_dir() and any(Path(path).glob(f"*/{MANIFEST}")):
            raise UserError(f"{path} holds sweep folders, not a sweep; give one of its subfolders")
    views = load([Path(p) for p in sweep_dirs])
    out = _out_path(Path(sweep_dirs[0]), out)
    fig_dir = out.parent / "figures"
    if fig_dir.is_symlink():  # written through, the figures would land wherever it points
        raise UserError(f"{fig_dir} is a symbolic link: the report writes its figures into a folder of its own; remove "
                        "it or choose another --out")
    many = len(views) > 1
    sections: list[dict[str, Any]] = []
    for view in views:
        pngs = figures.render_all(view)
        figs = {}
        for name in figures.FIGURES:  # a figure this sweep no longer has must not linger from an earlier run
            file = f"{view.slug}-{name}.png" if many else f"{name}.png"
            if name not in pngs:
                (fig_dir / file).unlink(missing_ok=True)
        for name, data in pngs.items():
            file = f"{view.slug}-{name}.png" if many else f"{name}.png"
            _write(fig_dir / file, data)
            figs[name] = {"src": "data:image/png;base64," + base64.b64encode(data).decode("ascii"),
                          "href": f"figures/{file}", "title": FIGURE_TITLES[name], "name": name}
        sections.append(_context(view, figs, slo))
    labels, compare = tables.comparison(views) if many else ([], [])
    card_view, rows = _card(views)
    html = render(sweeps=sections, compare_labels=labels, compare=compare, reference=_reference(views),
                  card=card_view, engines=_engines(rows, card_view["pair"]), speedup_definition=SPEEDUP_DEFINITION,
                  matrix_columns=MATRIX_COLUMNS,
                  version=__version__,
                  generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    _write(out, html.encode())
    return out


def _card(views: list[SweepView]) -> tuple[dict[str, Any], list[card.CardRow]]:
    """The card's table over every sweep (report/card.py), with the card it is set against; and its rows."""
    from dflash_bench.models import resolve
    from dflash_bench.published import published_for

    pairs = set()
    for view in views:
        if view.manifest.settings is not None:
            try:
                pairs.add(resolve(view.manifest.settings.model).name)
            except UserError:
                pass
    pair = next(iter(pairs)) if len(pairs) == 1 else None  # folders of several pairs: no one card to set them against
    rows = card.card_rows([line for view in views for line in card.view_lines(view)], pair)
    header, body = card.card_table(rows)
    table = published_for(pair) if pair else None
    return {"header": header, "rows": body, "numeric": [h not in card.TEXT_COLUMNS for h in header],
            "pair": pair, "url": table.card if table else None,
            "settings": table.settings.model_dump() if table else None,
            "labelled": sum(1 for r in rows if r.labels), "per_gpu": card.per_gpu(rows)}, rows


def _engines(rows: list[card.CardRow], pair: str | None) -> dict[str, Any]:
    """Per suite, the engines side by side (report/engines.py) where the report holds two or more; else only where
    DFlash stops paying."""
    paired = [r for r in rows if r.ar is not None and r.dflash is not None]
    suite_tables = engines.suite_tables(paired, pair)
    side = engines.engine_count(suite_tables) > 1
    return {"tables": suite_tables, "side_by_side": side, "header": engines.header(suite_tables),
            "modes": engines.has_modes(suite_tables), "lengths": engines.length_table(paired),
            "title": "Engines side by side" if side else "Where DFlash stops paying"}


def _reference(views: list[SweepView]) -> dict[str, Any]:
    """Each other engine's tau against the builtin engine's (gate/reference.py, at the gate's default tolerance)."""
    from dflash_bench.gate.config import GateConfig
    from dflash_bench.gate.reference import compare_folders, tolerance

    folders: dict[Path, list[Any]] = {}  # a folder split by GPU type is one sweep to the reference check
    for view in views:
        folders.setdefault(view.path, []).extend(view.summaries)
    result = compare_folders(list(folders), quiet=True, summaries=list(folders.values()))  # tables.load said any migration
    rows = [{"engine": c.engine, "where": c.where, "sweeps": ", ".join(c.sweeps), "reference": c.reference_tau, "tau": c.tau,
             "change": c.check.change, "method": c.check.method, "n_ref": len(c.check.baseline),
             "n": len(c.check.current), "under": c.under, "sentence": c.check.note} for c in result.comparisons]
    return {"rows": rows, "under": [c.check.note for c in result.under_accepting],
            "not_compared": result.not_compared, "tolerance": tolerance(GateConfig())}


def _write(path: Path, data: bytes) -> None:
    atomic_write_bytes(path, data)


def _out_path(first: Path, out: Path | None) -> Path:
    if out is None:
        return first / "report.html"
    out = Path(out)
    if out.is_dir():
        return out / "report.html"
    if out.suffix.lower() not in (".html", ".htm"):
        raise UserError(f"--out {out} should name an .html file or an existing folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def _context(view: SweepView, figs: dict[str, dict[str, str]], slo: str | None = None) -> dict[str, Any]:
    m = view.manifest
    concs, matrix = tables.headline_matrix(view.headline)
    steady = cells.steady(view.frame)
    args = list(m.settings.engine_args) if m.settings else []
    cells.mark_steady(matrix, steady)
    statuses: dict[str, int] = {}
    for cell in m.plan:
        statuses[cell.status] = statuses.get(cell.status, 0) + 1
    telemetry_off = sorted({str(t) for t in view.frame.get("telemetry", []) if isinstance(t, str) and t != "on"})
    return {
        "label": view.label,
        "slug": view.slug,
        "folder": view.path.name,
        "m": m,
        "models": m.models,
        "gpus": view.gpus,
        "unit": view.throughput_unit,
        "statuses": statuses,
        "n_cells": len(view.frame),
        "figs": figs,
        "concs": concs,
        "matrix": matrix,
        "extremes": tables.best_and_worst(view.headline),
        "versus": tables.versus_rows(view),
        "tau": tables.tau_matrix(view),
        "accept": [r for r in tables.stat_table(view, ["acceptance_length", "acceptance_length_req_weighted",
                                                       "acceptance_length_token_weighted", "acceptance_rate",
                                                       "verify_width", "width_policy", "acceptance_length_full_block",
                                                       "acceptance_source",
                                                       "acceptance_length_client", "acceptance_client_source"])
                   if _present(r.get("acceptance_length_dflash"))],
        "pareto": tables.stat_table(view, ["output_throughput", "tok_s_user_p50", "tok_s_user_at_tpot_p90"]),
        "latency": tables.stat_table(view, ["ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p90", "tpot_ms_p99"]),
        "later_turns": tables.later_turns(view),
        # the server's own split of a request's time (metrics/phases.py), where the server exports it
        "phases": [r for r in tables.stat_table(view, [f"server_{p}_ms" for p in PHASES])
                   if any(_present(v) for k, v in r.items() if k.startswith("server_"))],
        "phase_names": list(PHASES),
        "energy": tables.energy_rows(view),
        "tau_counting": tables.tau_counting(view),
        "synthetic": sorted({f"{v:g}" for v in view.frame.get("synthetic_acceptance", []) if _present(v)}),
        "spec_modes": [(m, mode_name(m)) for m in SPECULATIVE if not view.done.empty and
                       (view.done["mode"] == m).any()] or [("dflash", "DFlash")],
        "synthetic_modes": [mode_name(m) for m in SPECULATIVE if "synthetic_acceptance" in view.frame and
                            view.frame.loc[view.frame["mode"] == m, "synthetic_acceptance"].notna().any()],
        "no_speculation": cells.fold([(w["cell_id"], w["warning"]) for w in cells.no_speculation(view.frame)]),
        "random_weights": any(card.weights_of(args, e) == "random" for e in set(view.frame.get("engine", []))),
        "partial": cells.fold([(f["cell_id"], f["reason"]) for f in view.failed if f["status"] == "partial"], numbers=False),
        "prefix_cached": cells.fold([(c["cell_id"], f"{100 * c['share']:,.1f}% of its prompt tokens ({c['source']}"
                                                    + (f"; before the cell: {c['reset']})" if c["reset"] else ")"))
                                     for c in cells.prefix_cached(view.frame)]),
        "steady": steady,
        "steady_folded": cells.fold([(c["cell_id"], c["label"]) for c in steady]),
        "slo": serving.slo_context(view, slo),
        "card": serving.card_context(view),
        "thinking_pairs": serving.thinking_pairs(view),
        "has_energy": "j_per_token" in view.done.columns and view.done["j_per_token"].notna().any(),
        "telemetry_note": m.telemetry or "; ".join(telemetry_off) or "no telemetry.csv in any cell",
        "failed": view.failed,
        "quality": view.quality,
        "quality_hint": measured.quality_hint(view),
        "quality_todo": quality.todo(view.quality),
        "measured": measured.describe(view),
        "samples": view.samples,
        "command_line": shlex.join(m.command_line) if m.command_line else "",
        "manifest_blocks": [(k, _pretty(redact(plain(getattr(m, k))))) for k in
                            ("settings", "models", "hardware", "versions", "servers") if plain(getattr(m, k))],
        "notes": m.notes,
    }


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


def _num(value: Any, digits: int = 1) -> str:
    if value is None or isinstance(value, bool):
        return "–" if value is None else str(value)
    try:
        f = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(f) or math.isinf(f):
        return "–"
    return f"{f:,.{digits}f}"


def _per(value: Any, gpus: int | None) -> Any:
    try:
        return float(value) / gpus if gpus else value
    except (TypeError, ValueError):
        return value


def _ratio(value: Any, base: Any) -> str:
    """`value / base` as `0.42×`, or a dash when either is missing or base is 0."""
    try:
        v, b = float(value), float(base)
    except (TypeError, ValueError):
        return "–"
    return _num(v / b, 2) + "×" if b and not math.isnan(v) and not math.isnan(b) else "–"


def render(**context: Any) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = _num
    env.filters["per"] = _per
    env.filters["ratio"] = _ratio
    return env.get_template("report.html.j2").render(**context)
