"""Schema of manifest.json: the sweep's settings, its plan, and where its numbers come from.

Provenance sections keep keys this version does not name (extra="allow"): a manifest rewritten on resume
by this version must not drop what a newer launcher recorded.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from dflash_bench.settings import SweepSettings
from dflash_bench.store.cells import SCHEMA_VERSION, CellKey, CellStatus
from dflash_bench.synthetic import SyntheticProfile
from dflash_bench.store.timestamps import now_iso


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class HostInfo(_Open):
    hostname: str | None = None
    platform: str | None = None
    cpu_count: int | None = None
    machine: str | None = None


class GpuInfo(_Open):
    """One GPU as NVML described it (telemetry/nvml.py gpu_inventory); `error` when it could not."""

    index: int | None = None
    error: str | None = None
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    driver_version: str | None = None
    cuda_driver_version: int | None = None
    memory_total_mib: float | None = None
    power_limit_w: float | None = None
    power_default_limit_w: float | None = None
    power_max_limit_w: float | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    sm_clock_app_mhz: int | None = None
    persistence_mode: int | None = None
    energy_counter: bool | None = None
    power_instant: bool | None = None


class Hardware(_Open):
    host: HostInfo | None = None
    gpus: list[GpuInfo] = Field(default_factory=list)
    nodes: dict[str, list[GpuInfo]] = Field(default_factory=dict)  # --executor slurm: each node's GPUs


class ModelRevision(_Open):
    """What can be known offline about a model (store/provenance.py model_revision)."""

    id: str
    revision: str | None = None  # the commit the local Hugging Face cache resolved `main` to
    config_sha256: str | None = None
    chat_template_sha256: str | None = None
    parameters: int | None = None  # counted from the safetensors headers of a folder on this machine


class Models(_Open):
    target: ModelRevision | None = None
    drafter: ModelRevision | None = None
    block_size: int | None = None
    thinking: bool | None = None


class ServerIdentity(BaseModel):
    """What the harness checked to know the server it measures is the one it launched (launch/identity.py):
    sentences in `checked`, and what a later check compares (model id, start time, listening pid)."""

    checked: list[str] = Field(default_factory=list)
    port: int | None = None
    listener_pid: int | None = None
    container_id: str | None = None
    model: str | None = None  # the first id /v1/models listed
    started: float | None = None  # /metrics process_start_time_seconds (Unix time), where the server has it
    expected_model: str | None = None  # --expect-model

    def summary(self) -> str:
        return "; ".join(self.checked)


class ServerRecord(_Open):
    """A server a sweep measured: launched (launch.common.ServerInfo, env values never kept) or the user's
    own (runner "external", its URL only). Written without the fields it does not have."""

    runner: str
    url: str
    command: list[str] = Field(default_factory=list)
    port: int | None = None
    engine: str | None = None
    mode: str | None = None
    image: str | None = None
    image_id: str | None = None
    image_digest: str | None = None
    container_id: str | None = None
    pid: int | None = None
    log_path: str | None = None
    env_names: list[str] = Field(default_factory=list)
    gpus: int | None = None  # GPUs the launched server used (profiles.server_gpus)
    identity: ServerIdentity | None = None  # what was checked after the launch (None: a folder written before launches were checked)
    weights: str | None = None  # what the server loaded where the profile converts it (llama.cpp: "GGUF f32")
    ready_s: float | None = None  # seconds from its start to answering ready: loading, compiling, graphs (a launch's)

    @model_serializer(mode="wrap")
    def _drop_unknown(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None and v != [] or k in ("runner", "url")}


class CellPlan(CellKey):
    model_config = ConfigDict(frozen=False)

    status: CellStatus = "pending"
    reason: str | None = None
    # where a cell ran when a scheduler placed it (--executor slurm); None for a sweep run on one machine
    node: str | None = None
    job_id: str | None = None
    gpus: list[str] | None = None  # the job's GPUs as the scheduler numbered them (SLURM_JOB_GPUS)
    gpu_type: str | None = None  # the GPUs' name from NVML, else the requested gres type
    # the acceptance profile the cell's DFlash server was given to draw (sweep --synthetic-acceptance; None: it verifies)
    synthetic: SyntheticProfile | None = None


class SpeedProbe(BaseModel):
    """One timing of the machine-speed probe (telemetry/speed_probe.py): its trials' wall seconds, back to back."""

    at: str  # where in the run: "start", "after group 2", "end"
    time: str = Field(default_factory=now_iso)
    seconds: list[float] = Field(default_factory=list)


class MachineSpeed(BaseModel):
    """How fast this machine ran a fixed workload over the run: the probe's name (two runs compare only under one)
    and its timings, at the start, between server groups and at the end (a resume appends its own)."""

    workload: str
    probes: list[SpeedProbe] = Field(default_factory=list)

    def seconds(self) -> list[float]:
        """Every trial of every probe: the run's sample of the machine's speed."""
        return [s for p in self.probes for s in p.seconds if s > 0]


class Manifest(BaseModel):
    schema_version: int = SCHEMA_VERSION
    sweep_id: str
    created_at: str = Field(default_factory=now_iso)
    updated_at: str = Field(default_factory=now_iso)
    status: str = "running"  # running | complete | partial (a cell with failed requests) | interrupted | failed
    command_line: list[str] = Field(default_factory=list)
    settings: SweepSettings | None = None  # None for `dflash-bench run` folders: one cell, no sweep
    plan: list[CellPlan] = Field(default_factory=list)
    versions: dict[str, str | None] = Field(default_factory=dict)  # dflash_bench, git_revision, python, torch, ...
    hardware: Hardware = Field(default_factory=Hardware)
    models: Models = Field(default_factory=Models)
    servers: dict[str, ServerRecord] = Field(default_factory=dict)  # per engine-mode
    telemetry: str | None = None
    # the machine's speed over the run, probed (None: a folder written before it was, or a Slurm sweep)
    machine_speed: MachineSpeed | None = None
    notes: list[str] = Field(default_factory=list)

    def cell(self, cid: str) -> CellPlan:
        for c in self.plan:
            if c.cell_id == cid:
                return c
        raise KeyError(cid)
