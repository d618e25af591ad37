"""The mission's model at full size: `dflash-bench sweep` folders of a large pair's shape, into one results file.

On the GPU host (the vLLM bundle, plus transformers 5.12.1 for vLLM 0.25.1's Gemma 4; or the SGLang bundle):

    python -m benchmarks.peers.big_shape --pair gemma-4-31B-it --out WORK --data-dir DATA
    dflash-bench sweep --model WORK/gemma-4-31B-it --drafter WORK/gemma-4-31B-it-DFlash --engine vllm \\
        --runner process --gpu h100 --tensor-parallel-size 1 --suites gsm8k,mt-bench -c 1,8 -n 8 --max-tokens 128 \\
        --data-dir DATA --engine-arg=--load-format=dummy --engine-arg=--attention-backend=triton_attn ...

then, anywhere, each sweep folder into the results file (rows of the same run replaced):

    python -m benchmarks.peers.big_sweep --out benchmarks/results/gemma4_31b_h100.json SWEEP_FOLDER...

A row per cell: engine, mode, GPUs per server, tok/s and tok/s per GPU, TTFT and TPOT p50, the peak GPU memory
the telemetry saw (vLLM takes its whole --gpu-memory-utilization share at start), the share of prompt tokens
read from the prefix cache, a failed cell's reason, and how its first tokens came (`first_tokens`: the groups the
server prefilled together, as the client saw them). Each run keeps the sweep's command line and each
server's command, with this machine's paths cut to WORK.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from pathlib import Path

from pydantic import BaseModel, Field

from dflash_bench.report.card import device_of, weights_of, workload_of
from dflash_bench.metrics.definitions import summarize, ttft_ms
from dflash_bench.settings import SweepSettings
from dflash_bench.store import CellSettings, RequestRecord, SteadyPlan
from dflash_bench.store.folder import SweepDir


FIRST_TOKEN_GAP_MS = 5.0  # first tokens within this of the one before came with the same forward (a prefill group)


class FirstTokens(BaseModel):
    """Requests of a cell whose first tokens reached the client together (each within FIRST_TOKEN_GAP_MS of the one
    before): what the server prefilled in one forward, or one step, as the client saw it."""

    requests: int
    ttft_ms: float  # the median of theirs


class Row(BaseModel):
    engine: str
    mode: str
    suite: str
    concurrency: int
    gpus: int
    status: str
    tok_s: float | None
    tok_s_per_gpu: float | None
    ttft_ms_p50: float | None
    tpot_ms_p50: float | None
    peak_mem_mib: float | None  # the most any of the server's GPUs held over the cell
    prefix_cache_hit_rate: float | None
    tau: float | None
    reason: str | None = None  # a failed cell's
    synthetic_tau: float | None = None  # the builtin engine's --synthetic-acceptance: tau drawn, not measured
    synthetic_source: str | None = None  # where that tau came from, as the cell records it ("card gsm8k", "rates")
    steady: SteadyPlan | None = None  # a steady-stream cell (--steady-requests): its numbers are the window's
    repeat: int = 0  # a cell's repeats are rows of their own; a table's speedup is the median of their ratios
    input_len: int = 0  # the prompts' length in tokens on the --input-len axis (a long-<N> suite); 0: the suite's own
    ttft_ms_mean: float | None = None
    ttft_ms_p90: float | None = None
    ttft_ms_p50_later_turns: float | None = None  # a multi-turn suite's second and later turns alone (`later_turns`)
    server_queue_ms: float | None = None  # the server's own split of a request's time (metrics/phases.py), means
    server_prefill_ms: float | None = None
    first_tokens: list[FirstTokens] = Field(default_factory=list)  # in the order they came (`first_tokens`)


class Run(BaseModel):
    sweep_id: str
    device: str  # "2x NVIDIA H100 80GB HBM3"
    gpus_per_server: int
    command: str  # the sweep's command line
    servers: dict[str, str] = Field(default_factory=dict)  # engine-mode -> its command
    versions: dict[str, str] = Field(default_factory=dict)
    context_len: int | None = None
    weights: str = "real"  # report/card.weights_of: random (--load-format dummy), emulated (the emulator), real
    source: str = "folder"  # "console": read from the sweep's printed lines (mission.log), its folder lost
    workload: str = ""  # report/card.py workload_of: a --modes dflash run's DFlash is read against the AR of another run
    # a mixture's random weights (`routing_of`): "random", its servers drew each token's experts at random (each
    # engine's switch: profiles' routing_simulation); "alike", they routed as random weights do, every
    # token to the same few experts; None: a dense model, real weights, no server started, or a console's run
    routing: str | None = None
    rows: list[Row] = Field(default_factory=list)


class Results(BaseModel):
    """The file `--out`: one run per sweep folder, plus plans the harness refused before launch."""

    pair: str = "gemma-4-31B-it"
    weights: str = "random, of the real shape (--load-format dummy): timing and memory are real, acceptance is not"
    tokenizer: str = ""
    runs: list[Run] = Field(default_factory=list)
    refused: list[dict[str, str]] = Field(default_factory=list)  # {"command", "sentence"}
    measured: str = ""  # where, when and by which calls the runs were measured (--measured), for the tables' notes
    first_token_gap_ms: float = FIRST_TOKEN_GAP_MS  # the rule the rows' `first_tokens` were grouped by


PLACEHOLDERS = {"--data-dir": "DATA", "--out": "OUT"}


def routing_of(pair: str, weights: str, servers: list[tuple[str, list[str]]]) -> str | None:
    """How a run of `pair` routed a mixture's tokens (Run.routing), from the (engine, environment names) of the
    servers it started (None where it started none: nothing was routed)."""
    from dflash_bench import models, profiles
    from dflash_bench.model_shapes import pair_configs
    from dflash_bench.geometry import geometry

    shape = geometry(pair_configs(models.resolve(pair))[0])
    if weights != "random" or not (shape and shape.experts) or not servers:
        return None
    return "random" if all(profiles.get(e).routes_at_random(names) for e, names in servers) else "alike"


# where the machine that ran it installed Python packages (a bundle's unpacked site, a venv's site-packages): a
# traceback's file is named from its package on, as on any machine
SITE = re.compile(r"/[^\s\"']*?/(?:[\w.-]+-site|site-packages|dist-packages)/")


def shown(text: str, work: str) -> str:
    """`text` as any machine reads it: the shapes' folder as WORK/, a package's files from the package on."""
    return SITE.sub("", text.replace(work.rstrip("/") + "/", "WORK/") if work else text)


def run_of(folder: Path, pair: str) -> Run:
    manifest = json.loads((folder / "manifest.json").read_text())
    settings, servers = manifest.get("settings") or {}, manifest.get("servers", {})  # `dflash-bench run`: no settings
    # WORK: the folder big_shape wrote the shapes into (SGLang's copy of a target sits in WORK/sglang/, its drafter
    # in WORK), the longest path the model and the drafter share
    drafter = ((manifest.get("models") or {}).get("drafter") or {}).get("id")
    paths = [str(p) for p in (settings.get("model"), drafter) if p and Path(str(p)).is_absolute()]
    work = os.path.commonpath(paths) if len(paths) == 2 else str(Path(paths[0]).parent) if paths else ""
    argv = ["dflash-bench"] + [shown(a, work) for a in manifest["command_line"][1:]]
    for i, a in enumerate(argv[:-1]):  # the folders of the machine it ran on
        if a in PLACEHOLDERS:
            argv[i + 1] = PLACEHOLDERS[a]
    device = device_of(manifest.get("hardware") or {})
    gpus_used = max([s.get("gpus") or 1 for s in servers.values()] or [settings.get("tensor_parallel") or 1])
    versions = {k: str(v) for k, v in (manifest.get("versions") or {}).items() if isinstance(v, (str, int, float))}
    run = Run(sweep_id=manifest["sweep_id"], device=device, gpus_per_server=gpus_used, command=" ".join(argv),
              servers={k: " ".join(shown(a, work) for a in s.get("command", [])) for k, s in servers.items()},
              versions=versions, context_len=settings.get("context_len"),
              weights=weights_of(settings.get("engine_args") or [], (settings.get("engines") or [""])[0]),
              workload=workload_of(SweepSettings.model_validate(settings).model_dump(mode="json") if settings else None))
    run.routing = routing_of(pair, run.weights, [(s.get("engine") or key.split("-")[0], s.get("env_names") or [])
                                                 for key, s in servers.items()])
    reasons = {c["cell_id"]: c.get("reason") for c in manifest["plan"]}
    sweep = SweepDir(folder)
    for cell in manifest["plan"]:
        path = folder / "cells" / cell["cell_id"] / "summary.json"
        s = json.loads(path.read_text()) if path.is_file() else {}
        tok = s.get("output_throughput") if s.get("status") == "complete" else None
        records = sweep.read_requests(cell["cell_id"]) if tok else []
        run.rows.append(Row(
            engine=cell["engine"], mode=cell["mode"], suite=cell["suite"], concurrency=cell["concurrency"],
            gpus=gpus_used, status=s.get("status") or cell.get("status") or "pending", tok_s=tok,
            tok_s_per_gpu=tok / gpus_used if tok else None,
            ttft_ms_p50=(s.get("ttft_ms") or {}).get("p50"), tpot_ms_p50=(s.get("tpot_ms") or {}).get("p50"),
            peak_mem_mib=s.get("telemetry_mem_used_max_mib"), prefix_cache_hit_rate=s.get("prefix_cache_hit_rate"),
            tau=s.get("acceptance_length"),
            reason=None if tok else shown(s.get("failure_reason") or reasons.get(cell["cell_id"]) or "", work) or None,
            steady=CellSettings.model_validate(s.get("settings") or {}).steady,
            synthetic_tau=s.get("synthetic_acceptance"), synthetic_source=s.get("synthetic_source"),
            repeat=cell.get("repeat") or 0, input_len=cell.get("input_len") or 0,
            ttft_ms_mean=(s.get("ttft_ms") or {}).get("mean"), ttft_ms_p90=(s.get("ttft_ms") or {}).get("p90"),
            server_queue_ms=s.get("server_queue_ms"), server_prefill_ms=s.get("server_prefill_ms"),
            first_tokens=first_tokens(records), ttft_ms_p50_later_turns=later_turns(s, records) if tok else None))
    return run


def later_turns(summary: dict, records: list[RequestRecord]) -> float | None:
    """TTFT p50 of the cell's second and later turns: its summary's (`ttft_ms_later_turns`), or, in a folder written
    before summaries kept it, from its requests by the same definition (metrics/definitions.py summarize)."""
    if "ttft_ms_later_turns" in summary:
        stat = summary["ttft_ms_later_turns"]
    else:
        described = summarize(records)["ttft_ms_later_turns"]
        stat = described.model_dump() if described else None
    return (stat or {}).get("p50")


def first_tokens(records: list[RequestRecord]) -> list[FirstTokens]:
    """A cell's measured requests (warm-ups and failures left out) grouped by when their first token reached the
    client: sorted by that time, a new group wherever one came more than FIRST_TOKEN_GAP_MS after the one before."""
    came = sorted((r.t_first_token, ttft) for r in records
                  if r.ok and not r.warmup and r.t_first_token is not None and (ttft := ttft_ms(r)) is not None)
    groups: list[list[float]] = []
    for i, (at, ttft) in enumerate(came):
        if not i or (at - came[i - 1][0]) * 1e3 > FIRST_TOKEN_GAP_MS:
            groups.append([])
        groups[-1].append(ttft)
    return [FirstTokens(requests=len(g), ttft_ms=statistics.median(g)) for g in groups]


CELL_LINE = re.compile(r"^(?P<engine>[a-z]+)-(?P<mode>ar|dflash|eagle3)-(?P<suite>[a-z0-9-]+)-c(?P<c>\d+): "
                       r"(?P<tok>[\d,.]+) tok/s(?:  τ (?P<tau>[\d.]+))?  ok$")


def console_runs(text: str) -> list[Run]:
    """The sweeps a mission.sh console (mission.log) printed, where their folders did not come back: each `+ ...
    dflash_bench sweep` line and the cells it printed as they ended (tok/s and tau only: TTFT, TPOT and memory are
    in the lost folder), its sweep id from the `sweep folder:` line."""
    gpus = sum(1 for ln in text.splitlines() if ln.startswith("gpu: ")) // max(1, text.count("mission.sh: steps"))
    names = [ln[5:].split(",")[0] for ln in text.splitlines() if ln.startswith("gpu: ")]
    device = f"{gpus}x {names[0]}" if names else "no GPU"
    runs: list[Run] = []
    synthetic_of: list[float | None] = []  # each run's --synthetic-acceptance (its DFlash cells')
    for line in text.splitlines():
        if line.startswith("+ ") and " dflash_bench sweep " in line:
            argv = line[2:].split()
            work = str(Path(argv[argv.index("--model") + 1]).parent)
            tp = int(argv[argv.index("--tensor-parallel-size") + 1]) if "--tensor-parallel-size" in argv else 1
            engine_args = [a.split("=", 1)[1] for a in argv if a.startswith("--engine-arg=")]
            synthetic = next((float(a.split("=")[1]) for a in engine_args if a.startswith("--synthetic-acceptance=")), None)
            command = " ".join(["dflash-bench"] + [shown(a, work) for a in argv[3:]])
            runs.append(Run(sweep_id="", device=device, gpus_per_server=tp, command=command, source="console",
                            weights=weights_of(engine_args, argv[argv.index("--engine") + 1])))
            synthetic_of.append(synthetic)
        elif runs and (m := CELL_LINE.match(line)):
            tok = float(m["tok"].replace(",", ""))
            gpus_used = runs[-1].gpus_per_server
            synthetic = synthetic_of[-1]
            runs[-1].rows.append(Row(
                engine=m["engine"], mode=m["mode"], suite=m["suite"], concurrency=int(m["c"]), gpus=gpus_used,
                status="complete", tok_s=tok, tok_s_per_gpu=tok / gpus_used, ttft_ms_p50=None, tpot_ms_p50=None,
                peak_mem_mib=None, prefix_cache_hit_rate=None, tau=float(m["tau"]) if m["tau"] else None,
                synthetic_tau=synthetic if m["mode"] == "dflash" else None))
        elif runs and line.startswith("sweep folder: ") and not runs[-1].sweep_id:
            runs[-1].sweep_id = Path(line.split(": ", 1)[1].strip()).name
    return [r for r in runs if r.rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="*", type=Path, help="sweep folders")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--pair", help="the known pair whose shape the sweeps ran (a new file's; default gemma-4-31B-it)")
    ap.add_argument("--tokenizer", help="what the shape's tokenizer is (big_shape.py's `tokenizer`)")
    ap.add_argument("--console", type=Path, action="append", default=[],
                    help="a mission.sh console (mission.log) whose sweep folders did not come back: its printed cells")
    ap.add_argument("--measured", help="where, when and by which calls the sweeps ran (machine, commit, date, "
                                       "command), said under the file's tables")
    ap.add_argument("--refused", nargs=2, action="append", metavar=("COMMAND", "SENTENCE"), default=[],
                    help="a plan the harness refused before launch, and its sentence")
    args = ap.parse_args()
    res = Results.model_validate_json(args.out.read_text()) if args.out.exists() else Results()
    if args.pair:
        if args.out.exists() and res.pair != args.pair:
            sys.exit(f"{args.out} holds {res.pair}'s runs, not {args.pair}'s: give another --out")
        res.pair = args.pair
    if args.tokenizer:
        res.tokenizer = args.tokenizer
    if args.measured:
        res.measured = args.measured
    for folder in args.folders:
        if not (folder / "manifest.json").is_file():
            sys.exit(f"{folder} is not a sweep folder (no manifest.json)")
        run = run_of(folder, res.pair)
        res.runs = [r for r in res.runs if r.sweep_id != run.sweep_id] + [run]
    for log in args.console:
        for run in console_runs(log.read_text()):
            res.runs = [r for r in res.runs if r.sweep_id != run.sweep_id] + [run]
    for command, sentence in args.refused:
        res.refused = [r for r in res.refused if r["command"] != command] + [{"command": command, "sentence": sentence}]
    args.out.write_text(res.model_dump_json(indent=1) + "\n")
    print(f"{args.out}: {len(res.runs)} runs, {sum(len(r.rows) for r in res.runs)} rows")


if __name__ == "__main__":
    main()
