"""Every table of numbers in README.md and docs/results/*.md, generated from benchmarks/results/*.json.

    python -m benchmarks.tables           # rewrite each page's generated blocks from the results files
    python -m benchmarks.tables --check   # exit 1, naming each block that differs from what its results give

A page keeps its prose by hand and its numbers in generated blocks:

    <!-- table:NAME -->
    ...written by this script: the table, then which results file and which command gave it...
    <!-- /table:NAME -->

Only the text between a block's two markers is rewritten. A marker with no entry in TABLES, an entry whose
block is missing from its page, and a results file that is missing are errors (one sentence, exit 2).

Adding a table is one function and one small entry in TABLES:

    Entry("my_table", "docs/results/topic.md", ("my_results.json",),
          "python -m benchmarks.<group>.my_bench --out benchmarks/results/my_results.json", tr.my_table)

where `my_table(results)` in benchmarks/tables/renderers.py (renderers_gpu.py for a GPU family, renderers_mission.py for big_sweep's files) gets the
loaded JSON of each source, in order, and returns a Table (a header, rows of strings and optional lines printed
under it); then put the two markers
where the table goes and run `python -m benchmarks.tables`. The command is the one that wrote the results
file, as it runs today; give None when the file records its own (`command`, or one per run) and that still runs. The machine is read from the file's
`device` (or `machine`) unless the entry names it.

A table measured on a GPU host by commands a later session runs waits in AWAITING: left out until all its sources
are in benchmarks/results/, then rendered as an entry of TABLES. An AWAITING entry with `awaiting` (each source's
calls) is made from the sources that are there, the renderer given None for each missing one, and its block says
which are awaited and by which calls; its page holds its block from the start.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.tables import renderers as tr
from benchmarks.tables import renderers_claims as claims
from benchmarks.tables import renderers_gpu as gpu
from benchmarks.tables import renderers_mission as mission
from benchmarks.tables.renderers import Table, TablesError

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path("benchmarks") / "results"
BLOCK = re.compile(r"<!-- table:([a-z0-9_]+) -->\n(.*?)<!-- /table:\1 -->", re.S)
MARKER = re.compile(r"<!-- /?table:([a-z0-9_]+) -->")



@dataclass
class Entry:
    name: str  # the block's marker: <!-- table:NAME -->
    page: str  # relative to the repository root
    sources: tuple[str, ...]  # files under benchmarks/results/
    command: str | None  # what wrote the sources; None: the first source's `command`, or each of its runs' `command`
    render: Callable[[list[Any]], Table]
    machine: str | None = None  # else the first source's `device` / `machine`
    awaiting: dict[str, str] | None = None  # source -> the calls that write it: render from the sources there


# The demo's repeated runs (benchmarks/harness/gate_reruns.py runs the demo and gates the runs against each other),
# the range README states and docs/results/demo.md details.
DEMO = "gate_reruns_cpu.json"

# The mission's four sweeps on two H200s (benchmarks/peers/big_sweep.py's file): the engines side by side with 128
# tokens out in docs/results/gemma-4-31b.md.
MISSION_H200 = "gemma4_31b_mission_h200.json"
MISSION_H200_COMMAND = ("bash benchmarks/peers/mission.sh --gpu h200 --tp 2 -n 4 vllm|sglang|builtin builtin-tau (a call "
                        "each, as the file's measured says), then python -m benchmarks.peers.big_sweep --out "
                        "benchmarks/results/gemma4_31b_mission_h200.json SWEEP_FOLDER...")
MISSION_H200_MACHINE = "two NVIDIA H200 on one host (nvidia-h200-x2), a call per engine"

# The mission's command whole: six suites, 1024 tokens out, two waves at c=32, every engine's AR and DFlash (the random
# drafter's and the card's tau) on two H200s at tensor parallel 2, the sweeps resumed across calls and sessions: the
# README's headline (the card's tau, a row per suite and concurrency) and the docs' table (every row).
MISSION_SIX_H200 = "gemma4_31b_six_suites_h200.json"
MISSION_SIX_H200_COMMAND = ("bash benchmarks/peers/mission.sh --gpu h200 --tp 2 -n 2 --waves 2 --max-tokens 1024 --suites "
                            "math500,gsm8k,humaneval,mbpp,mt-bench,spec-bench --modes ar vllm vllm-tau builtin builtin-tau, "
                            "and with --modes dflash vllm builtin (the random drafter; calls as the file's measured says), "
                            "then python -m benchmarks.peers.big_sweep --out "
                            "benchmarks/results/gemma4_31b_six_suites_h200.json SWEEP_FOLDER...")
MISSION_SIX_H200_MACHINE = "two NVIDIA H200 on one host (nvidia-h200-x2), tensor parallel 2"

# vLLM and the builtin engine at the card's tau, drawn with one profile for both, on one H200 (big_sweep's file of
# the four sweeps: each engine's AR, and its DFlash alone at the card's tau): the docs' table.
MISSION_TAU_H200 = "gemma4_31b_card_tau_h200.json"
MISSION_TAU_H200_COMMAND = ("bash benchmarks/peers/mission.sh --gpu h200 --tp 1 -n 2 --waves 2 --max-tokens 1024 --suites "
                            "gsm8k --modes ar vllm vllm-tau builtin builtin-tau (two calls, as the file's measured says), "
                            "then python -m benchmarks.peers.big_sweep --out benchmarks/results/gemma4_31b_card_tau_h200.json "
                            "SWEEP_FOLDER...")
MISSION_TAU_H200_MACHINE = "one NVIDIA H200 (nvidia-h200), tensor parallel 1"

# DFlash as prompts grow (the long-<N> suites of --input-len), vLLM and the builtin engine on one H200
INPUT_LEN_H200 = "gemma4_31b_input_len_h200.json"
INPUT_LEN_H200_COMMAND = ("bash benchmarks/peers/mission.sh --gpu h200 --tp 1 -n 2 vllm-long builtin-long (three calls, as the "
                          "file's measured says), then python -m benchmarks.peers.big_sweep --out "
                          "benchmarks/results/gemma4_31b_input_len_h200.json SWEEP_FOLDER...")

TABLES: list[Entry] = [
    Entry("demo_summary", "README.md", (DEMO,), None, tr.demo_summary),
    Entry("mission_six_suites", "README.md", (MISSION_SIX_H200,), MISSION_SIX_H200_COMMAND, mission.mission_by_suite,
          machine=MISSION_SIX_H200_MACHINE),
    Entry("demo_runs", "docs/results/demo.md", (DEMO,), None, tr.demo_runs),
    Entry("cpu_anatomy", "docs/results/demo.md", ("cpu_anatomy_cpu.json",),
          "python -m benchmarks.speed.cpu_anatomy --out benchmarks/results/cpu_anatomy_cpu.json", tr.cpu_anatomy),
    Entry("cpu_step_costs", "docs/results/cpu-fast-path.md", ("cpu_step_cpu.json",),
          "python -m benchmarks.speed.cpu_step --draft-shapes 1x256,2x768 --out F (its arguments are the file's `args`)", tr.cpu_step_costs),
    Entry("resume_speed_cpu", "docs/results/cpu-fast-path.md", ("resume_speed_cpu.json",),
          "python -m benchmarks.speed.resume_speed --model dflash_bench/assets/default_pair/target --rows 1,8,32 "
          "--context 1024 --new 64 --out benchmarks/results/resume_speed_cpu.json", tr.resume_speed),
    Entry("cpu_throughput", "docs/results/cpu-fast-path.md", ("cpu_step_cpu_tput.json", "serve_speed_cpu_pair.json"),
          "python -m benchmarks.speed.cpu_step --draft-shapes 1x256 --skip-steps --rounds 5 --steps 12 --out F; "
          "python -m benchmarks.speed.serve_speed --shape pair --draft-shape 1x256 --device cpu --data-dir DATA "
          "--concurrency 1,8,32 --tau 4 --new-tokens 256 --prompts-per-slot 2 --step-ahead on --cut-draft both --out F",
          tr.cpu_throughput),
    Entry("cpu_drafter_shapes", "docs/results/cpu-fast-path.md", ("cpu_step_cpu_shapes.json",),
          "python -m benchmarks.speed.cpu_step --draft-shapes 1x256,1x512,1x768,2x256,2x512,2x768 --batches 1 --widths 2,3,4,6,8 "
          "--draft cut --skip-throughput --out F", tr.cpu_drafter_shapes),
    Entry("cpu_real_pair", "docs/results/cpu-fast-path.md", ("cpu_step_cpu_real_pair.json",),
          "python -m benchmarks.speed.cpu_step --real --real-cut --data-dir DATA --batches 1 --draft-shapes 1x512 --skip-throughput --out F",
          tr.cpu_real_pair),
    Entry("engines_h100", "docs/results/engines-one-gpu.md", ("real_engines_h100_builtin_vllm.json",),
          "python -m benchmarks.peers.real_engines shape --engines builtin,inprocess,vllm --modes ar,dflash "
          "--fresh-prompts --data-dir .data", gpu.engines_h100),
    Entry("engines_three_h100", "docs/results/engines-one-gpu.md", ("real_engines_h100_three_engines.json",),
          "python -m benchmarks.peers.real_engines shape --engines sglang --fresh-prompts --data-dir .data "
          "(SGLang's bundle), then the same with --engines builtin,vllm (vLLM's bundle)", gpu.engines_three),
    Entry("two_clients_h200_rows", "docs/results/engines-one-gpu.md", ("two_clients_h200_rows.json",), None,
          gpu.two_clients),
    Entry("pair_retrained_h100", "docs/results/engines-one-gpu.md", ("real_engines_h100_pair_retrained.json",),
          "python -m benchmarks.peers.real_engines pair --engines vllm,builtin-fast --concurrency 1,8 --data-dir .data",
          gpu.pair_retrained),
    Entry("gemma4_31b_h100", "docs/results/gemma-4-31b.md", ("gemma4_31b_h100.json",), None, mission.big_shape,
          machine="one NVIDIA H100 80GB HBM3 (nvidia-h100-x1) and two on one host (nvidia-h100-x2), each a fresh machine"),
    Entry("gemma4_31b_mission", "docs/results/gemma-4-31b.md", ("gemma4_31b_mission.json",), None, mission.mission_card,
          machine="two NVIDIA H100 80GB HBM3 on one host (nvidia-h100-x2), two calls"),
    Entry("gemma4_31b_card_tau_h200", "docs/results/gemma-4-31b.md", (MISSION_TAU_H200,), MISSION_TAU_H200_COMMAND,
          mission.mission_engines, machine=MISSION_TAU_H200_MACHINE),
    Entry("gemma4_31b_input_len_h200", "docs/results/gemma-4-31b.md", (INPUT_LEN_H200,), INPUT_LEN_H200_COMMAND,
          mission.mission_engines, machine=MISSION_TAU_H200_MACHINE),
    Entry("gemma4_31b_input_len_h200_by_length", "docs/results/gemma-4-31b.md", (INPUT_LEN_H200,),
          INPUT_LEN_H200_COMMAND, mission.mission_lengths, machine=MISSION_TAU_H200_MACHINE),
    Entry("gemma4_31b_six_suites_h200", "docs/results/gemma-4-31b.md", (MISSION_SIX_H200,), MISSION_SIX_H200_COMMAND,
          mission.mission_engines, machine=MISSION_SIX_H200_MACHINE),
    Entry("gemma4_31b_engines_h200", "docs/results/gemma-4-31b.md", (MISSION_H200,), MISSION_H200_COMMAND,
          mission.mission_engines, machine=MISSION_H200_MACHINE),
    Entry("two_clients_gemma_vllm", "docs/results/gemma-4-31b.md", ("two_clients_gemma_vllm_h100.json",), None,
          gpu.two_clients),
    Entry("gemma4_31b_fast", "docs/results/gemma-4-31b.md", ("gemma4_31b_fast_h100.json",),
          "python -m benchmarks.speed.gemma_fast --json OUT.json --slots 8 --max-len 1024 --batches 1,8 --modes ar; "
          "then, on the same warm machine, the same with --modes dflash", gpu.gemma_fast),
    Entry("gemma4_31b_first_token_h200", "docs/results/gemma-4-31b.md", ("gemma4_31b_first_token_h200.json",),
          "bash benchmarks/peers/mission.sh --gpu h200 --tp 1 -n 2 --waves 2 --max-tokens 1024 --suites gsm8k --modes ar "
          "--seconds 560 vllm builtin (and --seconds 270 builtin at ac65d11; at 26f8c5a --suites gsm8k,mt-bench -c 32 "
          "--seconds 560 --parallel builtin vllm, then --tp 2 --seconds 215 builtin; at 07e3a04 --tp 2 --seconds 330 "
          "builtin), then python -m "
          "benchmarks.peers.big_sweep --out benchmarks/results/gemma4_31b_first_token_h200.json SWEEP_FOLDER...",
          mission.first_tokens,
          machine="one NVIDIA H200 (nvidia-h200; runs 4-7 on nvidia-h200-x2: one GPU per server, or both at tensor "
                  "parallel 2)"),
    Entry("gemma4_31b_prefill_anatomy_h200", "docs/results/gemma-4-31b.md",
          ("gemma4_31b_prefill_anatomy_h200.json", "gemma4_31b_prefill_anatomy_h200_own_keys.json",
           "gemma4_31b_prefill_anatomy_h200_packed.json", "gemma4_31b_prefill_anatomy_h200_tp2.json"),
          "python -m benchmarks.speed.gemma_fast --json OUT/FILE --modes ar --slots 32 --max-len 1024 --batches 32 "
          "--prefill 1x64,18x112,13x105,31x112 --anatomy, at 3cf1a7a and at ac65d11; at 11f6d99 with "
          "--prefill 1x64,18x112,18x62-112,13x60-105; at 010feec with --prefill 1x64,8x60-100,11x60-110,18x62-112,"
          "31x62-112 --anatomy --host --tensor-parallel-size 2", gpu.gemma_prefill_anatomy,
          machine="one NVIDIA H200 (nvidia-h200), each file a call; the last on two H200s of one host (nvidia-h200-x2)"),
    Entry("gemma4_31b_prefill_h200", "docs/results/gemma-4-31b.md", ("gemma4_31b_prefill_h200.json",),
          "python -m benchmarks.speed.gemma_fast --json OUT/gemma4_31b_prefill_h200.json --modes ar --slots 32 "
          "--max-len 1024 --batches 32 --prefill 1x64,7x96,13x112,18x112,31x112,18x64,31x64", gpu.gemma_prefill),
    Entry("engine_speed", "docs/results/fast-path-gpu.md", ("engine_speed_h100.json", "engine_speed_h200.json"),
          "python -m benchmarks.speed.engine_speed --out engine_speed.json --torch-path", gpu.engine_speed,
          machine="one NVIDIA H100 80GB HBM3 and one NVIDIA H200, each a fresh machine"),
    Entry("rows_anatomy_h200", "docs/results/fast-path-gpu.md", ("rows_anatomy_h200.json",), None, gpu.rows_anatomy),
    Entry("gemm_tuning", "docs/results/fast-path-gpu.md", ("gemm_tuning_h100.json",),
          "python -m benchmarks.speed.gemm_tuning --out F", gpu.gemm_tuning),
    Entry("step_anatomy", "docs/results/fast-path-gpu.md", ("step_anatomy_h100.json",),
          "python -m benchmarks.speed.step_anatomy --out step_anatomy.json", gpu.step_anatomy),
    Entry("engine_speed_adaptive", "docs/results/fast-path-gpu.md", ("engine_speed_h100_adaptive.json",),
          "python -m benchmarks.speed.engine_speed --out F --soak 300 --hf-tokens 16", gpu.engine_speed_adaptive),
    # the same command before and after one scheduler took every step's decisions: tokens and speed unchanged within noise
    Entry("engine_speed_scheduler", "docs/results/fast-path-gpu.md",
          ("engine_speed_h100_adaptive.json", "engine_speed_h100_scheduler.json"),
          "python -m benchmarks.speed.engine_speed --out F --soak 300 --hf-tokens 16 (each)", gpu.engine_speed_before_after),
    Entry("serve_speed_h100", "docs/results/fast-path-gpu.md", ("serve_speed_h100.json",),
          "python -m benchmarks.speed.serve_speed --data-dir DATA", gpu.serve_speed_gpu),
    Entry("gate_reruns", "docs/results/harness.md", ("gate_reruns_cpu.json",), None, tr.gate_reruns),
    Entry("acceptance", "docs/results/tiny-pair.md", ("acceptance_cpu_retrained.json",),
          "python -m recipes.tiny_pair.acceptance --data-dir DATA --num-prompts 32 --max-tokens 32,96", tr.acceptance,
          machine="a 2-core x86-64 CPU"),
    Entry("zlab_check", "docs/results/tiny-pair.md", ("zlab_check_cpu.json",),
          "python -m recipes.tiny_pair.zlab_check --zlab DIR --zlab-python PY --data-dir DATA --num-prompts 8", tr.zlab_check,
          machine="a 2-core x86-64 CPU"),
]


# Tables measured by commands a later session runs, on a GPU host or in a long CPU run (the module's docstring says
# which): each renders as an entry of TABLES once all its sources are in benchmarks/results/, and its page must then
# hold its block; until then it is left out, so no page shows a table of numbers nobody measured. One with `awaiting` shows what is
# there and names what is awaited.
AWAITING: list[Entry] = [
    Entry("demo_widths", "docs/results/demo.md", ("demo_widths_cpu.json",), None, tr.demo_widths),
    Entry("two_clients_h100", "docs/results/engines-one-gpu.md", ("two_clients_h100.json",), None, gpu.two_clients),
    Entry("two_clients_h100_tp2", "docs/results/gemma-4-31b.md", ("two_clients_h100_tp2.json",), None,
          gpu.two_clients),
    Entry("release_claims", "docs/results/release-claims.md", tuple(claims.CLAIM_FILES.values()),
          "python -m benchmarks.peers.big_sweep --pair PAIR --out benchmarks/results/FILE SWEEP_FOLDER... (each run's "
          "sweep command is in its notes)", claims.release_claims, machine="each run's machine, in its notes",
          awaiting={claims.CLAIM_FILES[k]: v for k, v in claims.CLAIM_CALLS.items()}),
]


def live_entries(root: Path) -> list[Entry]:
    """TABLES, the AWAITING entries whose results files are there, and those that show what is awaited."""
    return TABLES + [e for e in AWAITING
                     if e.awaiting is not None or all((root / RESULTS / s).exists() for s in e.sources)]


# ---------------------------------------------------------------- pages


def load(root: Path, name: str) -> Any:
    path = root / RESULTS / name
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise TablesError(f"results file {RESULTS / name} is missing") from None
    except json.JSONDecodeError as e:
        raise TablesError(f"results file {RESULTS / name} is not JSON ({e})") from None


def render_block(entry: Entry, root: Path) -> str:
    awaited = [s for s in entry.sources if entry.awaiting is not None and not (root / RESULTS / s).exists()]
    results = [None if s in awaited else load(root, s) for s in entry.sources]
    try:
        table = entry.render(results)
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as e:
        raise TablesError(f"table {entry.name} cannot be made from {', '.join(entry.sources)}: {type(e).__name__} {e}") from None
    lines = ["<!-- generated by `python -m benchmarks.tables`: edit the results file or the script, not this block -->", "",
             "| " + " | ".join(table.header) + " |", "|" + "---|" * len(table.header)]
    lines += ["| " + " | ".join(row) + " |" for row in table.rows]
    lines.append("")
    lines += table.notes
    files = ", ".join(f"`{(RESULTS / s).as_posix()}`" for s in entry.sources if s not in awaited)
    if files:
        command = entry.command or tr.command_of(results[0])
        lines.append(f"Source: {files} ({entry.machine or tr.machine_of(results[0])}), written by `{command}`.")
    lines += [f"Awaited: `{(RESULTS / s).as_posix()}`: {(entry.awaiting or {})[s]}" for s in awaited]
    return "\n".join(lines) + "\n"


def render_pages(root: Path) -> dict[str, str]:
    """Each page's text with its generated blocks as the results give them."""
    pages: dict[str, str] = {}
    by_page: dict[str, dict[str, Entry]] = {}
    for entry in live_entries(root):
        by_page.setdefault(entry.page, {})[entry.name] = entry
    for page, entries in by_page.items():
        path = root / page
        if not path.exists():
            raise TablesError(f"{page} is missing; it should hold the blocks {', '.join(entries)}")
        text = path.read_text()
        named = set(MARKER.findall(text))
        if unknown := named - set(entries):
            raise TablesError(f"{page} has a table block with no entry in benchmarks/tables/pages.py: {', '.join(sorted(unknown))}")
        if missing := set(entries) - {m.group(1) for m in BLOCK.finditer(text)}:
            raise TablesError(f"{page} lacks the block(s) {', '.join(sorted(missing))} (a <!-- table:NAME --> ... "
                              "<!-- /table:NAME --> pair)")
        pages[page] = BLOCK.sub(lambda m: f"<!-- table:{m.group(1)} -->\n{render_block(entries[m.group(1)], root)}"
                                          f"<!-- /table:{m.group(1)} -->", text)
    return pages


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tables", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a page differs from its results")
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository root (default: this checkout)")
    args = ap.parse_args(argv)
    try:
        pages = render_pages(args.root)
    except TablesError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stale = [page for page, text in pages.items() if (args.root / page).read_text() != text]
    if args.check:
        for page in stale:
            now = {m.group(1): m.group(2) for m in BLOCK.finditer((args.root / page).read_text())}
            names = [m.group(1) for m in BLOCK.finditer(pages[page]) if now.get(m.group(1)) != m.group(2)]
            print(f"{page}: {', '.join(names)} differ(s) from what benchmarks/results gives: run "
                  "`python -m benchmarks.tables`", file=sys.stderr)
        return 1 if stale else 0
    for page in stale:
        (args.root / page).write_text(pages[page])
        print(f"wrote {page}")
    return 0

