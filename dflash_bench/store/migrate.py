"""Reading files of schema version 1 (dflash-bench before the typed store) as version 2, in memory.

Version 1 differs in two places:
- manifest.json: `settings` held SweepSettings.identity() (no runner, port or URLs); `dflash-bench run`
  folders had `{}`.
- summary.json: `extra` held the lossless and accuracy summaries, the failure counts, the clock origin, the
  /metrics error and the energy details that are fields now.
A migrated folder is never written back by a reader: `SweepDir.migrate()` (and `dflash-bench migrate`
where the CLI offers it) writes version 2 on request.
"""

from __future__ import annotations

from typing import Any

from dflash_bench.store.cells import SCHEMA_VERSION, CellSummary

OLDEST = 1
# keys of a v1 summary's `extra` that became CellSummary fields of the same name
EXTRA_TO_FIELDS = ("lossless", "accuracy", "failures", "clock_origin_monotonic_s", "server_metrics_error")


def manifest_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A v1 manifest's JSON as v2's: typed settings (the launcher recorded by its servers), or None."""
    out = dict(data, schema_version=SCHEMA_VERSION)
    settings = data.get("settings") or None
    if settings is not None:
        runners = {s.get("runner") for s in (data.get("servers") or {}).values() if isinstance(s, dict)}
        settings = dict(settings)
        if len(runners) == 1 and None not in runners:
            settings.setdefault("runner", runners.pop())
    out["settings"] = settings
    hardware = data.get("hardware") or {}
    out["hardware"] = hardware if isinstance(hardware, dict) else {}
    return out


def summary_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A v1 summary's JSON as v2's: `extra` spread into the fields that replace it.

    Keys of `extra` that no field names (none were written by v1) are dropped from the object read; the
    file itself keeps them until it is migrated explicitly."""
    out = {k: v for k, v in data.items() if k != "extra"}
    extra = data.get("extra") or {}
    energy = {k for k in CellSummary.model_fields if k.startswith(("telemetry_", "energy_"))}
    for key, value in extra.items():
        if key in EXTRA_TO_FIELDS or key in energy:
            out[key] = value
    out["schema_version"] = SCHEMA_VERSION
    return out


def needs_migration(data: Any) -> bool:
    return isinstance(data, dict) and data.get("schema_version") == OLDEST
