"""Schema of manifest.json: the sweep's settings, its plan, and where its numbers come from.

Provenance sections keep keys this version does not name (extra="allow"): a manifest rewritten on resume
by this version must not drop what a newer launcher recorded.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from dflash_bench.store.cells import SCHEMA_VERSION, CellKey, CellStatus
from dflash_bench.store.timestamps import now_iso


DEFAULT_MODES = ("ar", "dflash")


class SweepSettings(BaseModel):
    """Everything that decides what a sweep measures. A resumed sweep must agree on all of it."""

    model: str
    engines: list[str] = Field(default_factory=lambda: ["builtin"])
    suites: list[str]
    concurrency: list[int] = Field(default_factory=lambda: [1, 8, 32])
    num_prompts: int | None = None  # per cell; None means max(concurrency, suite default)
    max_tokens: int | None = None  # None means each suite's default
    repeats: int = 1
    # both servers of an engine up together and the cells in pairs, AR then DFlash per (suite, concurrency), so
    # that a change of the machine's speed lands on both sides of each comparison (else each mode's cells in a row)
    paired: bool = False
    # --interleave (with paired): each concurrency-1 pair of cells measured request by request, AR and DFlash
    # alternately (client/interleave.py), so that the machine's speed moving within seconds lands on both alike
    interleave: bool = False
    temperature: float = 0.0
    seed: int = 0
    thinking: bool | None = None  # None means the model pair's default
    thinking_both: bool = False  # --thinking both: every cell with thinking off and on (CellKey.thinking_asked)
    gpu: str = "generic"  # preset name for engine flags
    runner: str = "docker"  # docker | process
    port: int | None = None  # port of launched servers (None: the engine's default)
    image: str | None = None  # container image of launched servers (None: the engine's pinned one)
    url_ar: str | None = None
    url_dflash: str | None = None
    save_token_ids: bool = False
    engine_args: list[str] = Field(default_factory=list)
    engine_options: dict[str, Any] = Field(default_factory=dict)  # e.g. builtin: target/drafter dirs, device
    input_lens: list[int] = Field(default_factory=list)  # --input-len: one long-<N> suite per length
    slo: str | None = None  # --slo as given: how the end of the sweep, the report and the gate read it off
    # --min-cell-seconds: each cell's prompts are sent again until its measured window lasts this long (energy)
    min_cell_seconds: float = 0.0
    # --steady-requests / --steady-ramp: each cell a steady stream measured over a window of completions (None: a
    # closed batch of its prompts)
    steady_requests: int | None = None
    steady_ramp: int | None = None
    tensor_parallel: int | None = None  # --tensor-parallel-size: GPUs per launched server (None: the flags' or one)
    context_len: int | None = None  # the context limit derived from the plan for a known GPU (sweep/fit.py)
    expect_model: str | None = None  # --expect-model: the model id every server must list (launch/identity.py)
    # --modes: the servers each engine runs, AR first; eagle3 adds an EAGLE-3 server (the pair's head, or --eagle3
    # in engine_options) beside DFlash's
    modes: list[str] = Field(default_factory=lambda: list(DEFAULT_MODES))

    # settings that may change between a run and its resume without changing what is measured
    RESUME_FREE: ClassVar[frozenset[str]] = frozenset({"runner", "port", "url_ar", "url_dflash", "slo", "expect_model"})

    def identity(self) -> dict[str, Any]:
        out = {k: v for k, v in self.model_dump().items() if k not in self.RESUME_FREE}
        if out.get("modes") == list(DEFAULT_MODES):  # what a manifest written before --modes measured
            del out["modes"]
        return out


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
    notes: list[str] = Field(default_factory=list)

    def cell(self, cid: str) -> CellPlan:
        for c in self.plan:
            if c.cell_id == cid:
                return c
        raise KeyError(cid)
