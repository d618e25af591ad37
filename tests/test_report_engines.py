"""The report over several sweeps of one model: one speedup per cell wherever it is shown, the engines side by side
per suite with each row's kind of acceptance said and the fastest marked, where DFlash stops paying (measured over
HTTP against emulators of known timing), repeated warnings folded, and figures that stay readable however many
suites and concurrencies a sweep holds."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import warnings
from html.parser import HTMLParser
from pathlib import Path

import pytest
from benchmarks.fixtures.report_sweeps import make_sweep

from dflash_bench.client.loadgen import LoadSettings
from dflash_bench.client.protocol import RequestSettings
from dflash_bench.client.run_command import run_one
from dflash_bench.emulator import EmulatorProcess
from dflash_bench.report import build_report, figures, plotting
from dflash_bench.report.engines import crossing
from dflash_bench.report.views import load
from dflash_bench.store import CellPlan, CellSummary, Manifest, SweepDir

ROOT = Path(__file__).resolve().parents[1]
RANDOM = ("--load-format=dummy",)


class Text(HTMLParser):
    """The visible text of a page, and of each element with an id, class `cell` and class `sp`."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.feed(html)

    def handle_data(self, data):
        self.parts.append(data)

    def text(self) -> str:
        return re.sub(r"\s+", " ", "".join(self.parts))


def section(html: str, ident: str) -> str:
    """The visible text of the <section id=...>."""
    start = html.index(f'<section id="{ident}">')
    return Text(html[start:html.index("</section>", start)]).text().strip()


# ---------------------------------------------------------------- one speedup per cell


def repeats_sweep(path: Path) -> Path:
    """Two engines, three repeats of one cell each, where the repeats' ratios (3.0, 2.0, 3.3: median 3.0) differ
    from the ratio of the averaged tok/s (730 / 250 = 2.92) and from the ratios' mean (2.77)."""
    tok = {("vllm", 0): (100.0, 300.0), ("vllm", 1): (50.0, 100.0), ("vllm", 2): (100.0, 330.0),
           ("sglang", 0): (90.0, 180.0), ("sglang", 1): (90.0, 180.0), ("sglang", 2): (90.0, 180.0)}
    plan = [CellPlan(cell_id=f"{e}-{m}-gsm8k-c4" + (f"-r{r}" if r else ""), engine=e, mode=m, suite="gsm8k",
                     concurrency=4, repeat=r) for (e, r) in tok for m in ("ar", "dflash")]
    sweep = SweepDir.create(path, Manifest(sweep_id=path.name, plan=plan,
                                           hardware={"gpus": [{"name": "NVIDIA H200"}]}))
    for cell in plan:
        ar, dflash = tok[(cell.engine, cell.repeat)]
        sweep.write_summary(CellSummary(cell_id=cell.cell_id, engine=cell.engine, mode=cell.mode, suite="gsm8k",
                                        concurrency=4, repeat=cell.repeat,
                                        output_throughput=ar if cell.mode == "ar" else dflash,
                                        acceptance_length=5.0 if cell.mode == "dflash" else None))
    return path


def test_a_cell_has_one_speedup_in_every_table_and_the_gate(tmp_path):
    path = repeats_sweep(tmp_path / "repeats")
    html = build_report([path]).read_text()
    for ident in ("engines", "card", "headline"):
        text = section(html, ident)
        assert re.search(r"3\.00 ?[×x]", text), ident  # vLLM's median of ratios
        assert not re.search(r"2\.92|2\.77", text), ident  # neither the ratio of the means nor the mean of ratios
    assert "median over the cell's repeats" not in section(html, "headline")  # defined once, linked from there
    assert "then the median of these ratios over the cell's repeats" in section(html, "engines")

    from dflash_bench.gate import gate
    from dflash_bench.gate.output import markdown

    table = markdown(gate(path, path))
    row = next(line for line in table.splitlines() if line.startswith("| vllm/dflash/gsm8k/c4 | speedup"))
    assert row.split(" | ")[3:5] == ["3 (median of 3)", "3 (median of 3)"]


# ---------------------------------------------------------------- engines side by side


@pytest.fixture(scope="module")
def mission(tmp_path_factory) -> list[Path]:
    """The mission's four sweeps as mission.sh writes them on random weights: vLLM, SGLang and the builtin engine
    with a random drafter (DFlash / AR below 1 everywhere, a warning per DFlash cell), and the builtin engine at a
    synthetic τ (ahead everywhere)."""
    out = tmp_path_factory.mktemp("mission")
    warning = "tau 1.00: the drafter's tokens were (almost) never accepted (0 accepted over {c}00 drafts)"
    common = dict(suites=("gsm8k", "mt-bench"), concurrency=(1, 8, 32), gpus=2, engine_args=RANDOM,
                  model="gemma-4-31B-it", telemetry=False)
    return [make_sweep(out / "vllm", engine="vllm", boost=0.9, warning=warning, **common),
            make_sweep(out / "sglang", engine="sglang", boost=0.85, warning=warning, ar_scale=1.1, **common),
            make_sweep(out / "builtin", engine="builtin", boost=0.95, warning=warning, **common),
            make_sweep(out / "builtin-tau", engine="builtin", boost=3.6, synthetic=6.5, **common)]


def test_the_engines_sit_side_by_side_per_suite_each_row_labelled_with_its_kind(mission, tmp_path):
    html = build_report(mission, tmp_path / "site" / "report.html").read_text()
    text = section(html, "engines")
    assert text.startswith("Engines side by side")
    tables = re.findall(r'<table class="engines">.*?</table>', html, re.S)
    assert len(tables) == 2  # gsm8k, mt-bench
    rows = [[Text(td).text().strip() for td in re.findall(r"<td[^>]*>.*?</td>", tr, re.S)]
            for tr in re.findall(r"<tr class=[^>]*>.*?</tr>", tables[0], re.S)]
    # each concurrency: the four measured rows (synthetic first, then the random drafters) and the card's own row
    assert [r[0] for r in rows] == ["1"] * 5 + ["8"] * 5 + ["32"] * 5
    c1 = {(r[1], r[2]): r for r in rows[:5]}
    assert set(c1) == {("builtin", "synthetic τ 6.5, drawn"), ("builtin", "random drafter (τ about 1)"),
                       ("sglang", "random drafter (τ about 1)"), ("vllm", "random drafter (τ about 1)"),
                       ("vllm on B300", "the model card's")}
    # planted: AR tok/s = 70 c^0.8 (SGLang's 10% more), DFlash = AR x max(0.8, boost - 0.06 c)
    assert c1[("builtin", "synthetic τ 6.5, drawn")][4] == f"{70 * 3.54:,.1f}"  # alone of its kind: not starred
    assert c1[("builtin", "random drafter (τ about 1)")][4] == f"{70 * 0.89:,.1f} ★"  # of the random drafters
    assert c1[("vllm", "random drafter (τ about 1)")][4] == f"{70 * 0.84:,.1f}"
    assert [r[3] for r in rows[:5] if "★" in r[3]] == [f"{77:,.1f} ★"]  # SGLang's AR, the fastest at c=1
    assert c1[("vllm on B300", "the model card's")][3:6] == ["78.0", "408.0", "5.30×"]
    # where DFlash stops paying, per engine and kind, under each suite's table
    assert "builtin, synthetic τ 6.5, drawn: pays at every concurrency measured (3.54x at c=1, 1.68x at c=32)" in text
    assert "vllm, random drafter (τ about 1): below 1 at every concurrency measured (0.84x at c=1)" in text
    # a warning repeated on every DFlash cell of a sweep: one line per sweep, its numbers as a range
    head = section(html, "headline")
    assert head.count("A speculative server (DFlash, EAGLE-3) did not speculate in 6 cell(s)") == 3
    assert head.count("and 0 more") == 0 and head.count("(0 accepted over 100-3200 drafts)") == 3
    assert "random weights: a random drafter accepts nothing" in head


def test_where_dflash_stops_paying():
    assert crossing([(1, 2.0), (8, 1.3), (32, 1.1)])[2] == "pays at every concurrency measured (2.00x at c=1, 1.10x at c=32)"
    assert crossing([(32, 0.7), (1, 1.8), (8, 1.0)])[:2] == (8, 32)  # 1.0 pays nothing and loses nothing
    assert crossing([(1, 1.8), (8, 1.2), (32, 0.7)])[2] == "pays up to c=8 (1.20x), below 1 from c=32 (0.70x)"
    assert crossing([(1, 0.9), (8, 0.8)])[2] == "below 1 at every concurrency measured (0.90x at c=1)"
    assert crossing([(1, 1.5), (8, 0.9), (32, 1.2)])[2] == "pays up to c=1 (1.50x), below 1 from c=8 (0.90x), ahead again at c=32"
    assert crossing([(1, None)])[2] == "no AR / DFlash pair measured"


@pytest.fixture(scope="module")
def crossing_folder(tmp_path_factory, data_dir) -> Path:
    """One engine's AR and DFlash servers over real HTTP, emulators of known timing: AR one token per 10 ms step
    whatever the load; DFlash τ 4 a step, its step 10 ms plus 10 ms per other request in flight. DFlash / AR is
    then 4 at c=1, 2 at c=2 and 0.5 at c=8."""
    out = tmp_path_factory.mktemp("crossing")
    base = dict(ttft_ms=1, itl_ms=10, output_len=48, seed=2)
    with EmulatorProcess(mode="ar", **base) as ar, \
            EmulatorProcess(mode="dflash", acceptance_length=4.0, batch_slope_ms=10.0, **base) as dflash:
        for c in (1, 2, 8):
            for label, server in (("ar", ar), ("dflash", dflash)):
                run_one(server.url, "gsm8k", RequestSettings(max_tokens=64),
                        LoadSettings(concurrency=c, timeout=60.0, transport="aiohttp"), label=label, engine="vllm",
                        out=out, name="vllm", data_dir=data_dir, num_prompts=2 * c, quiet=True)
    return out / "vllm"


def test_the_concurrency_past_which_dflash_stops_paying_is_read_from_a_measured_sweep(crossing_folder, tmp_path):
    (view,) = load([crossing_folder])
    speedups = {int(r["concurrency"]): r["speedup"] for r in view.headline.to_dict("records")}
    assert speedups[1] > 2.5 and 1.3 < speedups[2] < 2.5 and speedups[8] < 0.8, speedups  # the emulator's truth
    html = build_report([crossing_folder], tmp_path / "r" / "report.html").read_text()
    text = section(html, "engines")
    assert text.startswith("Where DFlash stops paying")  # one engine: no side-by-side table, the crossing alone
    assert f"gsm8k (vllm, measured τ): pays up to c=2 ({speedups[2]:.2f}x), below 1 from c=8 ({speedups[8]:.2f}x)" in text

    # the docs' generated table reads the same crossing from the results file big_sweep writes of the folder
    from benchmarks.tables import renderers_mission

    results = tmp_path / "mission.json"
    subprocess.run([sys.executable, "-m", "benchmarks.peers.big_sweep", "--out", str(results), str(crossing_folder)],
                   check=True, capture_output=True, cwd=ROOT)
    table = renderers_mission.mission_engines([json.loads(results.read_text())])
    assert any(f"pays up to c=2 ({speedups[2]:.2f}x), below 1 from c=8 ({speedups[8]:.2f}x)" in n for n in table.notes)


# ---------------------------------------------------------------- figures at scale


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def legend_entries(fig) -> list[int]:
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    return [len(leg.get_texts()) for leg in legends]


@pytest.mark.parametrize("shape", ["60 concurrencies", "18 suites"])
def test_figures_stay_readable_however_many_cells(tmp_path, shape):
    """A sweep of 60 concurrencies (a line each) or 18 suites (a panel each): every legend folds to MAX_LEGEND
    entries, every axis names at most MAX_TICKS concurrencies, every figure stays within its size, and matplotlib
    says nothing on the console."""
    if shape == "60 concurrencies":
        path = make_sweep(tmp_path / "s", suites=("gsm8k",), concurrency=tuple(range(1, 61)), gpus=2)
    else:
        path = make_sweep(tmp_path / "s", suites=tuple(f"suite-{i}" for i in range(18)), concurrency=(1, 8), gpus=2)
    (view,) = load([path])
    drawn = 0
    for name, fn in figures.FIGURES.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fig = fn(view)
            if fig is None:
                continue
            entries, ticks = legend_entries(fig), [len(ax.get_xticklabels()) for ax in fig.axes if ax.get_visible()]
            data = plotting.png(fig)
        assert [str(w.message) for w in caught if "matplotlib" in w.filename] == [], name
        assert entries and max(entries) <= plotting.MAX_LEGEND, (name, entries)
        if name in ("latency", "energy", "acceptance", "verify_width"):  # concurrency on the x axis
            assert max(ticks) <= plotting.MAX_TICKS, (name, ticks)
        width, height = png_size(data)
        assert width <= (plotting.MAX_WIDTH_IN + 1) * plotting.DPI and height <= (plotting.MAX_HEIGHT_IN + 1) * plotting.DPI, \
            (name, width, height)
        drawn += 1
    assert drawn == 8  # every figure but input_length (no --input-len axis)
    html = build_report([path]).read_text()
    if shape == "60 concurrencies":  # more concurrencies than columns fit: the headline has a row per concurrency
        assert "<th>concurrency 60</th>" not in html and html.count('<td class="cell') == 60


def test_sentences_that_differ_in_their_numbers_fold_into_one_line():
    from dflash_bench.report.cells import fold

    said = [(f"x-dflash-gsm8k-c{c}", f"tau 1.0{c % 2}: 0 accepted over {c}16 drafts") for c in (1, 8, 32, 64, 2, 4, 16)]
    (line,) = fold(said)
    assert line["text"] == "tau 1.00-1.01: 0 accepted over 116-6416 drafts"
    assert line["n"] == 7 and line["more"] == 1 and line["cells"][0] == "x-dflash-gsm8k-c1"
    # failures fold only when alike to the letter: two HTTP statuses are not a range
    http = fold([("a", "HTTP 500 (3)"), ("b", "HTTP 502 (1)"), ("c", "HTTP 500 (3)")], numbers=False)
    assert [(f["text"], f["cells"]) for f in http] == [("HTTP 500 (3)", ["a", "c"]), ("HTTP 502 (1)", ["b"])]


def test_a_rows_kind_says_where_its_synthetic_tau_came_from():
    from dflash_bench.report.card import CardRow, CellLine
    from dflash_bench.report.engines import kind_of

    def row(**dflash) -> CardRow:
        cell = dict(engine="builtin", suite="gsm8k", concurrency=1, device="2x H200")
        return CardRow(engine="builtin", device="2x H200", gpus=2, suite="gsm8k", concurrency=1,
                       ar=CellLine(mode="ar", weights=dflash.get("weights", "real"), **cell),
                       dflash=CellLine(mode="dflash", **cell, **dflash))

    assert kind_of(row(synthetic_tau=7.53, synthetic_source="card gsm8k", weights="random")) == \
        ("synthetic", "synthetic τ 7.53, drawn (card gsm8k)")
    assert kind_of(row(synthetic_tau=6.5, weights="random")) == ("synthetic", "synthetic τ 6.5, drawn")
    assert kind_of(row(weights="random")) == ("random", "random drafter (τ about 1)")
    assert kind_of(row()) == ("measured", "measured τ")
    assert kind_of(row(weights="emulated")) == ("emulated", "emulated (no model ran)")
    alone = row(weights="random").model_copy(update={"dflash": None})
    assert kind_of(alone) == ("random", "AR alone, no DFlash cell")  # not a random drafter's: none ran
    emulated = row(weights="emulated").model_copy(update={"dflash": None})
    assert kind_of(emulated) == ("emulated", "AR alone, no DFlash cell")


def test_an_engine_measured_in_ar_alone_gets_its_row_and_no_crossing():
    """A sweep resumed across calls can hold an engine's AR before its DFlash: the row shows the AR and says it
    stands alone, and no "where DFlash stops paying" is said for it, while the engine beside it keeps its own."""
    from dflash_bench.report.card import CardRow, CellLine
    from dflash_bench.report.engines import suite_tables

    def line(engine: str, mode: str, c: int, tok_s: float) -> CellLine:
        return CellLine(engine=engine, mode=mode, suite="gsm8k", concurrency=c, device="2x H200", gpus=2,
                        tok_s=tok_s, weights="random", source=engine)

    rows = [CardRow(engine="vllm", device="2x H200", gpus=2, suite="gsm8k", concurrency=c, ar=line("vllm", "ar", c, 90.0 * c))
            for c in (1, 8)]
    rows += [CardRow(engine="builtin", device="2x H200", gpus=2, suite="gsm8k", concurrency=c, ar=line("builtin", "ar", c, 95.0 * c),
                     dflash=line("builtin", "dflash", c, 80.0 * c), ratios=[80 / 95]) for c in (1, 8)]
    (table,) = suite_tables(rows)
    alone = [r for r in table.rows if r.engine == "vllm"]
    assert [(r.label, r.ar_tok_s, r.dflash_tok_s, r.speedup) for r in alone] == \
        [("AR alone, no DFlash cell", 90.0, None, None), ("AR alone, no DFlash cell", 720.0, None, None)]
    assert [(x.engine, x.label) for x in table.crossings] == [("builtin", "random drafter (τ about 1)")]
    assert all(r.fastest_ar == (r.engine == "builtin") for r in table.rows)


def test_an_ar_cell_two_kinds_share_is_starred_on_the_row_shown_first():
    """The builtin engine's AR read against two of its DFlash sweeps (the card's τ and the random drafter), the
    random drafter's row coming first from the files: the fastest AR is starred once, on the row the table shows
    first (the synthetic τ's), not on whichever row came first from the files."""
    from dflash_bench.report.card import CardRow, CellLine
    from dflash_bench.report.engines import suite_tables

    def line(engine: str, mode: str, tok_s: float, source: str, **kw) -> CellLine:
        return CellLine(engine=engine, mode=mode, suite="gsm8k", concurrency=8, device="2x H200", gpus=2,
                        tok_s=tok_s, weights="random", source=source, **kw)

    ar = line("builtin", "ar", 700.0, "s-ar")
    rows = [CardRow(engine="builtin", device="2x H200", gpus=2, suite="gsm8k", concurrency=8, ar=ar,
                    dflash=line("builtin", "dflash", 600.0, "s-random"), ratios=[6 / 7]),
            CardRow(engine="builtin", device="2x H200", gpus=2, suite="gsm8k", concurrency=8, ar=ar,
                    dflash=line("builtin", "dflash", 3300.0, "s-card", synthetic_tau=7.53,
                                synthetic_source="card gsm8k"), ratios=[33 / 7]),
            CardRow(engine="vllm", device="2x H200", gpus=2, suite="gsm8k", concurrency=8,
                    ar=line("vllm", "ar", 640.0, "v-ar"), dflash=line("vllm", "dflash", 460.0, "v-random"),
                    ratios=[46 / 64])]
    (table,) = suite_tables(rows)
    assert [(r.engine, r.kind, r.fastest_ar) for r in table.rows] == [
        ("builtin", "synthetic", True), ("builtin", "random", False), ("vllm", "random", False)]


def test_a_suite_that_stands_in_for_another_says_so_on_its_table():
    """Spec-Bench runs where SPEED-Bench's prepared data is not at hand: its table (and each of its rows in the
    docs) is named "spec-bench, in place of speed-bench", from its suite file; other suites keep their names."""
    from dflash_bench.report.card import CardRow, CellLine
    from dflash_bench.report.engines import suite_tables
    from dflash_bench.suite_file import get_suite

    assert get_suite("spec-bench").stands_in_for == "speed-bench" and get_suite("gsm8k").stands_in_for is None

    def row(suite: str) -> CardRow:
        ar = CellLine(engine="vllm", mode="ar", suite=suite, concurrency=1, device="1x H200", gpus=1, tok_s=90.0)
        return CardRow(engine="vllm", device="1x H200", gpus=1, suite=suite, concurrency=1, ar=ar)

    tables = suite_tables([row("gsm8k"), row("spec-bench"), row("long-1k")])
    assert {t.suite: t.heading for t in tables} == {
        "gsm8k": "gsm8k", "spec-bench": "spec-bench, in place of speed-bench", "long-1k": "long-1k"}


def test_the_suites_own_come_first_then_the_long_suites_by_prompt_length():
    """A run resumed across calls can hold its long-<N> cells before the suite's own: the tables still come in one
    order, whichever row comes first: the suites' own by name, then the --input-len axis from the shortest prompts to
    the longest."""
    from dflash_bench.report.card import CardRow, CellLine
    from dflash_bench.report.engines import suite_tables

    def row(suite: str, input_len: int) -> CardRow:
        ar = CellLine(engine="vllm", mode="ar", suite=suite, concurrency=1, device="1x H200", gpus=1, tok_s=90.0,
                      input_len=input_len)
        return CardRow(engine="vllm", device="1x H200", gpus=1, suite=suite, concurrency=1, ar=ar)

    rows = [row("long-4k", 4096), row("mt-bench", 0), row("long-128", 128), row("gsm8k", 0), row("long-1k", 1024)]
    for given in (rows, rows[::-1]):
        assert [t.suite for t in suite_tables(given)] == ["gsm8k", "mt-bench", "long-128", "long-1k", "long-4k"]
