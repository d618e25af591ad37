"""The sweep folder: the schema of every file in it, atomic writes, and reading it back.

Everything downstream of a measurement (analysis, report, gate, resume) reads only this folder:

    <out>/<sweep-id>/
      manifest.json            Manifest (manifest.py): command line, SweepSettings, plan with every cell's
                               status, provenance (versions, Hardware, Models, ServerRecord per server)
      cells/<cell-id>/
        requests.jsonl         one RequestRecord per line (cells.py)
        summary.json           CellSummary (cells.py); a cell is complete only when this file exists
        server_metrics.json    ServerMetrics (cells.py): /metrics before, after, and their delta
        telemetry.csv          GPU samples of the measured window (telemetry_csv.py: its Sample columns)
      logs/<engine>-<mode>.log server output
      results.csv              one ResultsRow per cell (results.py), rebuilt from the summary.json files

A cell's identity (engine, mode, suite, concurrency, repeat) is CellKey, defined once in cells.py.
Folders of schema version 1 are read as version 2 (migrate.py). Writes are atomic (folder.py).
"""

from dflash_bench.store.cells import (
    SCHEMA_VERSION, STAT_FIELDS, AccuracySummary, CellKey, CellSettings, CellStatus, CellSummary, LosslessSummary, MEASURED, MODE_NAMES, Mode, mode_name,
    PairedDiff, RequestRecord, ServerMetrics, SPECULATIVE, Stat, SteadyPlan, SteadyWindow, cell_id,
)
from dflash_bench.store.folder import (
    MANIFEST, REQUESTS, RESULTS, SERVER_METRICS, SUMMARY, TELEMETRY, StoreError, SweepDir, atomic_write_bytes,
    atomic_write_json, atomic_write_text, read_json_model, read_text,
)
from dflash_bench.store.manifest import (
    CellPlan, GpuInfo, Hardware, HostInfo, MachineSpeed, Manifest, ModelRevision, Models, ServerIdentity, ServerRecord,
    SpeedProbe,
)
from dflash_bench.settings import SweepSettings
from dflash_bench.store.results import RESULTS_COLUMNS, ResultsRow, read_results_csv, results_row
from dflash_bench.store.timestamps import now_iso

__all__ = [
    "SCHEMA_VERSION", "STAT_FIELDS", "AccuracySummary", "CellKey", "CellSettings", "CellStatus", "CellSummary", "LosslessSummary", "MEASURED", "MODE_NAMES", "mode_name",
    "Mode", "PairedDiff", "RequestRecord", "ServerMetrics", "SPECULATIVE", "Stat", "SteadyPlan", "SteadyWindow", "cell_id", "MANIFEST", "REQUESTS", "RESULTS",
    "SERVER_METRICS", "SUMMARY", "TELEMETRY", "StoreError", "SweepDir", "atomic_write_bytes", "atomic_write_json",
    "atomic_write_text", "read_json_model", "read_text", "CellPlan", "GpuInfo", "Hardware", "HostInfo", "MachineSpeed", "Manifest", "ModelRevision", "Models",
    "ServerIdentity", "ServerRecord", "SpeedProbe", "SweepSettings", "RESULTS_COLUMNS", "ResultsRow", "read_results_csv", "results_row", "now_iso",
]
