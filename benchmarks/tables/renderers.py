"""The tables benchmarks/tables/pages.py writes: one function per table, from the loaded results JSON to rows of text.

Each function takes the loaded JSON of its entry's sources, in order, and returns a Table. This module holds
the Table, the shared formatting and the CPU families (the demo, the CPU fast path, the embedded pair);
renderers_gpu.py holds the GPU families (engines on one GPU, the fast path on one GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dflash_bench.store import SteadyPlan

SUITES = ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench", "spec-bench")


class TablesError(Exception):
    """A page or a results file this script cannot use: one sentence, exit 2."""


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- formatting


def f1(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def f2(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def span(values: Sequence[float], fmt: Callable[[float], str] = f2, unit: str = "") -> str:
    """`lo-hi` (one value when all are equal after formatting)."""
    lo, hi = fmt(min(values)), fmt(max(values))
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def concurrency_cell(row: dict[str, Any], marks: list[str]) -> str:
    """A row's concurrency, marked "(steady)" when the cell was a steady stream (its numbers are the window's, not
    a closed batch's); `marks` gathers each window's label for steady_notes."""
    steady = row.get("steady")
    if not steady:
        return str(row["concurrency"])
    label = SteadyPlan.model_validate(steady).label()
    if label not in marks:
        marks.append(label)
    return f"{row['concurrency']} (steady)"


def steady_notes(marks: list[str]) -> list[str]:
    return [f"(steady): {label} (--steady-requests); the cell's numbers are that window's, not a closed batch's."
            for label in marks]


def command_of(data: dict[str, Any]) -> str:
    if "command" in data:
        return str(data["command"])
    commands = sorted({str(run["command"]) for run in data.get("runs", []) if "command" in run})
    if not commands:
        raise TablesError("a table's entry names no command and its results file records none")
    return "`, `".join(commands)


def machine_of(data: dict[str, Any]) -> str:
    if "device" in data:
        return str(data["device"])
    machine = data.get("machine")
    if isinstance(machine, dict):  # benchmarks/harness/demo_repeats.py
        return f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores"
    if machine is not None:
        return f"{machine}, {data.get('cpus', '?')} cores"
    return "not recorded"


# ---------------------------------------------------------------- the demo (CPU)


def _demo_ratios(data: dict[str, Any]) -> dict[tuple[str, int], list[tuple[float, float | None]]]:
    """(suite, concurrency) -> per run (DFlash / AR output tok/s, DFlash τ). A run's cells are either one per
    suite, concurrency and mode (`output_tok_s`), or one per suite and concurrency with the run's `speedup`
    (the median over its repeats, as benchmarks/harness/demo_repeats.py writes them)."""
    out: dict[tuple[str, int], list[tuple[float, float | None]]] = {}
    for run in data["runs"]:
        if all("speedup" in c for c in run["cells"]):
            for c in run["cells"]:
                out.setdefault((c["suite"], c["concurrency"]), []).append((c["speedup"], c.get("tau")))
            continue
        cells = {(c["suite"], c["concurrency"], c["mode"]): c for c in run["cells"]}
        for (suite, conc, mode), cell in cells.items():
            ar = cells.get((suite, conc, "ar"))
            if mode == "dflash" and ar and ar["output_tok_s"]:
                out.setdefault((suite, conc), []).append((cell["output_tok_s"] / ar["output_tok_s"], cell.get("tau")))
    return out


def _demo_grid(data: dict[str, Any], with_tau: bool) -> Table:
    ratios = _demo_ratios(data)
    concs = sorted({c for _, c in ratios})
    suites = [s for s in SUITES if any((s, c) in ratios for c in concs)]
    rows = []
    for suite in suites:
        row = [suite]
        for conc in concs:
            runs = ratios.get((suite, conc), [])
            if not runs:
                row.append("-")
                continue
            text = span([r for r, _ in runs], unit="x")
            taus = [t for _, t in runs if t is not None]
            if with_tau and taus:
                text += f" (τ {span(taus)})"
            repeats = [(c["speedup_min"], c["speedup_max"]) for run in data["runs"] for c in run["cells"]
                       if (c["suite"], c["concurrency"]) == (suite, conc) and "speedup_min" in c]
            if with_tau and repeats:
                text += f", single repeats {span([lo for lo, _ in repeats] + [hi for _, hi in repeats], unit='x')}"
            text += f", ahead in {sum(r > 1 for r, _ in runs)} of {len(runs)}"
            row.append(text)
        rows.append(row)
    runs = data["runs"]
    notes = [f"{len(runs)} runs, {span([r['seconds'] for r in runs], fmt=lambda s: f'{s:.0f}', unit=' s')} each "
             "after the install; DFlash / AR output tok/s, lowest-highest over the runs"
             + (" (a run's ratio: the median of its repeats')" if any("speedup" in c for r in runs for c in r["cells"]) else "")
             + (", with DFlash's τ" if with_tau else "") + "."]
    sets = data.get("sets") or []
    if len(sets) > 1:  # demo_repeats --append
        notes.append("The runs are " + " and ".join(f"{s['runs']} in a row from {s['started'][11:16]} UTC" for s in sets)
                     + f" on {sets[0]['started'][:10]}.")
    loads = [r[k] for r in runs for k in ("load_avg_1min_before", "load_avg_1min_after") if k in r]
    if loads:
        notes.append(f"The machine's 1-minute load average before and after the runs: {span(loads, fmt=f1)}.")
    exact = [c["lossless_exact_match_rate"] for r in runs for c in r["cells"]
             if c.get("mode") == "dflash" and c.get("lossless_exact_match_rate") is not None]
    if exact:
        notes.append(f"DFlash's tokens equal AR's in {sum(e == 1 for e in exact)} of {len(exact)} DFlash cells.")
    return Table(["suite"] + [f"concurrency {c}" for c in concs], rows, notes)


def demo_summary(results: list[Any]) -> Table:
    return _demo_grid(results[0], with_tau=False)


def demo_runs(results: list[Any]) -> Table:
    return _demo_grid(results[0], with_tau=True)


def cpu_anatomy(results: list[Any]) -> Table:
    rows_by_batch: dict[int, dict[int, dict[str, Any]]] = {}
    for r in results[0]["rows"]:
        rows_by_batch.setdefault(r["batch"], {})[r["width"]] = r
    widths = sorted({w for b in rows_by_batch.values() for w in b if w})
    rows = []
    for batch, by_width in sorted(rows_by_batch.items()):
        row = [str(batch), f"{by_width[0]['ms']['step']:.2f} ms"]
        for w in widths:
            r = by_width.get(w)
            row.append("-" if r is None else f"{r['step_over_ar']:.2f} ({w / r['step_over_ar']:.2f}x)")
        rows.append(row)
    return Table(["rows", "AR step"] + [f"w = {w}" for w in widths], rows,
                 ["A verify of w tokens a row, in AR steps of the same round, and in brackets what DFlash would gain "
                  "over AR if every draft were accepted (w / cost)."])


# ---------------------------------------------------------------- the prefix cache


def resume_speed(results: list[Any]) -> Table:
    data = results[0]
    rows = [[str(r["rows"]), f"{r['context']} + 1 + {r['new']}", str(r["tokens_whole"]), f1(r["whole_ms"]),
             str(r["tokens_resumed"]), f1(r["resumed_ms"]), f"{r['whole_ms'] / r['resumed_ms']:.1f}x"]
            for r in data["rows"]]
    return Table(["second turns at once", "tokens each (turn 1 + answer + new)", "whole: tokens", "whole: ms",
                  "resumed: tokens", "resumed: ms", "whole / resumed"], rows,
                 [f"The k second turns' prefill (`FastEngine.add_many`), the median of {data['reps']} bursts after a "
                  f"warm-up, {data['mode'].upper()}, on {data['model']}: whole after `reset_prefix_cache`, resumed from "
                  "the slots their first turns left."])


# ---------------------------------------------------------------- the CPU fast path


def cpu_step_costs(results: list[Any]) -> Table:
    data = results[0]
    rows = []
    for step in data["steps"]:
        for d in step["dflash"]:
            if d["drafter"] != "1x256" or d["draft"] == "block":
                continue
            rows.append([str(step["batch"]), str(d["width"]), f2(d["ar_ms"]), f2(d["draft_ms"]), f2(d["verify_ms"]),
                         f2(d["ratio"]), f2(d["step_ratio"]), f"{d['speedup_at_w']:.2f}x"])
    return Table(["rows", "w", "AR ms", "draft ms", "verify ms", "draft + verify / AR", "whole step / AR step", "speedup at w"], rows,
                 [f"Drafter 1x256 (layers x intermediate size), drafts cut to the w positions verified (w = 1: the anchor "
                  f"alone, no draft); synthetic acceptance τ = {data['args']['tau']}; prompts of "
                  f"{data['args']['prompt_len']} tokens. \"speedup at w\": tokens a step of width w commits / its cost."])


def cpu_drafter_shapes(results: list[Any]) -> Table:
    data = results[0]
    step = data["steps"][0]
    widths = sorted({d["width"] for d in step["dflash"]})
    by = {(d["drafter"], d["width"]): d for d in step["dflash"] if d["draft"] == "cut"}
    shapes = list(dict.fromkeys(d["drafter"] for d in step["dflash"]))
    rows = [[shape] + [f2(by[(shape, w)]["ratio"]) if (shape, w) in by else "-" for w in widths] for shape in shapes]
    return Table(["drafter (layers x intermediate)"] + [f"w = {w}" for w in widths], rows,
                 [f"Draft + verify over AR's step at {step['batch']} row, cut drafts, synthetic τ = {data['args']['tau']}."])


def cpu_real_pair(results: list[Any]) -> Table:
    data = results[0]
    step = data["steps"][0]
    by = {(d["width"], d["draft"]): d for d in step["dflash"]}
    widths = sorted({w for w, _ in by})
    rows = [[kind] + [f2(by[(w, k)]["step_ratio"]) if (w, k) in by else "-" for w in widths]
            for kind, k in (("cut drafts", "cut"), ("whole block drafted", "block"), ("anchor alone", "none"))]
    notes = [f"A whole DFlash step over an AR step at {step['batch']} row, the embedded pair ({data['args']['draft_shapes'][0][0]}x"
             f"{data['args']['draft_shapes'][0][1]} drafter), real acceptance."]
    for r in data.get("real", []):
        notes.append(f"In process on GSM8K prompts, {data['args']['new_tokens']} new tokens each (past the end of the pair's "
                     f"short answers, where it accepts little), concurrency {r['concurrency']}: "
                     f"DFlash / AR {r['cut']['speedup']:.2f}x with cut drafts, {r['block']['speedup']:.2f}x with whole blocks "
                     f"(τ {f2(r['cut']['tau'])}); tokens equal AR's: "
                     f"{'yes' if r['cut']['same_tokens_as_ar'] and r['block']['same_tokens_as_ar'] else 'no'}.")
    return Table(["draft"] + [f"w = {w}" for w in widths], rows, notes)


def cpu_throughput(results: list[Any]) -> Table:
    tput, served = results
    rows = []
    for t in tput["throughput"]:
        conc = t["concurrency"]
        s = served["rows"][str(conc)]
        ar = s["ar"]["output_throughput"]
        rows.append([str(conc), f1(t["ar_tok_s"]),
                     f"{f1(t['cut']['tok_s'])}, {t['cut']['speedup']:.2f}x ({t['cut']['full_batch_speedup']:.2f}x)",
                     f1(t["cut"]["width"]), f1(ar),
                     f"{f1(s['dflash']['output_throughput'])}, {s['dflash']['output_throughput'] / ar:.2f}x",
                     f"{f1(s['dflash_cut']['output_throughput'])}, {s['dflash_cut']['output_throughput'] / ar:.2f}x"])
    return Table(["concurrency", "AR in process", "DFlash cut in process (until the first request ends)", "its mean width",
                  "AR served", "DFlash served", "DFlash cut served"], rows,
                 [f"In process: {tput['args']['new_tokens']} new tokens, median of {tput['args']['rounds']} rounds. "
                  f"Served: GSM8K, {served['new_tokens']} new tokens. Synthetic acceptance τ = {served['tau']}, "
                  f"drafter {served['draft_shape']}, adaptive width."])


# ---------------------------------------------------------------- the embedded pair


def acceptance(results: list[Any]) -> Table:
    rows: dict[str, dict[int, dict[str, Any]]] = {}
    for r in results[0]["rows"]:
        rows.setdefault(r["suite"], {})[r["max_tokens"]] = r
    lengths = sorted({n for by in rows.values() for n in by})
    out = [[s] + [f2(rows[s][n]["tau"]) if n in rows[s] else "-" for n in lengths]
           + [f"{sum(r['identical'] for r in rows[s].values())} of {sum(r['prompts'] for r in rows[s].values())}"]
           for s in SUITES if s in rows]
    return Table(["suite"] + [f"τ at {n} new tokens" for n in lengths] + ["DFlash's tokens equal AR's"], out,
                 ["The first prompts of each suite in the demo's order, greedy, float32."])


def zlab_check(results: list[Any]) -> Table:
    data = results[0]
    out = [[r["suite"], f"{r['equal_tokens']} of {r['prompts']}", f2(r["tau_zlab"]), f2(r["tau_builtin"])] for r in data["rows"]]
    return Table(["suite", "outputs equal token for token", "τ z-lab", "τ builtin"], out,
                 [f"z-lab's reference code ({data['zlab']}, transformers {data['zlab_transformers']}) against the builtin "
                  f"reference engine, {data['rows'][0]['max_tokens']} new tokens."])


def gate_reruns(results: list[Any]) -> Table:
    """Per case (a rerun of the demo, each kind of regression): the runs, how many gates ran and failed, the checks
    that failed and what they were."""
    data = results[0]
    cases: dict[str, list[dict[str, Any]]] = {}
    for g in data["gates"]:
        cases.setdefault(g["case"], []).append(g)
    rows = []
    for case, gates in cases.items():
        failed = [g for g in gates if g["failures"]]
        runs = sorted({g["sweep"] for g in gates})
        checks = sorted({g["checks"] for g in gates})
        what = sorted({f.split(":")[0].split(" ", 1)[1] for g in failed for f in g["failed"]})
        rows.append([case, str(len(runs)), str(len(gates)), span(checks, str), str(len(failed)),
                     str(sum(g["failures"] for g in gates)), "; ".join(what[:4]) + (" ..." if len(what) > 4 else "")])
    both = data["runs"] + data["regressions"]
    seconds = [r["seconds"] for r in both]
    loads = [r[k] for r in both for k in ("load_avg_1min_before", "load_avg_1min_after")]
    started = sorted(r["started"] for r in both)
    notes = [f"Each gate: one run against another run's baseline (`gate --export-baseline RUN -o FILE`, then `gate "
             f"RUN2 --baseline FILE`), the defaults; {len(data['runs'])} runs of `dflash-bench demo` gated both ways, "
             f"each of the {len(data['regressions'])} broken runs against every run's baseline. A run took "
             f"{span(seconds, fmt=lambda x: f'{x:.0f}', unit=' s')}; they ran one after another on {started[0][:10]}, a demo "
             f"run and a broken run in turn, while the machine's "
             f"1-minute load average read {span(loads, fmt=f1)} (2 cores, other jobs beside them). The runs measured "
             f"commit {data['commit']}, gated by commit {data['gated_at']}.",
             "Broken: " + data["regressions_how"] + "."]
    aside = [g for g in data["gates"] if g.get("absolute_not_comparable")]
    if aside:
        ratios = [max(g["machine_slower"], 1 / g["machine_slower"]) for g in aside]
        notes.append(f"In {len(aside)} of {len(data['gates'])} gates the two runs' machine-speed probes differed beyond "
                     f"their band ({span(ratios, fmt=lambda x: f'{x:.2f}', unit=' times')} slower or faster): those "
                     "gates reported output throughput and TPOT as not comparable rather than gating them, and gated the "
                     "speedup and τ.")
    return Table(["case", "runs", "gates", "checks per gate", "gates failed", "checks failed", "what failed"], rows, notes)


def demo_widths(results: list[Any]) -> Table:
    """Per fixed verify width: DFlash / AR per suite and concurrency, with τ (one value where every cell read it)."""
    data = results[0]
    keys = list(dict.fromkeys((c["suite"], c["concurrency"]) for r in data["rows"] for c in r["cells"]))
    rows = []
    for r in data["rows"]:
        by = {(c["suite"], c["concurrency"]): c for c in r["cells"]}
        row = [str(r["width"])]
        for key in keys:
            c = by.get(key)
            row.append("-" if c is None else f"{c['speedup']:.2f}x (τ {span(c['taus'])})" if c["taus"] else f"{c['speedup']:.2f}x")
        rows.append(row)
    loads = [r[k] for r in data["rows"] for k in ("load_avg_1min_before", "load_avg_1min_after")]
    notes = [f"DFlash / AR output tok/s (the median of the repeats' ratios) and DFlash's τ over its cells, one width after "
             f"another from {data['rows'][0]['started'][11:16]} UTC on {data['rows'][0]['started'][:10]}; the machine's "
             f"1-minute load average before and after each: {span(loads, fmt=f1)} (2 cores, other jobs beside them). "
             f"Each width's sweep: `{data['sweep']}`."]
    return Table(["width"] + [f"{s} c={c}" for s, c in keys], rows, notes)
