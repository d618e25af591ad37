"""Every option of `sweep` declared once, as a typed field: its default, its flag, its help and its rule
(options.Flag). SweepSettings: what a sweep measures, which manifest.json stores (store/manifest.py); SlurmOptions:
what each job of `--executor slurm` asks the scheduler for. The command's parameters are made from these fields
(cli_options.py), and sweep/check.py checks them before anything launches.

Adding an option is adding a field here: a type, a default, `Flag(...)` with its help (and `text`/`parse` where the
command line's text is not the value itself, `rule` for what it cannot take). A field without a Flag is derived
(`context_len`) or set through another option's (`thinking_both`, by `--thinking both`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from dflash_bench.errors import UserError
from dflash_bench.options import Flag, ints, names
from dflash_bench.synthetic import check_setting, setting_refusal

STEADY_HELP = ("A steady stream: keep --concurrency requests in flight, each finished one replaced at once (the prompts "
               "cycled), and measure a window of this many completions after the ramp-up; the tail is left out.")
RAMP_HELP = "With --steady-requests: completions before the window opens (default: the concurrency)."
DEFAULT_MODES = ("ar", "dflash")
REQUEST_APIS = ("chat", "completions")  # what --api may ask of a chat engine
_LEN_RE = re.compile(r"^(\d+(?:\.\d+)?)([kK]?)$")


def parse_input_lens(text: str) -> list[int]:
    """"1k,4k,16k,32k" -> [1024, 4096, 16384, 32768]; plain numbers are tokens. Sorted, duplicates refused."""
    out = []
    for part in (text or "").split(","):
        m = _LEN_RE.match(part.strip())
        if not m:
            raise UserError(f"--input-len part {part.strip()!r} is not a token count: use e.g. 1k,4k,16k,32k or 2000.")
        n = int(float(m.group(1)) * (1024 if m.group(2) else 1))
        if n < 64:
            raise UserError(f"--input-len {part.strip()} is under 64 tokens: the documents alone need more.")
        if n in out:
            raise UserError(f"--input-len gives {part.strip()} twice: list each length once.")
        out.append(n)
    return sorted(out)


def thinking_choice(value: str) -> dict[str, Any]:
    """--thinking on|off|both -> the settings it sets (both: every cell with thinking off and on)."""
    v = value.strip().lower()
    if v not in ("on", "off", "both"):
        raise UserError(f"--thinking takes on, off or both, not {value!r}")
    return {"thinking_both": True} if v == "both" else {"thinking": v == "on"}


def gpu_types(value: str | None) -> list[str]:
    """--gpu-type h100,h200 -> ["h100", "h200"]: one sweep folder each."""
    return [t.strip() for t in (value or "").split(",") if t.strip()]


def _request_api(value: str | None) -> str | None:
    return None if value is None or value in REQUEST_APIS else f"--api takes {' or '.join(REQUEST_APIS)}, not {value!r}"


def _distinct_types(value: str) -> str | None:
    types = gpu_types(value)
    return "--gpu-type lists a GPU type twice" if len(set(types)) != len(types) else None


def _concurrencies(values: list[int]) -> str | None:
    if not values or any(c < 1 for c in values):
        return "--concurrency takes positive integers, e.g. 1,8,32"
    return "--concurrency lists a value twice" if len(set(values)) != len(values) else None


def _lengths(values: list[int]) -> str | None:
    if len(set(values)) != len(values) or any(n < 1 for n in values):
        return "--input-len takes distinct positive lengths, e.g. 1k,4k,16k"
    return None


class SweepSettings(BaseModel):
    """Everything that decides what a sweep measures, in the order `sweep --help` lists it. A resumed sweep must
    agree on all of it but RESUME_FREE."""

    model_config = ConfigDict(defer_build=True)  # built at first use: `dflash-bench --help` reads only the Flags

    model: Annotated[str, Flag(
        "--model", "-m",
        help="Short name (see `dflash-bench models`), Hugging Face id or local folder of the target.")]
    engines: Annotated[list[str], Flag(
        "--engine", text=str, parse=names,
        help="vllm, sglang, builtin, emulator or llamacpp; several comma-separated. Default builtin.",
    )] = Field(default_factory=lambda: ["builtin"])
    # stored by name; "all" (every suite but speed-bench, which needs a prepared copy: asked for by name) is named
    # before the plan (sweep/check.py resolve_suites)
    suites: Annotated[list[str], Flag(
        "--suites", text=str, parse=names, start=["all"],
        help="'all' (every suite but speed-bench) or a comma-separated list. Default all.")]
    concurrency: Annotated[list[int], Flag(
        "--concurrency", "-c", text=str, parse=ints, rule=_concurrencies,
        help="Comma-separated concurrencies. Default 1,8,32.",
    )] = Field(default_factory=lambda: [1, 8, 32])
    num_prompts: Annotated[int | None, Flag(  # per cell; None means max(concurrency, suite default)
        "--num-prompts", "-n", min=1, help="Prompts per cell (default max(16, 4 x concurrency)).")] = None
    waves: Annotated[int | None, Flag(  # sweep/prompts.py prompts_per_cell; None: --num-prompts alone
        "--waves", min=1,
        help="Prompts per cell: this many times its concurrency (at least --num-prompts), so that every concurrency "
             "holds its requests in flight that many times over.")] = None
    max_tokens: Annotated[int | None, Flag(  # None means each suite's default
        "--max-tokens", min=1, help="Output cap per request (default: each suite's, 2048).")] = None
    repeats: Annotated[int, Flag(
        "--repeats", min=1, help="Measure every cell this many times (modes alternate to cancel drift).")] = 1
    # both servers of an engine up together and the cells in pairs, AR then DFlash per (suite, concurrency), so
    # that a change of the machine's speed lands on both sides of each comparison (else each mode's cells in a row)
    paired: Annotated[bool, Flag(
        "--paired",
        help="Run each engine's AR and DFlash servers together and measure every cell AR then DFlash, seconds apart "
             "(both must fit the machine at once; the DFlash server takes a free port).")] = False
    # each concurrency-1 pair of cells measured request by request, AR and DFlash alternately (client/interleave.py)
    interleave: Annotated[bool, Flag(
        "--interleave",
        help="With --paired: measure each concurrency-1 cell's AR and DFlash requests alternately, one by one, so that "
             "the machine's speed moving within seconds lands on both alike (a small or shared machine); each cell's "
             "throughput is over its own requests' time, and no energy is measured for these cells.")] = False
    gpu: Annotated[str, Flag(  # preset name for engine flags
        "--gpu",
        help="Engine flag preset: h100, h200, b300 or generic (also h20, hopper, b200, gb200, gb300, blackwell); a "
             "named GPU also sizes the servers for the plan (context limit, memory fraction) and refuses a plan that "
             "cannot fit.")] = "generic"
    tensor_parallel: Annotated[int | None, Flag(  # GPUs per launched server (None: the flags' or one)
        "--tensor-parallel-size", "--tp", min=1, help="GPUs per vLLM or SGLang server (tensor parallel).")] = None
    # the servers each engine runs, AR first; eagle3 adds an EAGLE-3 server (the pair's head, or --eagle3 in
    # engine_options) beside DFlash's; which modes there are: profiles/base.py MODES (sweep/check.py)
    modes: Annotated[list[str], Flag(
        "--modes", text=str, parse=names,
        help="The servers each engine runs, comma-separated: ar, dflash, and eagle3 (an EAGLE-3 head beside DFlash's "
             "drafter, on vllm). Default ar,dflash.",
    )] = Field(default_factory=lambda: list(DEFAULT_MODES))
    # a mean tau or "card" (synthetic.py): every DFlash (and EAGLE-3) server draws that acceptance profile instead of
    # verifying (CellPlan.synthetic, per suite); the engines that cannot are refused by sweep/commands.py
    synthetic_acceptance: Annotated[str | None, Flag(
        "--synthetic-acceptance", parse=check_setting, rule=setting_refusal, shown="--synthetic-acceptance",
        help="Benchmarking random weights: every DFlash server draws this acceptance instead of verifying (answers "
             "are wrong on purpose), one profile for every engine (vllm, builtin with --engine-arg=--fast, emulator; "
             "sglang and llamacpp have none): a mean tau, or 'card' for each suite's tau from the model card (a suite "
             "the card has no row for: the mean of its suites).")] = None
    engine_options: Annotated[dict[str, Any], Flag(  # e.g. builtin: target/drafter dirs, device
        "--drafter", text=str, fills=lambda drafter: {"engine_options": {"drafter": drafter}},
        help="DFlash drafter (HF id or folder) when --model is not a known pair.",
    ), Flag(
        "--eagle3", text=str, fills=lambda head: {"engine_options": {"eagle3": head}},
        help="EAGLE-3 head (HF id or folder) for the eagle3 mode, where the pair has none known or to use another.",
    )] = Field(default_factory=dict)
    runner: Annotated[str, Flag(  # not given: process where every engine runs as one, else docker (sweep/check.py)
        "--runner", help="docker or process (default: docker for vllm/sglang, process for builtin/emulator).",
    )] = "docker"
    image: Annotated[str | None, Flag(  # None: the engine's pinned one
        "--image", help="Container image (overrides the engine's default).")] = None
    port: Annotated[int | None, Flag(  # None: a free port per server, taken at launch (sweep/launch.py)
        "--port", min=1, max=65535, help="Port of the launched servers (default: a free port for each).")] = None
    engine_args: Annotated[list[str], Flag(
        "--engine-arg", text=list[str], help="Extra server argument, passed through (repeatable).",
    )] = Field(default_factory=list)
    url_ar: Annotated[str | None, Flag(
        "--url-ar", help="Measure this running AR server instead of launching one.")] = None
    url_dflash: Annotated[str | None, Flag(
        "--url-dflash", help="Measure this running DFlash server instead of launching one.")] = None
    expect_model: Annotated[str | None, Flag(  # launch/identity.py
        "--expect-model",
        help="Model id every server must list on /v1/models (checked at launch or at --url-*, refused otherwise).",
    )] = None
    # None: each engine's own (profiles/base.py EngineProfile.api: chat; SGLang's native generate)
    api: Annotated[str | None, Flag(
        "--api", rule=_request_api,
        help="What the chat engines' requests are: chat (the default: the server renders the chat template) or "
             "completions (the target's chat template rendered here and sent to /v1/completions, for a server that "
             "would render chats its own way, e.g. vLLM's Harmony for gpt-oss).")] = None
    temperature: Annotated[float, Flag(
        "--temperature", min=0.0, help="Sampling temperature (default 0).")] = 0.0
    seed: Annotated[int, Flag("--seed", help="Seed of the prompt sampling (default 0).")] = 0
    thinking: Annotated[bool | None, Flag(  # None means the model pair's default
        "--thinking", text=str, fills=thinking_choice, shown="--thinking on|off|both",
        help="Chat-template thinking: on, off, or both (every cell twice, a paired comparison); default: the pair's.",
    ), Flag("--no-thinking", text=bool, fills=lambda _: {"thinking": False}, excludes="--thinking",
            help="The same as --thinking off.")] = None
    thinking_both: bool = False  # --thinking both: every cell with thinking off and on (CellKey.thinking_asked)
    save_token_ids: Annotated[bool, Flag(
        "--save-token-ids", help="Keep output token ids for the lossless check.")] = False
    input_lens: Annotated[list[int], Flag(  # one long-<N> suite per length
        "--input-len", text=str, parse=parse_input_lens, rule=_lengths,
        help="Long-prompt axis: one long-<N> suite per length, prompts of about N tokens of real text with a question "
             "at the end, e.g. 1k,4k,16k.",
    )] = Field(default_factory=list)
    slo: Annotated[str | None, Flag(  # as given: how the end of the sweep, the report and the gate read it off
        "--slo",
        help="Interactivity target read off at the end: tok/s/user, and optional TTFT/TPOT p90 caps, e.g. "
             "'tok_s_user=30,tpot_p90_ms=40' or just 30 (saved for report and gate).")] = None
    # each cell a steady stream measured over a window of completions (None: a closed batch of its prompts)
    steady_requests: Annotated[int | None, Flag("--steady-requests", min=1, help=STEADY_HELP)] = None
    steady_ramp: Annotated[int | None, Flag("--steady-ramp", min=0, help=RAMP_HELP)] = None
    # each cell's prompts are sent again until its measured window lasts this long (energy)
    min_cell_seconds: Annotated[float, Flag(
        "--min-cell-seconds", min=0.0,
        help="Send each cell's prompts again until its measured window lasts this long, so that its GPU energy can "
             "be measured (a cell shorter than ~1 s has too few telemetry samples).")] = 0.0
    context_len: int | None = None  # the context limit derived from the plan for a known GPU (sweep/fit.py)

    # settings that may change between a run and its resume without changing what is measured
    RESUME_FREE: ClassVar[frozenset[str]] = frozenset({"runner", "port", "url_ar", "url_dflash", "slo", "expect_model"})

    def identity(self) -> dict[str, Any]:
        out = {k: v for k, v in self.model_dump().items() if k not in self.RESUME_FREE}
        if out.get("modes") == list(DEFAULT_MODES):  # what a manifest written before --modes measured
            del out["modes"]
        return out


class SlurmOptions(BaseModel):
    """What each job asks the scheduler for, each `sweep --executor slurm` option declared once (options.Flag).
    None leaves the cluster's default."""

    model_config = ConfigDict(defer_build=True)

    partition: Annotated[str | None, Flag("--partition", help="Slurm partition of the jobs.")] = None
    account: Annotated[str | None, Flag("--account", help="Slurm account the jobs are charged to.")] = None
    time: Annotated[str | None, Flag("--time", help="Slurm time limit of each job, e.g. 04:00:00.")] = None
    gpus_per_node: Annotated[int | None, Flag(  # None: each server's tensor-parallel size (0 for the emulator)
        "--gpus-per-node", min=0,
        help="GPUs per job (default: the server's tensor-parallel size; 0 for the emulator).")] = None
    gpu_type: Annotated[str | None, Flag(  # gres type: --gres=gpu:h100:N; several: one sweep folder each (gpu_types)
        "--gpu-type", rule=_distinct_types, help="Slurm gres GPU type, e.g. h100: jobs ask for gpu:h100:N.")] = None
    sbatch_args: Annotated[list[str], Flag(  # anything else (--cpus-per-task, --mem, --qos), passed through
        "--sbatch-arg", text=list[str],
        help="Extra sbatch option for every job, e.g. --sbatch-arg=--qos=high (repeatable).",
    )] = Field(default_factory=list)
    poll_s: Annotated[float, Flag(
        "--poll-s", min=0.1, hidden=True, help="Seconds between job state checks (default 5).")] = 5.0
