"""Schemas of a cell's files: its identity (CellKey), requests.jsonl, summary.json, server_metrics.json.

The quality checks' summaries live here too (they are fields of CellSummary): quality/ imports them, the
store never imports quality/.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# what a multi-turn cell's later turns carried of the earlier answers: the server's own, or empty text (random weights)
History = Literal["answers", "blank"]

SCHEMA_VERSION = 2  # 2: typed manifest sections; summary fields instead of `extra` (store/migrate.py reads 1)

Mode = Literal["ar", "dflash", "eagle3"]
# the modes that speculate: each is checked against its AR partner (the lossless check, accuracy's AR − mode)
SPECULATIVE: tuple[str, ...] = ("dflash", "eagle3")
# what tables, figures and the console call each mode
MODE_NAMES: dict[str, str] = {"ar": "AR", "dflash": "DFlash", "eagle3": "EAGLE-3"}


def mode_name(mode: str) -> str:
    """A mode as a reader names it (MODE_NAMES; an unknown mode as it is)."""
    return MODE_NAMES.get(mode, mode)
CellStatus = Literal["pending", "running", "complete", "partial", "failed"]
# a cell whose numbers exist: complete, or partial (some measured requests failed: its figures cover the others)
MEASURED: tuple[str, ...] = ("complete", "partial")


class CellKey(BaseModel):
    """What a cell is: the one place its identity is defined. Plans, summaries, the gate and the analysis
    all match cells through it, so a new axis (an input length, say) is a new field here and nowhere else.

    `cell_id` names the cell's folder: `<engine>-<mode>-<suite>-c<concurrency>[-think|-nothink][-r<repeat>]` unless given
    (`dflash-bench run` and tests may measure into a folder of another name). It is not part of the identity."""

    model_config = ConfigDict(frozen=True)

    cell_id: str = ""
    engine: str
    mode: str
    suite: str
    concurrency: int
    repeat: int = 0
    # the long-prompt axis (--input-len): tokens of context the cell's prompts carry, on the long-<N> suites
    # built from real text (longctx.py); None for a suite's own prompts (and every cell of older folders)
    input_len: int | None = None
    # --thinking both: the arm of the paired thinking comparison the requests asked for; None without the axis
    thinking_asked: bool | None = None

    # AR and DFlash cells of one pair differ only in the mode; the gate's samples only in the repeat
    PAIR_EXCLUDES: ClassVar[frozenset[str]] = frozenset({"cell_id", "mode"})
    SAMPLE_EXCLUDES: ClassVar[frozenset[str]] = frozenset({"cell_id", "repeat"})

    @model_validator(mode="before")
    @classmethod
    def _default_id(cls, data: Any) -> Any:
        required = [f for f, info in CellKey.model_fields.items() if info.is_required()]
        if isinstance(data, dict) and not data.get("cell_id") and all(f in data for f in required):
            data = {**data, "cell_id": cls.make_id(data)}
        return data  # without its identity it fails validation, naming the missing field

    @staticmethod
    def make_id(values: dict[str, Any]) -> str:
        base = f"{values['engine']}-{values['mode']}-{values['suite']}-c{values['concurrency']}"
        if values.get("thinking_asked") is not None:
            base += "-think" if values["thinking_asked"] else "-nothink"
        repeat = int(values.get("repeat") or 0)
        return base if repeat == 0 else f"{base}-r{repeat}"

    @classmethod
    def identity_fields(cls) -> tuple[str, ...]:
        return tuple(f for f in CellKey.model_fields if f != "cell_id")

    @classmethod
    def pair_fields(cls) -> list[str]:
        """The columns an AR cell and its DFlash cell share (analysis.pairs, lossless, accuracy)."""
        return [f for f in CellKey.model_fields if f not in cls.PAIR_EXCLUDES]

    @classmethod
    def sample_fields(cls) -> list[str]:
        """The columns the repeats of one cell share (the report averages over them, the gate samples them)."""
        return [f for f in CellKey.model_fields if f not in cls.SAMPLE_EXCLUDES]

    @property
    def key(self) -> CellKey:
        """The bare identity (canonical cell_id), hashable and comparable whatever the subclass."""
        return CellKey(**{f: getattr(self, f) for f in self.identity_fields()})

    def pair_key(self) -> tuple:
        return tuple(getattr(self, f) for f in self.pair_fields())

    def sample_of(self) -> CellKey:
        """The gate's unit: this cell with the repeat left out (repeats are its samples)."""
        return CellKey(**{f: getattr(self, f) for f in self.identity_fields() if f not in self.SAMPLE_EXCLUDES})

    @property
    def name(self) -> str:
        """`engine/mode/suite/cN` (plus `/rR` past repeat 0): how the gate names a cell."""
        parts = [self.engine, self.mode, self.suite, f"c{self.concurrency}"]
        return "/".join(parts + ([f"r{self.repeat}"] if self.repeat else []))

    def sort_key(self) -> tuple:
        return tuple(-1 if v is None else v for v in (getattr(self, f) for f in self.identity_fields()))


def cell_id(engine: str, mode: str, suite: str, concurrency: int, repeat: int = 0) -> str:
    """`<engine>-<mode>-<suite>-c<concurrency>[-r<repeat>]`; repeat 0 has no suffix."""
    return CellKey(engine=engine, mode=mode, suite=suite, concurrency=concurrency, repeat=repeat).cell_id


# ---------------------------------------------------------------- requests.jsonl


class RequestRecord(BaseModel):
    """One request as the client saw it. Times are seconds on the client's monotonic clock,
    relative to the cell's start, so records of one cell compare directly."""

    request_id: str
    prompt_id: str
    turn: int = 0
    warmup: bool = False
    t_send: float  # dispatch (the throughput window starts at the first one)
    t_write: float | None = None  # the request's bytes handed to the socket, after any connect: TTFT starts here
    # a new connection's TCP handshake, SYN to SYN-ACK as the kernel timed it (raw transport on Linux; None: not
    # measured, or `connection` "reused"), and the rest of its wait for the connection: the client's event loop
    # handing the connected socket over (aiohttp, httpx: the whole connect, the handshake not seen apart)
    connect_ms: float | None = None
    connect_wait_ms: float | None = None
    connection: Literal["new", "reused"] | None = None  # None: no connection was made (it failed to connect)
    t_first_byte: float | None = None  # first byte of the response body
    t_first_token: float | None = None  # first chunk that carried content
    t_end: float | None = None
    chunk_times: list[float] = Field(default_factory=list)
    chunk_tokens: list[int] = Field(default_factory=list)  # cumulative output tokens after each chunk
    chunk_tokens_from: Literal["usage", "text"] | None = None  # text: no per-chunk usage, spread by characters
    prompt_tokens: int | None = None  # from the server's usage, never counted by the client
    # of them, read from the server's prefix cache, where its response says (usage.prompt_tokens_details, or
    # SGLang's meta_info); None: not said
    cached_prompt_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None  # None means the request succeeded
    spec_verify_ct: int | None = None  # SGLang meta_info: verification steps of this request
    spec_accepted_tokens: int | None = None  # per-request accepted draft tokens where the server says
    spec_draft_tokens: int | None = None  # per-request drafted tokens where the server says (llama.cpp timings.draft_n)
    output_text: str | None = None
    token_ids: list[int] | None = None  # with --save-token-ids
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per position: [(id, logprob), ...] top-2

    @property
    def ok(self) -> bool:
        return self.error is None


# ---------------------------------------------------------------- server_metrics.json


class ServerMetrics(BaseModel):
    """/metrics scraped before and after the measured window: {'counters': {...}, 'gauges': {...}} each."""

    url: str
    before: dict[str, dict[str, float]] | None = None
    after: dict[str, dict[str, float]] | None = None
    delta: dict[str, float] | None = None
    error: str | None = None  # why a scrape failed

    @field_validator("before", "after", mode="before")
    @classmethod
    def _drop_nulls(cls, snapshot: Any) -> Any:
        """A non-finite sample was written as null before the scrape dropped them: null is no value, not corruption."""
        if isinstance(snapshot, dict):
            return {kind: {k: v for k, v in values.items() if v is not None} if isinstance(values, dict) else values
                    for kind, values in snapshot.items()}
        return snapshot


# ---------------------------------------------------------------- quality summaries (fields of CellSummary)


class LosslessSummary(BaseModel):
    """A DFlash cell's token-level lossless check against its AR partner (quality/lossless.py)."""

    status: str = "ok"  # "ok", or why nothing was compared
    ar_cell: str | None = None
    n: int = 0  # prompt turns compared
    identical: int = 0
    exact_match_rate: float | None = None
    near_tie_threshold_nats: float = 0.1  # AR top-1 minus top-2 logprob at or below this: a near-tie flip
    divergences: dict[str, int] = Field(default_factory=dict)  # kind -> count
    in_accepted_draft: int = 0  # divergences inside an accepted draft block
    at_target_token: int = 0  # divergences at a token the target itself produced (bonus / prefill)
    first_divergence: dict[str, float | int | None] = Field(default_factory=dict)  # n, min, p50, p90, mean, max
    divergence_histogram: dict[str, list[int]] = Field(default_factory=dict)  # lower bin edges, counts
    not_compared: dict[str, int] = Field(default_factory=dict)  # reason -> count
    examples: list[dict] = Field(default_factory=list)  # first divergences with raw text excerpts


class PairedDiff(BaseModel):
    n: int  # prompts scored in both cells
    ar_accuracy: float | None
    dflash_accuracy: float | None
    ar_minus_dflash: float
    ci_low: float
    ci_high: float
    both: int
    only_ar: int
    only_dflash: int
    neither: int
    method: str = "Newcombe paired square-and-add (1998, method 10)"


class AccuracySummary(BaseModel):
    """A cell's task accuracy with its Wilson interval (quality/accuracy.py)."""

    status: str = "ok"  # "ok", or why the cell was not scored
    metric: str = ""  # "exact" (answers) or "pass@1" (code)
    checker: str = ""
    n: int = 0
    correct: int = 0
    accuracy: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    level: float = 0.95
    interval: str = "wilson"
    not_scored: dict[str, int] = Field(default_factory=dict)
    isolation: dict[str, object] = Field(default_factory=dict)  # code suites: what the sandbox had
    vs_ar: PairedDiff | None = None


# ---------------------------------------------------------------- summary.json


class SteadyPlan(BaseModel):
    """A steady stream as asked (--steady-requests, --steady-ramp with the concurrency as its default): the window
    opens at the `ramp`-th completion and closes at the `ramp + requests`-th."""

    ramp: int  # completions before the window opens (the ramp-up)
    requests: int  # completions inside the window

    def label(self) -> str:
        """How the report and the results tables mark a cell measured this way (its numbers are the window's)."""
        return f"steady stream: a window of {self.requests} completions after a ramp-up of {self.ramp}"


class CellSettings(BaseModel):
    """How the client measured the cell (client/cell.py). Keys a newer client adds are kept (extra="allow")."""

    model_config = ConfigDict(extra="allow")

    api: str | None = None  # chat | completions | generate
    model: str | None = None  # the served model name requests named
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    num_prompts: int | None = None
    enable_thinking: bool | None = None
    save_token_ids: bool | None = None
    warmup: bool | None = None
    request_rate: float | None = None  # None: closed loop at the concurrency
    timeout_s: float | None = None
    transport: str | None = None
    prompt_rendering: str | None = None  # api generate or completions: who rendered the chat template
    ignore_eos: bool | None = None  # every request ran to max_tokens
    min_seconds: float | None = None  # --min-cell-seconds: the prompts were sent again until the window lasted this
    prompt_passes: int | None = None  # times the prompt list was sent (more than 1: lengthened by min_seconds)
    # what a later turn carried of the earlier answers: "answers" (the server's own) or "blank" (empty: random weights,
    # whose answers are each engine's own noise); None: written before it was recorded (the server's own)
    history: History | None = None
    # --steady-requests / --steady-ramp: a steady stream (client/loadgen.py), measured over a window of completions
    steady: SteadyPlan | None = None
    # --interleave: at concurrency 1 the cell's requests alternated one by one with its pair's (the other mode's
    # server), and its window is the time its own requests ran (metrics/definitions.py)
    interleaved: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _flat_steady(cls, data: Any) -> Any:
        """A summary.json written before `steady` was one object kept `steady_requests` and `steady_ramp` flat."""
        if isinstance(data, dict) and ("steady_requests" in data or "steady_ramp" in data):
            data = dict(data)
            requests, ramp = data.pop("steady_requests", None), data.pop("steady_ramp", None)
            if requests is not None and data.get("steady") is None:
                data["steady"] = {"ramp": ramp or 0, "requests": requests}
        return data


class SteadyWindow(SteadyPlan):
    """The measured window of a steady-stream cell (metrics/definitions.py `steady_window`): the concurrency held
    constant, each finished request replaced at once. Times are the records' (seconds from the cell's origin)."""

    t_open: float | None = None  # None: the stream ended before the window closed (the cell is failed)
    t_close: float | None = None
    ramp_requests: int = 0  # measured requests that ended at or before t_open (out of every statistic)
    cooldown_requests: int = 0  # measured requests that ended after t_close (the tail; out of every statistic)
    straddling_open: int = 0  # requests in flight at t_open that ended inside the window
    straddling_close: int = 0  # requests in flight at t_close (they end in the cool-down)
    stream_output_tokens: int = 0  # output tokens of every successful measured request, ramp and tail included


class Stat(BaseModel):
    """Distribution summary of one metric over a cell's measured requests (or tokens, or chunks)."""

    n: int
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    min: float | None = None
    max: float | None = None


class CellSummary(CellKey):
    """A cell's aggregates. Definitions live in dflash_bench.metrics (one place)."""

    model_config = ConfigDict(frozen=False)

    schema_version: int = SCHEMA_VERSION
    # partial: some measured requests failed, and failure_reason says how many and why (its throughput and latencies
    # cover the requests that succeeded); failed: nothing usable
    status: Literal["complete", "partial", "failed"] = "complete"
    failure_reason: str | None = None
    url: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    settings: CellSettings = Field(default_factory=CellSettings)

    num_requests: int = 0  # measured (warm-up excluded)
    num_ok: int = 0
    num_failed: int = 0
    num_warmup: int = 0
    duration_s: float | None = None  # last completion - first dispatch (a steady stream: its window's length)
    steady: SteadyWindow | None = None  # set when the cell was a steady stream measured over a window
    total_prompt_tokens: int = 0
    total_output_tokens: int = 0
    output_throughput: float | None = None  # tok/s
    request_throughput: float | None = None  # req/s

    ttft_ms: Stat | None = None
    # a multi-turn suite's second and later turns alone: their prompts hold the conversation so far, so what a
    # server's prefix cache saves (or a server without one pays) shows here; None where the cell has none
    ttft_ms_later_turns: Stat | None = None
    tpot_ms: Stat | None = None
    itl_ms: Stat | None = None  # per-token latency: chunk gaps divided over the tokens they carry
    chunk_gap_ms: Stat | None = None
    e2e_ms: Stat | None = None
    tok_s_user: Stat | None = None  # 1000 / TPOT per request
    tokens_per_chunk: Stat | None = None
    connect_ms: Stat | None = None  # TCP handshakes (SYN to SYN-ACK) of new connections (kept out of TTFT)
    connect_wait_ms: Stat | None = None  # the rest of new connections' wait: the client's event loop
    connections_reused: int | None = None  # measured requests sent on a connection opened before them

    acceptance_length: float | None = None  # tau; None when the server has no speculative counters
    acceptance_length_req_weighted: float | None = None
    acceptance_length_token_weighted: float | None = None
    acceptance_rate: float | None = None
    acceptance_per_position: list[float] | None = None
    acceptance_source: str | None = None  # vllm-metrics | sglang-meta | builtin-metrics | llamacpp-metrics | ...
    # the version of metrics/definitions.py's tau the server's counting was read by (TAU_DEFINITION; None: written
    # before it, when the builtin engine counted a last step's drafts cut at max_tokens)
    acceptance_definition: int | None = None
    acceptance_length_client: float | None = None  # the same tau from the stream, as a check (metrics/acceptance.py)
    acceptance_client_source: str | None = None  # chunks | timings
    num_drafts: int | None = None
    num_draft_tokens: int | None = None
    verify_width: float | None = None  # mean tokens verified per row and step, 1 + num_draft_tokens / num_drafts
    num_accepted_tokens: int | None = None
    # how the verify width was chosen (the builtin engine's /metrics): full (the whole block), auto (by load), w<N>
    width_policy: str | None = None
    verify_widths: dict[int, int] | None = None  # tokens verified per row (anchor + drafts) -> row-steps
    # the width-free acceptance profile: per draft position i, [drafts that verified positions 0..i, drafts that
    # accepted positions 0..i] (metrics/prometheus.py profile); tau at any width follows from it
    acceptance_profile: list[tuple[int, int]] | None = None
    # tau had every step verified the whole block, from the profile (None: a position was never verified)
    acceptance_length_full_block: float | None = None
    synthetic_acceptance: float | None = None  # set when the server ran with synthetic acceptance: its tau
    # the profile it drew (synthetic.py): per draft position the share of steps accepting that far, and its source
    synthetic_rates: list[float] | None = None
    synthetic_source: str | None = None
    # share of the measured prompt tokens the server read from its prefix cache (metrics/cache.py): a cell whose
    # prompts an earlier cell sent has that much of its prefill free; None where the server does not say
    prefix_cache_hit_rate: float | None = None
    prefix_cache_source: Literal["usage", "vllm-metrics"] | None = None
    # what the sweep did to a server's prefix cache before the cell (client/server_cache.py): "emptied (POST
    # PATH)", or "not emptied: WHY" (the cell was still measured); None where the engine keeps none between
    # requests, or the server is not one the sweep launched
    prefix_cache_reset: str | None = None
    # mean ms a finished request spent on the server by phase (metrics/phases.py), from vLLM's request histograms
    # over the window (the builtin engine exports the same): waiting to be scheduled, its prefill to the first
    # token, its decode; None where the server has none
    server_queue_ms: float | None = None
    server_prefill_ms: float | None = None
    server_decode_ms: float | None = None

    failures: dict[str, int] = Field(default_factory=dict)  # failure kind -> count of measured requests
    clock_origin_monotonic_s: float | None = None  # records' time origin on this host's time.perf_counter
    server_metrics_error: str | None = None  # why /metrics could not be scraped
    # figures that could not be measured, and why (e.g. itl_ms: the server sent no per-chunk usage)
    not_measured: dict[str, str] = Field(default_factory=dict)
    # a DFlash cell that shows no sign of speculation (no acceptance source, or tau ~ 1): the silent fallback to AR
    dflash_warning: str | None = None
    # what was checked that the server measured is the one launched, "; "-joined (ServerIdentity.summary)
    server_identity: str | None = None

    telemetry: str | None = None  # "on" or why it is off
    energy_j: float | None = None
    energy_source: str | None = None  # counter | integrated
    energy_valid: bool | None = None
    energy_note: str | None = None
    avg_power_w: float | None = None
    j_per_token: float | None = None
    tokens_per_j: float | None = None
    # the rest of telemetry.energy.EnergySummary (its extra_fields), the GPU state that explains the energy
    energy_counter_j: float | None = None
    energy_integrated_j: float | None = None
    telemetry_duration_s: float | None = None
    telemetry_peak_power_w: float | None = None
    telemetry_n_samples: int | None = None
    telemetry_max_gap_s: float | None = None
    telemetry_gpu_util_mean_pct: float | None = None
    telemetry_sm_clock_mean_mhz: float | None = None
    telemetry_temp_max_c: int | None = None
    telemetry_mem_used_max_mib: float | None = None
    telemetry_throttle_reasons: str | None = None  # ';'-joined
    telemetry_throttled_frac: float | None = None

    # thinking as the cell's rendered prompt shows it (thinking.record), not as the flag asked; the template's hash
    thinking: str | None = None  # on | off | unknown
    thinking_evidence: str | None = None
    template_hash: str | None = None
    lossless: LosslessSummary | None = None  # DFlash cells, after quality/lossless.py
    accuracy: AccuracySummary | None = None  # scorable suites, after quality/accuracy.py


STAT_FIELDS = ("ttft_ms", "ttft_ms_later_turns", "tpot_ms", "itl_ms", "chunk_gap_ms", "e2e_ms", "tok_s_user",
               "tokens_per_chunk", "connect_ms", "connect_wait_ms")
