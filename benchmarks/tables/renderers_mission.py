"""The mission's tables: benchmarks/peers/big_sweep.py's files (`dflash-bench sweep` folders of a large pair's shape,
read into one results file) as the report shows them: each run's cells, the card's table, the engines side by side,
DFlash along the prompt length, and where each cell's first tokens came. Each function takes the loaded JSON of its
entry's sources (benchmarks/tables/pages.py), in order, and returns a Table; the shared formatting is renderers.py's."""

from __future__ import annotations

from typing import Any

from benchmarks.tables.renderers import SUITES, Table, concurrency_cell, f1, f2, steady_notes


def big_shape(results: list[Any]) -> Table:
    """benchmarks/peers/big_sweep.py: each run's cells (engine x mode x GPUs x suite x concurrency), its command and
    the servers' commands as notes, failed cells by their reason, plans refused before launch."""
    data = results[0]
    rows, notes = [], []
    steady: list[str] = []
    for n, run in enumerate(data["runs"], 1):
        notes.append(f"Run {n} ({run['device']}, {run['gpus_per_server']} GPU(s) per server, context limit "
                     f"{run.get('context_len')}): `{run['command']}`.")
        notes += [f"Run {n}, {name}: `{cmd}`." for name, cmd in run["servers"].items()]
        failed: dict[tuple[str, str], str] = {}
        for r in run["rows"]:
            if r["tok_s"] is None:
                failed.setdefault((r["engine"], r["mode"]), r.get("reason") or r["status"])
                continue
            mem = "-" if r["peak_mem_mib"] is None else f"{r['peak_mem_mib'] / 1024:.1f}"
            cache = "-" if r["prefix_cache_hit_rate"] is None else f"{r['prefix_cache_hit_rate']:.0%}"
            rows.append([str(n), r["engine"], r["mode"], str(r["gpus"]), r["suite"], concurrency_cell(r, steady),
                         f1(r["tok_s"]), f1(r["tok_s_per_gpu"]), f1(r["ttft_ms_p50"]), f2(r["tpot_ms_p50"]),
                         mem, cache, f2(r["tau"]) if r["tau"] is not None else "-"])
        notes += [f"Run {n}, {e} {m}: every cell failed: {why}" for (e, m), why in failed.items()]
    notes += steady_notes(steady)
    notes += [f"Refused before launch: `{r['command']}`: {r['sentence']}" for r in data.get("refused", [])]
    notes.append(f"Weights {data['weights']}; tokenizer: {data['tokenizer']}. Peak memory: the most one of the "
                 "server's GPUs held during the cell (vLLM takes its whole share at start). Prefix cache: the share of "
                 "the cell's prompt tokens the server read from its cache (cells of one run share prompts).")
    header = ["run", "engine", "mode", "GPUs", "suite", "c", "tok/s", "tok/s per GPU", "TTFT p50 ms", "TPOT p50 ms",
              "peak GPU GiB", "prefix cache", "τ"]
    return Table(header, rows, notes)



def _mission_lines(data: dict[str, Any]) -> tuple[list[Any], list[str]]:
    """benchmarks/peers/big_sweep.py's file as report/card.py's CellLines (a row per cell and repeat), and a note per
    run: its sweep, machine, weights and command, and what was not measured."""
    from dflash_bench.report.card import CellLine

    lines, notes = [], []
    for n, run in enumerate(data["runs"], 1):
        whence = (", read from the sweep's console lines in mission.log: its folder did not come back, so no TTFT "
                  "or TPOT" if run.get("source") == "console" else "")
        notes.append(f"Run {n}, sweep {run['sweep_id']} ({run['device']}, {run['gpus_per_server']} GPU(s) per server, "
                     f"weights {run.get('weights', 'real')}{whence}): `{run['command']}`.")
        failed: dict[tuple[str, str], str] = {}
        for r in run["rows"]:
            if r["tok_s"] is None:
                failed.setdefault((r["engine"], r["mode"]), r.get("reason") or r["status"])
                continue
            lines.append(CellLine(engine=r["engine"], mode=r["mode"], suite=r["suite"], concurrency=r["concurrency"],
                                  device=run["device"], gpus=run["gpus_per_server"], tok_s=r["tok_s"],
                                  ttft_ms_p50=r["ttft_ms_p50"], tpot_ms_p50=r["tpot_ms_p50"], tau=r["tau"],
                                  weights=run.get("weights", "real"), synthetic_tau=r.get("synthetic_tau"),
                                  synthetic_source=r.get("synthetic_source"), source=run["sweep_id"],
                                  repeat=r.get("repeat", 0), workload=run.get("workload", ""),
                                  input_len=r.get("input_len", 0)))
        notes += [f"Run {n}, {e} {m}: not measured: {why}" for (e, m), why in failed.items()]
    return lines, notes


def mission_card(results: list[Any]) -> Table:
    """benchmarks/peers/big_sweep.py's file of the mission's sweeps as `dflash-bench report` shows it: the card's
    table (dflash_bench/report/card.py), every engine x machine x suite x concurrency beside the card's row;
    failed cells by their reason, each run's command."""
    from dflash_bench.report.card import card_rows, card_table

    data = results[0]
    lines, notes = _mission_lines(data)
    header, body = card_table(card_rows(lines, data.get("pair")))
    return Table(header, body, notes)


def mission_engines(results: list[Any]) -> Table:
    """The same file as the report's "Engines side by side" (dflash_bench/report/engines.py): per suite and
    concurrency each engine's AR and DFlash, the kind of τ its DFlash ran at, the fastest starred, the card's row
    beside; then, per suite, engine and kind, where DFlash stops paying; each run's command."""
    from dflash_bench.report import engines
    from dflash_bench.report.card import card_rows

    data = results[0]
    lines, notes = _mission_lines(data)
    rows = [r for r in card_rows(lines, data.get("pair")) if r.ar is not None or r.dflash is not None]
    tables = engines.suite_tables(rows, data.get("pair"))
    modes = engines.has_modes(tables)
    body = [[t.heading, *row] for t in tables for row in engines.text_rows(t, modes)]
    crossings = [f"{t.heading}, {x.engine}, {x.mode_name + ', ' if modes else ''}{x.label}: {x.text}."
                 for t in tables for x in t.crossings]
    measured = [f"Measured on {data['measured'].rstrip('.')}."] if data.get("measured") else []
    versions = sorted({f"{k} {v}" for run in data["runs"] for k, v in run.get("versions", {}).items()
                       if k in ("vllm", "sglang", "torch")})
    weights = [f"Weights {data['weights']}; {', '.join(versions)}."]
    return Table(["suite", *engines.header(tables)], body,
                 ["Where DFlash stops paying (DFlash / AR below 1 past that concurrency, at the τ of the row's kind):",
                  "", *(f"- {c}" for c in crossings or ["not yet: no engine here has both its AR and its DFlash measured"]),
                  "", ENGINES_KEY, *weights, *measured, *notes])


def mission_by_suite(results: list[Any]) -> Table:
    """The README's headline: the mission's table at the card's τ in one row per suite and concurrency, the engines
    side by side (AR and DFlash tok/s, DFlash / AR and the τ each realized, the fastest DFlash starred) and the card's
    DFlash / AR beside them; per engine, where DFlash stops paying. The rows of other kinds (the random drafter's,
    another τ) and what was not measured are mission_engines' to show."""
    from dflash_bench.published import published_for
    from dflash_bench.report.card import card_rows, number

    data = results[0]
    lines, _ = _mission_lines(data)
    rows = [r for r in card_rows(lines, data.get("pair")) if r.mode == "dflash" and r.ar and r.dflash
            and (r.dflash.synthetic_source or "").startswith("card")]
    card_table = published_for(data["pair"]) if data.get("pair") else None
    card_gpus = (f"{card_table.settings.gpus_per_server}x {card_table.settings.gpu}" if card_table else "not known")
    engines = sorted({r.engine for r in rows})
    by = {(r.suite, r.concurrency, r.engine): r for r in rows}
    order = {s: i for i, s in enumerate(SUITES)}
    body = []
    for suite, c in sorted({(r.suite, r.concurrency) for r in rows}, key=lambda k: (order.get(k[0], len(order)), k)):
        here = [by.get((suite, c, e)) for e in engines]
        fastest = max((r.dflash.tok_s or 0 for r in here if r and r.dflash), default=0)
        card = next((r for r in here if r and r.card_speedup is not None), None)
        body.append([suite, str(c),
                     *(f"{number(r.ar.tok_s)} / {number(r.dflash.tok_s)}{' ★' if r.dflash.tok_s == fastest else ''}"
                       if r and r.ar and r.dflash else "-" for r in here),
                     *(f"{r.speedup:.2f}x (τ {f2(r.dflash.tau)} of {r.dflash.synthetic_tau:.2f})"
                       if r and r.dflash and r.speedup is not None and r.dflash.synthetic_tau is not None else "-"
                       for r in here),
                     f"{card.card_speedup:.2f}x (τ {f2(card.card_tau)})" if card and card.card_tau else "-"])
    header = ["suite", "c", *(f"{e}: AR / DFlash tok/s" for e in engines), *(f"{e}: DFlash / AR" for e in engines),
              f"card ({card_gpus}): DFlash / AR"]
    # the calls (commits, dates, what each reached) are the docs' to quote: the README keeps the machine and the command
    measured = ["Each call's commit, date and command: the results file's `measured`, quoted under the same rows in "
                "docs/results/gemma-4-31b.md."] if data.get("measured") else []
    return Table(header, body, [
        "Where DFlash stops paying, at the card's τ:", "", *(f"- {_stops(e, [r for r in rows if r.engine == e])}"
                                                          for e in engines), "",
        "Output tok/s per server (tensor parallel: both its GPUs); DFlash at the card's τ for each suite, drawn with "
        "the same per-position profile by both engines (`--synthetic-acceptance card`), its τ the one each server "
        "realized; ★ the faster DFlash. DFlash / AR: each engine's over its own AR. Spec-Bench stands for "
        "SPEED-Bench (its prepared data is not carried) and draws the mean of the card's suites' τ.",
        f"Weights {data['weights']}.", *measured])


def _stops(engine: str, rows: list[Any]) -> str:
    """One engine's card-τ rows in one line: the cells where DFlash / AR falls below 1, or that it pays in every one,
    and its range at the highest concurrency measured."""
    measured = [r for r in rows if r.speedup is not None]
    if not measured:
        return f"{engine}: no cell with both its AR and its DFlash measured"
    below = [f"{r.suite} c={r.concurrency} ({r.speedup:.2f}x)" for r in measured if r.speedup < 1]
    top = max(r.concurrency for r in measured)
    at_top = sorted((r for r in measured if r.concurrency == top), key=lambda r: r.speedup)
    span = f"at c={top} {at_top[0].speedup:.2f}x ({at_top[0].suite}) to {at_top[-1].speedup:.2f}x ({at_top[-1].suite})"
    suites = len({r.suite for r in measured})
    if below:
        return f"{engine}: below 1 in {', '.join(below)}; {span}"
    return f"{engine}: pays in every cell measured ({len(measured)}, {suites} suite{'s' if suites > 1 else ''}); {span}"


def mission_lengths(results: list[Any]) -> Table:
    """The report's "By prompt length" (dflash_bench/report/engines.py length_table) over the same file: per engine,
    kind of τ and concurrency, DFlash / AR and τ at each prompt length of the --input-len axis."""
    from dflash_bench.report import engines
    from dflash_bench.report.card import card_rows

    data = results[0]
    table = engines.length_table(card_rows(_mission_lines(data)[0], data.get("pair")))
    if table is None:
        return Table(["engine", "τ of", "c"], [], ["No row of this file ran on the --input-len axis."])
    body = [[r.engine, r.label, str(r.concurrency),
             *("-" if sp is None else f"{sp:.2f}x (τ {'-' if tau is None else f'{tau:.2f}'})"
               for sp, tau in zip(r.speedups, r.taus))] for r in table.rows]
    return Table(["engine", "τ of", "c", *(f"{s} ({n} tokens)" for s, n in zip(table.suites, table.lengths))], body,
                 ["DFlash / AR (τ realized) with prompts of about each length: the long-<N> rows of the table above, "
                  "along one axis."])


ENGINES_KEY = ("Output tok/s per server (tensor parallel: all its GPUs), DFlash / AR the median of the repeats' "
               "ratios (one repeat: its ratio); ★ the fastest AR server at that concurrency, and the fastest DFlash "
               "server among the rows of the same kind of τ (a random drafter's τ is about 1, so its DFlash / AR is "
               "the cost of the speculative path; a synthetic τ is drawn, not measured).")


def first_tokens(results: list[Any]) -> Table:
    """How each cell's first tokens came (big_sweep's `first_tokens`): the groups the server prefilled together, as
    the client saw them, beside the TTFT's median, mean and p90 and the server's own split of it (queue, then prefill
    to the first token); cells of one request at a time left out."""
    data = results[0]
    rows, notes = [], []
    for n, run in enumerate(data["runs"], 1):
        notes.append(f"Run {n}, sweep {run['sweep_id']} ({run['device']}, {run['gpus_per_server']} GPU(s) per server, "
                     f"weights {run.get('weights', 'real')}): `{run['command']}`.")
        for r in run["rows"]:
            if r["tok_s"] is None or r["concurrency"] < 2 or not r.get("first_tokens"):
                continue
            came = ", ".join(f"{g['requests']} at {g['ttft_ms']:.0f}" for g in r["first_tokens"])
            rows.append([str(n), r["engine"], r["mode"], r["suite"], str(r["concurrency"]), f1(r["tok_s"]),
                         f1(r["ttft_ms_p50"]), f1(r.get("ttft_ms_p50_later_turns")), f1(r.get("ttft_ms_mean")),
                         f1(r.get("ttft_ms_p90")), f1(r.get("server_queue_ms")), f1(r.get("server_prefill_ms")), came])
    notes.insert(0, "Output tok/s of the cell; TTFT in ms as the client measured it (later turns: the p50 of a "
                    "multi-turn suite's second and later turns alone); the server's queue (arrival to the start of its "
                    "prefill) and prefill (to its first token) are the means of its own histograms over the cell. First tokens: "
                    "the cell's requests by when their first token reached the client, a new group wherever one came "
                    f"more than {data['first_token_gap_ms']:g} ms after the one before (requests, then their median TTFT "
                    "in ms), in the order they came: a group is what the server prefilled in one forward or one step.")
    measured = [f"Measured on {data['measured'].rstrip('.')}."] if data.get("measured") else []
    return Table(["run", "engine", "mode", "suite", "c", "tok/s", "TTFT p50", "later turns p50", "mean", "p90",
                  "server queue", "server prefill", "first tokens came"], rows, [*notes, *measured])
