"""The engines side by side: per suite, every engine's AR and DFlash at each concurrency, the fastest marked, each
row labelled with the kind of acceptance its DFlash ran at, and where DFlash stops paying. Where a sweep ran EAGLE-3,
its rows sit beside DFlash's, each row naming its mode: the fastest is marked among rows of one mode and kind, and
where EAGLE-3 stops paying is said on lines of its own.

    rows = card.card_rows(lines, pair)          # report/card.py: AR against DFlash, one speedup per cell
    tables = suite_tables(rows, pair)           # one SuiteTable per suite, the card's own row beside
    for t in tables: t.crossings                # per engine and kind: the concurrency past which DFlash / AR < 1

The HTML report and the docs' generated tables (benchmarks/tables) both take their rows from here, so the two
say the same thing about the same cells.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel

from dflash_bench.published import published_for
from dflash_bench.suite_file import suite_headings
from dflash_bench.report.card import CardRow, number
from dflash_bench.store import SPECULATIVE, mode_name

Kind = Literal["measured", "synthetic", "random", "emulated", "card"]
# the order kinds are listed in at one concurrency, and what each row's label says
KIND_ORDER: dict[str, int] = {"measured": 0, "synthetic": 1, "random": 2, "emulated": 3, "card": 4}
MODE_ORDER: dict[str, int] = {m: i for i, m in enumerate(SPECULATIVE)}


def kind_of(row: CardRow) -> tuple[Kind, str]:
    """What the DFlash side of a row measured, as a kind and its label: τ measured (real weights), τ drawn from a
    synthetic acceptance, a random drafter's τ (random weights: about 1, the cost of the speculative path), or
    no model at all (the emulator)."""
    cells = [c for c in (row.dflash, row.ar) if c is not None]
    synthetic = row.dflash.synthetic_tau if row.dflash else None
    if row.dflash is None:  # AR alone: its speculative cell is not measured (yet), so no τ to name
        weights = row.ar.weights if row.ar else "real"
        kind: Kind = "emulated" if weights == "emulated" else "random" if weights == "random" else "measured"
        return kind, "AR alone, no DFlash cell"
    if any(c.weights == "emulated" for c in cells):
        return "emulated", "emulated (no model ran)"
    if synthetic is not None:
        source = row.dflash.synthetic_source if row.dflash else None
        return "synthetic", f"synthetic τ {synthetic:g}, drawn" + (f" ({source})" if source else "")
    if any(c.weights == "random" for c in cells):
        return "random", "random drafter (τ about 1)"
    return "measured", "measured τ"


class EngineRow(BaseModel):
    """One engine (on one machine) at one suite and concurrency, at one kind of acceptance, AR against one speculative
    mode (the `dflash_*` fields are that mode's side: DFlash's, or EAGLE-3's where `mode` says so)."""

    engine: str  # as the page names it: the engine, with its machine where the rows ran on several
    mode: str = "dflash"  # the speculative side's mode (store.SPECULATIVE)
    kind: Kind
    label: str  # kind_of's label, or the card's
    suite: str
    concurrency: int
    ar_tok_s: float | None = None
    dflash_tok_s: float | None = None
    speedup: float | None = None  # speedup.py speedup_of, as on every other table
    tpot_ar_ms: float | None = None
    tpot_dflash_ms: float | None = None
    tau: float | None = None
    repeats: int = 1
    source: str = ""  # the sweep its speculative cell came from
    ar_source: str = ""  # the sweep its AR cell came from (another sweep's where its own measured no AR)
    server: str = ""  # the engine (and machine) before by_sweep names the sweep: with ar_source, which AR cell
    fastest_ar: bool = False  # the highest AR tok/s at this concurrency
    fastest_dflash: bool = False  # the highest speculative tok/s at this concurrency among rows of this mode and kind

    @property
    def mode_name(self) -> str:
        return mode_name(self.mode)


class Crossing(BaseModel):
    """Where DFlash (or EAGLE-3, as `mode` says) stops paying for one engine and kind in one suite."""

    engine: str
    mode: str = "dflash"
    kind: Kind
    label: str
    suite: str
    last_paying: int | None  # the highest concurrency before the first one below 1 where DFlash / AR >= 1
    first_below: int | None  # the lowest concurrency where DFlash / AR < 1
    text: str
    short: str  # for a table cell: "past c=8", "never (pays up to c=32)", "from c=1 (every c)"

    @property
    def mode_name(self) -> str:
        return mode_name(self.mode)


class SuiteTable(BaseModel):
    suite: str
    heading: str = ""  # how the page names it (suite_file.suite_headings: the suite it stands in for, if any)
    concurrencies: list[int]
    rows: list[EngineRow]  # by concurrency, then kind, then engine; the card's row last at each concurrency
    crossings: list[Crossing]


def crossing(points: Iterable[tuple[int, float | None]]) -> tuple[int | None, int | None, str, str]:
    """(last concurrency that pays before the first below 1, first concurrency below 1, the sentence, its short
    form for a table cell) from (concurrency, speedup) points; a speedup of exactly 1 pays nothing but loses
    nothing, so counts as paying."""
    pts = sorted((c, s) for c, s in points if s is not None)
    if not pts:
        return None, None, "no AR / DFlash pair measured", "-"
    below = [(c, s) for c, s in pts if s < 1]
    if not below:
        return pts[-1][0], None, (f"pays at every concurrency measured ({_x(pts[0][1])} at c={pts[0][0]}" +
                                  (f", {_x(pts[-1][1])} at c={pts[-1][0]})" if len(pts) > 1 else ")")), \
            f"never (pays up to c={pts[-1][0]})"
    first = below[0]
    paying = [(c, s) for c, s in pts if c < first[0]]
    last = paying[-1][0] if paying else None
    if paying:
        text, short = (f"pays up to c={last} ({_x(paying[-1][1])}), below 1 from c={first[0]} ({_x(first[1])})",
                       f"past c={last}")
    elif len(below) == len(pts):
        text, short = f"below 1 at every concurrency measured ({_x(pts[0][1])} at c={pts[0][0]})", \
            f"from c={pts[0][0]} (every c)"
    else:
        text, short = f"below 1 from c={first[0]} ({_x(first[1])})", f"from c={first[0]}"
    again = [c for c, s in pts if c > first[0] and s >= 1]
    if again:
        text += f", ahead again at c={', '.join(str(c) for c in again)}"
        short += f", ahead again at c={', '.join(str(c) for c in again)}"
    return last, first[0], text, short


def _x(v: float) -> str:
    return f"{v:.2f}x"


def suite_tables(rows: list[CardRow], pair: str | None = None) -> list[SuiteTable]:
    """The card's rows (report/card.py card_rows) regrouped per suite, engines side by side at each concurrency,
    with the pair's card row at each concurrency the card published."""
    devices = {(r.device, r.gpus) for r in rows}
    many = len(devices) > 1
    table = published_for(pair) if pair else None
    card = {(r.suite, r.concurrency): r for r in table.rows} if table else {}
    # the suites' own first, by name, then the --input-len axis's long-<N> by prompt length: the same order whichever
    # run's rows come first (card_rows sorts a synthetic tau's rows by their tau, so at the card's tau the suites'
    # would come by their card's tau)
    length = {r.suite: line.input_len for r in rows if (line := r.dflash or r.ar) is not None}
    suites = sorted({r.suite for r in rows}, key=lambda s: (length.get(s, 0), s))
    out, headings = [], suite_headings(suites)
    for suite in suites:
        mine = sorted(by_sweep([_engine_row(r, many) for r in rows if r.suite == suite]), key=_shown)
        concs = sorted({r.concurrency for r in mine})
        for c in concs:
            _mark_fastest([r for r in mine if r.concurrency == c])  # in the order shown: a shared AR on its first row
            if (suite, c) in card and table is not None:
                p = card[(suite, c)]
                mine.append(EngineRow(engine=f"{table.settings.engine} on {table.settings.gpu}", kind="card",
                                      label="the model card's", suite=suite, concurrency=c, ar_tok_s=p.ar_tok_s,
                                      dflash_tok_s=p.dflash_tok_s, tau=p.tau,
                                      speedup=p.speedup if p.speedup is not None else (
                                          p.dflash_tok_s / p.ar_tok_s if p.ar_tok_s and p.dflash_tok_s else None)))
        mine.sort(key=_shown)
        groups: dict[tuple[str, str, str], list[EngineRow]] = {}
        for row in mine:
            if row.kind != "card":
                groups.setdefault((row.engine, row.mode, row.label), []).append(row)
        crossings = []
        for (engine, mode, label), group in groups.items():
            if all(r.speedup is None for r in group):  # AR alone: nothing to say where it stops paying
                continue
            last, first, text, short = crossing((r.concurrency, r.speedup) for r in group)
            crossings.append(Crossing(engine=engine, mode=mode, kind=group[0].kind, label=label, suite=suite,
                                      last_paying=last, first_below=first, text=text, short=short))
        crossings.sort(key=lambda x: (KIND_ORDER[x.kind], x.engine, MODE_ORDER.get(x.mode, len(MODE_ORDER))))
        out.append(SuiteTable(suite=suite, heading=headings[suite], concurrencies=concs, rows=mine,
                              crossings=crossings))
    return out


def by_sweep(rows: list[EngineRow]) -> list[EngineRow]:
    """Rows that would read alike (one engine, mode and kind of τ at one concurrency, from several sweeps: the same
    engine swept twice, at two settings the kind does not name) each named with their sweep, so no two rows of a
    table are told apart by their numbers alone, and where each stops paying is said per sweep."""
    seen: dict[tuple[str, str, str, int], set[str]] = {}
    for r in rows:
        seen.setdefault((r.engine, r.mode, r.label, r.concurrency), set()).add(r.source)
    alike = {k[:3] for k, sources in seen.items() if len(sources) > 1}
    for r in rows:
        if (r.engine, r.mode, r.label) in alike:
            r.engine = f"{r.engine} · {r.source}"
    return rows


def _engine_row(r: CardRow, many_devices: bool) -> EngineRow:
    kind, label = kind_of(r)
    name = f"{r.engine} · {r.device}" + (f" ({r.gpus} per server)" if r.gpus and r.device != "no GPU" else "") \
        if many_devices else r.engine
    return EngineRow(engine=name, server=name, mode=r.mode, kind=kind, label=label, suite=r.suite, concurrency=r.concurrency,
                     ar_tok_s=r.ar.tok_s if r.ar else None, dflash_tok_s=r.dflash.tok_s if r.dflash else None,
                     speedup=r.speedup, tpot_ar_ms=r.ar.tpot_ms_p50 if r.ar else None,
                     tpot_dflash_ms=r.dflash.tpot_ms_p50 if r.dflash else None,
                     tau=r.dflash.tau if r.dflash else None, repeats=r.repeats,
                     source=r.dflash.source if r.dflash else "", ar_source=r.ar.source if r.ar else "")


def _shown(r: EngineRow) -> tuple[int, int, int, str]:
    """A suite table's row order: by concurrency, then kind of τ, mode and engine."""
    return r.concurrency, KIND_ORDER[r.kind], MODE_ORDER.get(r.mode, len(MODE_ORDER)), r.engine


def _mark_fastest(rows: list[EngineRow]) -> None:
    """The fastest AR server at one concurrency, and the fastest speculative server among the rows of each mode and
    kind (a synthetic τ's DFlash is not faster than a random drafter's in any sense a reader could use, nor DFlash
    than EAGLE-3 at another acceptance). An AR cell that several rows share (DFlash's and EAGLE-3's, or another
    sweep's DFlash read against it) counts once."""
    ar: dict[tuple[str, str], EngineRow] = {}
    for r in rows:
        if r.ar_tok_s is not None:
            ar.setdefault((r.server, r.ar_source), r)
    if len(ar) > 1:
        max(ar.values(), key=lambda r: r.ar_tok_s or 0.0).fastest_ar = True
    for kind, mode in {(r.kind, r.mode) for r in rows}:
        df = [r for r in rows if r.kind == kind and r.mode == mode and r.dflash_tok_s is not None]
        if len(df) > 1:
            max(df, key=lambda r: r.dflash_tok_s or 0.0).fastest_dflash = True


class LengthRow(BaseModel):
    """One engine, mode, kind and concurrency along the --input-len axis: the speedup and τ at each prompt length."""

    engine: str
    mode: str
    label: str
    concurrency: int
    speedups: list[float | None]  # per length of LengthTable.lengths, in order
    taus: list[float | None]

    @property
    def mode_name(self) -> str:
        return mode_name(self.mode)


class LengthTable(BaseModel):
    lengths: list[int]  # prompt lengths in tokens, ascending
    suites: list[str]  # each length's suite (long-128, long-1k, ...)
    rows: list[LengthRow]


def length_table(rows: list[CardRow]) -> LengthTable | None:
    """The input-length axis over every sweep (the rows whose cells ran on --input-len's long-<N> suites): per engine,
    mode, kind of τ and concurrency, DFlash / AR and τ at each prompt length, so a reader sees the speedup decay (or
    not) as prompts grow, engine beside engine. None where no row ran on that axis."""
    long = [r for r in rows if r.dflash is not None and r.ar is not None and r.dflash.input_len > 0]
    if not long:
        return None
    many = len({(r.device, r.gpus) for r in long}) > 1
    suites = {r.dflash.input_len: r.suite for r in long if r.dflash}
    lengths = sorted(suites)
    groups: dict[tuple[str, str, str, int], dict[int, CardRow]] = {}
    named = by_sweep([_engine_row(r, many) for r in long])
    for r, e in zip(long, named):
        groups.setdefault((e.engine, e.mode, e.label, e.concurrency), {})[r.dflash.input_len if r.dflash else 0] = r
    out = []
    for (engine, mode, label, c), by_len in sorted(groups.items(), key=lambda kv: (
            kv[0][0], MODE_ORDER.get(kv[0][1], len(MODE_ORDER)), kv[0][2], kv[0][3])):
        out.append(LengthRow(engine=engine, mode=mode, label=label, concurrency=c,
                             speedups=[by_len[n].speedup if n in by_len else None for n in lengths],
                             taus=[d.tau if n in by_len and (d := by_len[n].dflash) else None for n in lengths]))
    return LengthTable(lengths=lengths, suites=[suites[n] for n in lengths], rows=out)


def engine_count(tables: list[SuiteTable]) -> int:
    """How many (engine, mode, kind) groups the tables set side by side (the card's row not counted)."""
    return len({(r.engine, r.mode, r.label) for t in tables for r in t.rows if r.kind != "card"})


HEADER = ["c", "engine", "DFlash's τ", "AR tok/s", "DFlash tok/s", "DFlash / AR", "TPOT p50 ms AR / DFlash", "τ"]
MODES_HEADER = ["c", "engine", "mode", "τ of", "AR tok/s", "speculative tok/s", "speculative / AR",
                "TPOT p50 ms AR / speculative", "τ"]


def has_modes(tables: list[SuiteTable]) -> bool:
    """Whether any row's speculative side is not DFlash's (EAGLE-3): then every row names its mode."""
    return any(r.mode != "dflash" for t in tables for r in t.rows if r.kind != "card")


def header(tables: list[SuiteTable]) -> list[str]:
    """text_rows' columns: HEADER, or MODES_HEADER where some row is EAGLE-3's."""
    return MODES_HEADER if has_modes(tables) else HEADER


def text_rows(table: SuiteTable, modes: bool = False) -> list[list[str]]:
    """The table as text cells (HEADER's columns; MODES_HEADER's with `modes`), the fastest marked with a star: the
    docs' table, and what the report's HTML shows."""
    out = []
    for r in table.rows:
        mode = [r.mode_name if r.kind != "card" else "DFlash"] if modes else []
        out.append([str(r.concurrency), r.engine, *mode, r.label, number(r.ar_tok_s) + (" ★" if r.fastest_ar else ""),
                    number(r.dflash_tok_s) + (" ★" if r.fastest_dflash else ""),
                    "-" if r.speedup is None else _x(r.speedup),
                    f"{number(r.tpot_ar_ms, 2)} / {number(r.tpot_dflash_ms, 2)}" if r.kind != "card" else "-",
                    number(r.tau, 2)])
    return out
