"""The sweep folder: its schema, atomic writes, and reading it back.

Everything downstream of a measurement (analysis, report, gate, resume) reads only this folder:

    <out>/<sweep-id>/
      manifest.json            Manifest: command line, settings, plan with every cell's status, provenance
      cells/<cell-id>/
        requests.jsonl         one RequestRecord per line
        summary.json           CellSummary; a cell is complete only when this file exists
        server_metrics.json    counter snapshots before/after and their deltas (free-form dict)
        telemetry.csv          GPU samples of the measured window (written by telemetry.py)
      logs/<engine>-<mode>.log server output
      results.csv              one row per cell: the flattened summaries (rebuilt from summary.json files)

Every write is atomic (temporary file in the same folder, fsync, rename): a kill at any moment leaves the
old file or the new one, never half of one. Readers turn a half-written or foreign folder into a UserError.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Literal

from pydantic import BaseModel, Field, ValidationError

from dflash_bench.errors import UserError

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
SUMMARY = "summary.json"
REQUESTS = "requests.jsonl"
SERVER_METRICS = "server_metrics.json"
TELEMETRY = "telemetry.csv"
RESULTS = "results.csv"

Mode = Literal["ar", "dflash"]
CellStatus = Literal["pending", "running", "complete", "failed"]


class StoreError(UserError):
    """A sweep folder that cannot be read: missing, half-written, corrupt or of another schema version."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def cell_id(engine: str, mode: str, suite: str, concurrency: int, repeat: int = 0) -> str:
    """`<engine>-<mode>-<suite>-c<concurrency>[-r<repeat>]`; repeat 0 has no suffix."""
    base = f"{engine}-{mode}-{suite}-c{concurrency}"
    return base if repeat == 0 else f"{base}-r{repeat}"


# ---------------------------------------------------------------- records


class RequestRecord(BaseModel):
    """One request as the client saw it. Times are seconds on the client's monotonic clock,
    relative to the cell's start, so records of one cell compare directly."""

    request_id: str
    prompt_id: str
    turn: int = 0
    warmup: bool = False
    t_send: float
    t_first_byte: float | None = None  # first byte of the response body
    t_first_token: float | None = None  # first chunk that carried content
    t_end: float | None = None
    chunk_times: list[float] = Field(default_factory=list)
    chunk_tokens: list[int] = Field(default_factory=list)  # cumulative output tokens after each chunk
    prompt_tokens: int | None = None  # from the server's usage, never counted by the client
    output_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None  # None means the request succeeded
    spec_verify_ct: int | None = None  # SGLang meta_info: verification steps of this request
    spec_accepted_tokens: int | None = None  # per-request accepted draft tokens where the server says
    output_text: str | None = None
    token_ids: list[int] | None = None  # with --save-token-ids
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per position: [(id, logprob), ...] top-2

    @property
    def ok(self) -> bool:
        return self.error is None


class Stat(BaseModel):
    """Distribution summary of one metric over a cell's measured requests (or tokens, or chunks)."""

    n: int
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    min: float | None = None
    max: float | None = None


class CellSummary(BaseModel):
    """A cell's aggregates. Definitions live in dflash_bench.metrics (one place)."""

    schema_version: int = SCHEMA_VERSION
    cell_id: str
    engine: str
    mode: str
    suite: str
    concurrency: int
    repeat: int = 0
    status: Literal["complete", "failed"] = "complete"
    failure_reason: str | None = None
    url: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict)  # max_tokens, temperature, seed, api, thinking, ...

    num_requests: int = 0  # measured (warm-up excluded)
    num_ok: int = 0
    num_failed: int = 0
    num_warmup: int = 0
    duration_s: float | None = None  # last completion - first dispatch
    total_prompt_tokens: int = 0
    total_output_tokens: int = 0
    output_throughput: float | None = None  # tok/s
    request_throughput: float | None = None  # req/s

    ttft_ms: Stat | None = None
    tpot_ms: Stat | None = None
    itl_ms: Stat | None = None  # per-token latency: chunk gaps divided over the tokens they carry
    chunk_gap_ms: Stat | None = None
    e2e_ms: Stat | None = None
    tok_s_user: Stat | None = None  # 1000 / TPOT per request
    tokens_per_chunk: Stat | None = None

    acceptance_length: float | None = None  # tau; None when the server has no speculative counters
    acceptance_length_req_weighted: float | None = None
    acceptance_length_token_weighted: float | None = None
    acceptance_rate: float | None = None
    acceptance_per_position: list[float] | None = None
    acceptance_source: str | None = None  # vllm-metrics | sglang-meta | builtin-metrics
    num_drafts: int | None = None
    num_draft_tokens: int | None = None
    num_accepted_tokens: int | None = None
    synthetic_acceptance: float | None = None  # set when the server ran with synthetic acceptance

    telemetry: str | None = None  # "on" or why it is off
    energy_j: float | None = None
    energy_source: str | None = None  # counter | integrated
    energy_valid: bool | None = None
    energy_note: str | None = None
    avg_power_w: float | None = None
    j_per_token: float | None = None
    tokens_per_j: float | None = None

    extra: dict[str, Any] = Field(default_factory=dict)  # anything an issue adds later (lossless, accuracy)


class CellPlan(BaseModel):
    cell_id: str
    engine: str
    mode: str
    suite: str
    concurrency: int
    repeat: int = 0
    status: CellStatus = "pending"
    reason: str | None = None
    # where a cell ran when a scheduler placed it (--executor slurm); None for a sweep run on one machine
    node: str | None = None
    job_id: str | None = None
    gpus: list[str] | None = None  # the job's GPUs as the scheduler numbered them (SLURM_JOB_GPUS)
    gpu_type: str | None = None  # the GPUs' name from NVML, else the requested gres type


class Manifest(BaseModel):
    schema_version: int = SCHEMA_VERSION
    sweep_id: str
    created_at: str = Field(default_factory=now_iso)
    updated_at: str = Field(default_factory=now_iso)
    status: str = "running"  # running | complete | interrupted | failed
    command_line: list[str] = Field(default_factory=list)
    settings: dict[str, Any] = Field(default_factory=dict)  # what must match for --resume
    plan: list[CellPlan] = Field(default_factory=list)
    versions: dict[str, Any] = Field(default_factory=dict)
    hardware: dict[str, Any] = Field(default_factory=dict)
    models: dict[str, Any] = Field(default_factory=dict)
    servers: dict[str, Any] = Field(default_factory=dict)  # per engine-mode: command, image digest, ...
    telemetry: str | None = None
    notes: list[str] = Field(default_factory=list)

    def cell(self, cid: str) -> CellPlan:
        for c in self.plan:
            if c.cell_id == cid:
                return c
        raise KeyError(cid)


# ---------------------------------------------------------------- atomic writes


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; the result should read like any other file
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj: Any) -> None:
    if isinstance(obj, BaseModel):
        text = obj.model_dump_json(indent=2)
    else:
        text = json.dumps(obj, indent=2, default=str)
    atomic_write_text(path, text + "\n")


# ---------------------------------------------------------------- the folder


class SweepDir:
    """A sweep folder on disk. `SweepDir.create` starts one, `SweepDir.open` reads one back."""

    def __init__(self, path: Path):
        self.path = Path(path)

    @classmethod
    def create(cls, path: Path, manifest: Manifest) -> "SweepDir":
        path = Path(path)
        if (path / MANIFEST).exists():
            raise StoreError(f"{path} already holds a sweep; pass --resume {path} or choose another --out")
        sweep = cls(path)
        (path / "cells").mkdir(parents=True, exist_ok=True)
        (path / "logs").mkdir(exist_ok=True)
        sweep.write_manifest(manifest)
        return sweep

    @classmethod
    def open(cls, path: Path) -> "SweepDir":
        sweep = cls(path)
        sweep.read_manifest()  # validates
        return sweep

    # manifest
    def read_manifest(self) -> Manifest:
        file = self.path / MANIFEST
        if not self.path.is_dir():
            raise StoreError(f"{self.path} is not a folder; give the path of a sweep folder")
        if not file.exists():
            raise StoreError(f"{self.path} has no {MANIFEST}: it is not a dflash-bench sweep folder")
        data = _load_json(file)
        version = data.get("schema_version") if isinstance(data, dict) else None
        if version != SCHEMA_VERSION:
            raise StoreError(f"{file} has schema version {version}; this dflash-bench reads version {SCHEMA_VERSION}")
        return _validate(Manifest, data, file)

    def write_manifest(self, manifest: Manifest) -> None:
        manifest.updated_at = now_iso()
        atomic_write_json(self.path / MANIFEST, manifest)

    # cells
    def cell_dir(self, cid: str) -> Path:
        return self.path / "cells" / cid

    def log_path(self, engine: str, mode: str) -> Path:
        return self.path / "logs" / f"{engine}-{mode}.log"

    def is_complete(self, cid: str) -> bool:
        return (self.cell_dir(cid) / SUMMARY).exists()

    def write_requests(self, cid: str, records: Iterable[RequestRecord]) -> None:
        buf = io.StringIO()
        for r in records:
            buf.write(r.model_dump_json(exclude_none=True))
            buf.write("\n")
        atomic_write_text(self.cell_dir(cid) / REQUESTS, buf.getvalue())

    def read_requests(self, cid: str) -> list[RequestRecord]:
        file = self.cell_dir(cid) / REQUESTS
        if not file.exists():
            return []
        out = []
        for lineno, line in enumerate(file.read_text().splitlines(), 1):
            if line.strip():
                try:
                    out.append(RequestRecord.model_validate_json(line))
                except ValidationError as err:
                    raise StoreError(f"{file} line {lineno} is not a request record ({_first_error(err)})") from None
        return out

    def write_server_metrics(self, cid: str, data: dict[str, Any]) -> None:
        atomic_write_json(self.cell_dir(cid) / SERVER_METRICS, data)

    def read_server_metrics(self, cid: str) -> dict[str, Any] | None:
        file = self.cell_dir(cid) / SERVER_METRICS
        return _load_json(file) if file.exists() else None

    def write_summary(self, summary: CellSummary) -> None:
        """Written last: its existence marks the cell complete (or failed, with the reason)."""
        atomic_write_json(self.cell_dir(summary.cell_id) / SUMMARY, summary)

    def read_summary(self, cid: str) -> CellSummary | None:
        file = self.cell_dir(cid) / SUMMARY
        if not file.exists():
            return None
        return _validate(CellSummary, _load_json(file), file)

    def summaries(self) -> list[CellSummary]:
        """Summaries of every cell on disk that has one, in plan order (cells not in the plan last)."""
        manifest = self.read_manifest()
        order = [c.cell_id for c in manifest.plan]
        on_disk = sorted(p.name for p in (self.path / "cells").glob("*") if (p / SUMMARY).exists())
        ids = [c for c in order if c in on_disk] + [c for c in on_disk if c not in order]
        return [s for s in (self.read_summary(c) for c in ids) if s is not None]

    def write_results_csv(self) -> Path:
        """Rebuild results.csv from the summaries on disk (one row per cell)."""
        rows = [flatten_summary(s) for s in self.summaries()]
        columns: list[str] = []
        for row in rows:
            columns += [k for k in row if k not in columns]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        out = self.path / RESULTS
        atomic_write_text(out, buf.getvalue())
        return out


def flatten_summary(summary: CellSummary) -> dict[str, Any]:
    """One results.csv row: Stat fields become `<metric>_<stat>`, lists and dicts become JSON."""
    row: dict[str, Any] = {}
    for key, value in summary.model_dump().items():
        if key in STAT_FIELDS:
            for stat in Stat.model_fields:
                row[f"{key}_{stat}"] = (value or {}).get(stat)
        elif isinstance(value, (list, dict)):
            row[key] = json.dumps(value, sort_keys=True) if value else ""
        else:
            row[key] = value
    return row


STAT_FIELDS = ("ttft_ms", "tpot_ms", "itl_ms", "chunk_gap_ms", "e2e_ms", "tok_s_user", "tokens_per_chunk")


def _load_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise StoreError(f"{file} is not valid JSON (line {err.lineno}): the folder may be half-written or corrupt") from None
    except OSError as err:
        raise StoreError(f"cannot read {file}: {err.strerror}") from None


def _validate(model: type[BaseModel], data: Any, file: Path) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise StoreError(f"{file} does not match the {model.__name__} schema ({_first_error(err)})") from None


def _first_error(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(x) for x in e.get("loc", ())) or "record"
    return f"{loc}: {e.get('msg', 'invalid')}"
