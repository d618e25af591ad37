"""A sweep folder as the report reads it: one `SweepView` per folder (or per GPU type of a folder whose cells ran
on several), its cells from analysis.py with repeats averaged, its suites in the plan's order, its GPUs per server,
its label; and the manifest as shown (secrets hidden).

    views = load([Path("results/sweep-1"), ...])   # each folder's summaries read once, for every part of the page

tables.py turns a view into the page's tables, figures.py into its figures; nothing here formats HTML or draws.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel

from dflash_bench import analysis
from dflash_bench.report.cells import failures, sample_outputs
from dflash_bench.report.quality import quality_table
from dflash_bench.profiles.gpus import recorded_gpus
from dflash_bench.store import CellKey, CellSummary, Hardware, Manifest, SweepDir, SweepSettings

SECRET_KEY = re.compile(r"(^|[_-])token$|secret|passw|api[_-]?key|authorization", re.I)  # not max_tokens


@dataclass
class SweepView:
    path: Path
    manifest: Manifest
    label: str  # what the page calls this sweep (sweep id, plus hardware and engines)
    slug: str  # safe for file names
    frame: pd.DataFrame  # analysis.cells: one row per cell
    done: pd.DataFrame  # complete cells, repeats averaged: one row per engine x mode x suite x concurrency
    headline: pd.DataFrame  # analysis.headline
    gpus: int | None  # GPUs per server when the manifest says, else None ("per server")
    failed: list[dict[str, Any]] = field(default_factory=list)
    quality: list[dict[str, Any]] = field(default_factory=list)  # lossless check and accuracy per AR/DFlash pair
    samples: list[dict[str, Any]] = field(default_factory=list)
    suite_rank: dict[str, int] = field(default_factory=dict)  # the plan's suite order (the user's --suites)
    summaries: list[CellSummary] = field(default_factory=list)  # the folder's, read once for every part of the page
    _power: dict[str, pd.DataFrame | None] = field(default_factory=dict)  # cell id -> t_s, power_w, as read

    def power(self, cell_ids: list[str]) -> dict[str, pd.DataFrame]:
        """The GPU power timelines of these cells (analysis.power_timeline), read when first asked for: a figure
        draws a few cells of a large sweep, and reading every cell's telemetry.csv would cost the report most of
        its time. Cells without one are left out."""
        for cid in cell_ids:
            if cid not in self._power:
                self._power[cid] = analysis.power_timeline(self.path, cid)
        return {cid: t for cid in cell_ids if (t := self._power[cid]) is not None}

    def ordered(self, suites: Any) -> list[str]:
        """Distinct suites in the plan's order (unknown ones last, alphabetically)."""
        return sorted(set(suites), key=lambda x: (self.suite_rank.get(x, len(self.suite_rank)), str(x)))

    @property
    def throughput_unit(self) -> str:
        return "tok/s per GPU" if self.gpus else "tok/s per server"


def load(paths: list[Path]) -> list[SweepView]:
    views: list[SweepView] = []
    slugs: set[str] = set()
    for path in paths:
        for view in by_gpu_type(_load_one(Path(path))):
            base, n = view.slug, 2
            while view.slug in slugs:
                view.slug, n = f"{base}-{n}", n + 1
            slugs.add(view.slug)
            views.append(view)
    return views


def by_gpu_type(view: SweepView) -> list[SweepView]:
    """A sweep whose cells ran on several GPU types (the placement a scheduler records per cell) becomes one
    view per type, so the report sets them side by side as it does separate sweeps; else the view as is."""
    types = {c.cell_id: c.gpu_type or "unknown GPU" for c in view.manifest.plan}
    if len(set(types.values())) < 2:
        only = next(iter(types.values()), "unknown GPU")
        if only != "unknown GPU" and only not in view.label:  # a gres type where NVML named no GPU
            view.label = f"{view.label} · {only}"
        return [view]
    out = []
    for gpu in sorted(set(types.values())):
        ids = {cid for cid, t in types.items() if t == gpu}
        frame = view.frame[view.frame["cell_id"].isin(ids)] if not view.frame.empty else view.frame
        manifest = view.manifest.model_copy(update={"plan": [c for c in view.manifest.plan if c.cell_id in ids]})
        part = SweepView(path=view.path, manifest=manifest, label=f"{view.label} · {gpu}",
                         slug=f"{view.slug}-{slugify(gpu)}", frame=frame, done=in_order(averaged(frame), view.suite_rank),
                         headline=in_order(analysis.headline(frame), view.suite_rank), gpus=view.gpus,
                         suite_rank=view.suite_rank, summaries=[s for s in view.summaries if s.cell_id in ids])
        part.failed = failures(manifest, frame)
        part.quality = view.quality  # per engine, suite and concurrency: not placed on a GPU type
        part.samples = [x for x in view.samples if x["cell_id"] in ids]
        out.append(part)
    return out


def _load_one(path: Path) -> SweepView:
    sweep = SweepDir.open(path)
    manifest = sweep.read_manifest()
    summaries = sweep.summaries()
    frame = analysis.cells_of(summaries, manifest.sweep_id)
    if sweep.migration_note:
        print(sweep.migration_note, file=sys.stderr)
    gpus = gpu_count(manifest.hardware, manifest.settings, manifest.servers)
    rank = suite_rank(manifest, frame)
    view = SweepView(
        path=path,
        manifest=manifest,
        label=sweep_label(manifest, frame),
        slug=slugify(manifest.sweep_id),
        frame=frame,
        done=in_order(averaged(frame), rank),
        headline=in_order(analysis.headline(frame), rank),
        gpus=gpus,
        suite_rank=rank,
        summaries=summaries,
    )
    view.failed = failures(manifest, frame)
    view.quality = in_order(pd.DataFrame(quality_table(path, summaries)), rank).to_dict("records")
    view.samples = sample_outputs(sweep, in_order(frame, rank))
    return view


def suite_rank(manifest: Manifest, frame: pd.DataFrame) -> dict[str, int]:
    order: list[str] = []
    for cell in manifest.plan:
        if cell.suite not in order:
            order.append(cell.suite)
    order += sorted(set(frame["suite"]) - set(order)) if not frame.empty else []
    return {s: i for i, s in enumerate(order)}


def in_order(table: pd.DataFrame, rank: dict[str, int]) -> pd.DataFrame:
    """Rows by engine, then suite in the plan's order, then mode and concurrency."""
    if table.empty:
        return table
    cols = [c for c in ("engine", "suite", "mode", "concurrency") if c in table.columns]
    return table.sort_values(cols, key=lambda col: col.map(lambda x: rank.get(x, len(rank))) if col.name == "suite" else col,
                             kind="stable").reset_index(drop=True)


def slugify(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:60] or "sweep"


def plain(value: Any) -> Any:
    """A manifest section as plain data (typed sections dumped without their empty fields)."""
    if isinstance(value, BaseModel):
        return value.model_dump(exclude_none=True)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def _as_dict(section: BaseModel | dict[str, Any] | None) -> dict[str, Any]:
    """A manifest section as a plain dict ({} for none)."""
    out = plain(section)
    return out if isinstance(out, dict) else {}


def gpu_count(hardware: Hardware | dict[str, Any], settings: SweepSettings | dict[str, Any] | None = None,
              servers: dict[str, Any] | None = None) -> int | None:
    """How many GPUs one server used (profiles.recorded_gpus: what its record says); a launched server
    that says nothing uses one GPU, however many the host has. Else the GPUs the manifest's `hardware`
    lists (None when nothing says: per server)."""
    hw, recorded_servers = _as_dict(hardware), _as_dict(servers)
    if hw.get("host") and not hw.get("gpus") and not hw.get("nodes"):
        return None  # the host that measured listed no GPU (a CPU run): throughput per server
    recorded = recorded_gpus(recorded_servers, _as_dict(settings))
    if recorded:
        return recorded
    for key in ("gpus_per_server", "tensor_parallel", "tp"):
        if isinstance(hw.get(key), int) and hw[key] > 0:
            return int(hw[key])
    gpus = hw.get("gpus")
    commands = [info.get("command") for info in recorded_servers.values() if isinstance(info, dict)]
    if gpus and any(isinstance(c, list) and c for c in commands):
        return 1  # vLLM, SGLang and the builtin engine use one GPU unless told to shard
    if isinstance(gpus, list) and gpus:
        return len(gpus)
    if isinstance(gpus, int) and not isinstance(gpus, bool) and gpus > 0:
        return gpus
    return None


def gpu_names(hardware: Hardware | dict[str, Any]) -> str:
    hw = _as_dict(hardware)
    gpus = hw.get("gpus")
    if isinstance(gpus, list) and gpus:
        names = [str(g.get("name", "GPU")) if isinstance(g, dict) else str(g) for g in gpus]
        uniq = sorted(set(names))
        return ", ".join(f"{names.count(n)}× {n}" for n in uniq)
    return str(hw.get("gpu") or hw.get("name") or "")


def sweep_label(manifest: Manifest, frame: pd.DataFrame) -> str:
    parts = [manifest.sweep_id]
    engines = sorted(set(frame["engine"])) if not frame.empty else []
    if engines:
        parts.append("/".join(str(e) for e in engines))
    hw = gpu_names(manifest.hardware)
    if hw:
        parts.append(hw)
    return " · ".join(parts)


def averaged(frame: pd.DataFrame) -> pd.DataFrame:
    """Complete cells with repeats averaged: numeric columns become their mean; list columns are parsed
    (per-position acceptance: element-wise mean)."""
    done = analysis.complete(frame) if not frame.empty else frame
    key = CellKey.sample_fields()
    if done.empty:
        return pd.DataFrame(columns=key)
    if "tpot_ms_p90" in done.columns:  # tail interactivity: what 90% of requests get or beat
        tpot90 = pd.to_numeric(done["tpot_ms_p90"], errors="coerce")
        done = done.assign(tok_s_user_at_tpot_p90=1000.0 / tpot90.where(tpot90 > 0))
    numeric = [c for c in done.columns if c not in key and c != "repeat" and pd.api.types.is_numeric_dtype(done[c])]
    out = done.groupby(key, as_index=False)[numeric].mean()
    if "acceptance_per_position" in done.columns:
        pos = done.groupby(key)["acceptance_per_position"].apply(lambda col: _mean_lists([parse_json(v) for v in col]))
        out = out.merge(pos.rename("positions").reset_index(), on=key, how="left")
    else:
        out["positions"] = None
    if "acceptance_profile" in done.columns:  # how far the drafts were verified: positions past it show nothing
        reach = done.groupby(key)["acceptance_profile"].apply(lambda col: _verified_reach(list(col)))
        out = out.merge(reach.rename("verified_positions").reset_index(), on=key, how="left")
    else:
        out["verified_positions"] = None
    return out.sort_values(key).reset_index(drop=True)


def _verified_reach(profiles: list[Any]) -> int | None:
    """Draft positions that some repeat's drafts verified: the acceptance profile's positions (results.csv's
    "verified/accepted; ...") with a verified count; None where no repeat has a profile (an engine that verifies
    every position of every draft)."""
    reach = []
    for text in profiles:
        if isinstance(text, str) and text:
            verified = [item.split("/")[0].strip() for item in text.split(";")]
            reach.append(sum(1 for v in verified if v.isdigit() and int(v) > 0))
    return max(reach) if reach else None


def parse_json(value: Any) -> Any:
    if isinstance(value, (list, dict)):
        return value
    if not isinstance(value, str) or not value:
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return None


def _mean_lists(lists: list[Any]) -> list[float] | None:
    lists = [x for x in lists if isinstance(x, list) and x]
    if not lists:
        return None
    n = max(len(x) for x in lists)
    out = []
    for i in range(n):
        vals = [float(x[i]) for x in lists if i < len(x) and isinstance(x[i], (int, float))]
        out.append(sum(vals) / len(vals) if vals else math.nan)
    return out


def redact(value: Any) -> Any:
    """The manifest for display, with anything that looks like a secret hidden (they should never be there)."""
    if isinstance(value, dict):
        return {k: ("***" if SECRET_KEY.search(str(k)) and value[k] not in (None, "", False) else redact(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return re.sub(r"\bhf_[A-Za-z0-9]{20,}\b", "hf_***", value)
    return value
