"""The card's table (dflash_bench/report/card.py): AR against DFlash per engine, machine, suite and concurrency
beside the model card, in the report and in the docs' generated table alike."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.fixtures.shape_folders import write_shape
from benchmarks.tables import renderers_mission
from dflash_bench.launch import free_port
from dflash_bench.report.card import CellLine, card_rows, card_table, weights_of
from dflash_bench.report.page import build_report

ROOT = Path(__file__).resolve().parents[1]


def line(engine, mode, c, tok_s, **kw):
    base = dict(engine=engine, mode=mode, suite="gsm8k", concurrency=c, device="1x H200", gpus=1, tok_s=tok_s,
                ttft_ms_p50=50.0, tpot_ms_p50=20.0, source="s1")
    return CellLine(**{**base, **kw})


def test_each_dflash_row_sits_beside_its_own_ar_and_the_cards_row_and_says_what_is_not_the_cards():
    lines = [line("builtin", "ar", 1, 40.0, weights="random"),
             line("builtin", "dflash", 1, 38.0, tau=1.0, weights="random"),
             line("builtin", "ar", 1, 44.0, weights="random", source="s2"),
             line("builtin", "dflash", 1, 240.0, tau=6.5, weights="random", synthetic_tau=6.5, source="s2"),
             line("vllm", "ar", 32, 1800.0, device="2x H100", gpus=2, weights="random", suite="mt-bench"),
             line("vllm", "dflash", 32, 900.0, device="2x H100", gpus=2, tau=1.0, weights="random", suite="mt-bench")]
    rows = card_rows(lines, "gemma-4-31B-it")
    assert len(rows) == 3
    plain, synthetic = [r for r in rows if r.engine == "builtin"]
    assert plain.ar.tok_s == 40.0 and abs(plain.speedup - 0.95) < 1e-9  # each sweep's DFlash over its own AR
    assert synthetic.ar.tok_s == 44.0 and abs(synthetic.speedup - 240.0 / 44.0) < 1e-9
    assert synthetic.labels == ["random weights (τ about 1 unless synthetic)", "synthetic τ 6.5, drawn"]
    assert (plain.card_ar, plain.card_dflash, plain.card_speedup, plain.card_tau) == (78, 408, 5.3, 7.53)
    header, body = card_table(rows)
    vllm = body[[r.engine for r in rows].index("vllm")]
    cols = dict(zip(header, vllm))
    assert cols["machine (GPUs per server)"] == "2x H100 (2)" and cols["DFlash / AR"] == "0.50x"
    assert cols["AR tok/s per GPU"] == "900.0" and cols["DFlash tok/s per GPU"] == "450.0"
    assert cols["card: AR / DFlash tok/s"] == "1,177 / 2,257" and cols["card: DFlash / AR"] == "1.9x"
    assert "τ builtin (reference)" not in cols  # no builtin cell beside another engine's: the column is left out
    sglang = card_rows(lines + [line("sglang", "ar", 1, 35.0), line("sglang", "dflash", 1, 30.0, tau=1.2)], None)
    header, body = card_table(sglang)
    assert [dict(zip(header, b))["τ builtin (reference)"] for b in body] == ["-", "-", "1.00", "-"]
    assert not any(h.startswith("card:") for h in header)  # no card to set the rows against: no card columns
    ref = {(r.engine, r.dflash.synthetic_tau if r.dflash else None): r.reference_tau for r in sglang}
    assert ref[("sglang", None)] == 1.0  # the builtin's measured tau, never its synthetic 6.5
    assert ref[("builtin", None)] is None and ref[("builtin", 6.5)] is None
    alone = card_rows([line("sglang", "ar", 8, 300.0)], None)  # no DFlash cell, no card: shown, not invented
    assert card_table(alone)[1][0][5:7] == ["-", "-"] and alone[0].labels == []


def test_weights_are_read_from_the_sweeps_engine_args():
    assert weights_of(["--load-format=dummy"], "vllm") == "random"
    assert weights_of(["--seed", "0", "--load-format", "dummy"], "sglang") == "random"
    assert weights_of(["--load-format", "safetensors"], "vllm") == "real"
    assert weights_of([], "emulator") == "emulated"
    assert weights_of(["--load-format=dummy", "--load-format", "auto"], "vllm") == "real"  # the engines read the last


def test_a_row_whose_server_drew_a_mixtures_experts_at_random_says_so(tmp_path):
    """A sweep's manifest names the environment its servers had: a row whose server ran vLLM's routing simulator
    says its experts were routed at random, and a row of the same sweep whose server did not stays unlabelled."""
    from types import SimpleNamespace

    import pandas as pd

    from dflash_bench.report.card import view_lines
    from dflash_bench.store.manifest import ServerRecord

    routed = ["VLLM_MOE_ROUTING_SIMULATION_STRATEGY"]
    servers = {"vllm-ar": ServerRecord(runner="process", url="u", engine="vllm", env_names=routed),
               "vllm-dflash": ServerRecord(runner="process", url="u", engine="vllm", env_names=routed),
               "sglang-ar": ServerRecord(runner="process", url="u", engine="sglang", env_names=routed)}
    manifest = SimpleNamespace(servers=servers, settings=None, hardware={"gpus": [{"name": "H200"}]}, sweep_id="s")
    frame = pd.DataFrame([{"engine": e, "mode": m, "suite": "gsm8k", "concurrency": 8, "status": "complete",
                           "output_throughput": 100.0} for e, m in (("vllm", "ar"), ("vllm", "dflash"), ("sglang", "ar"))])
    lines = view_lines(SimpleNamespace(manifest=manifest, frame=frame, gpus=1))
    assert [ln.routed_at_random for ln in lines] == [True, True, False]
    rows = {r.engine: r for r in card_rows(lines, None)}
    assert "experts routed at random" in rows["vllm"].labels and rows["sglang"].labels == []


def test_the_report_and_the_docs_table_show_the_same_cards_table_over_emulator_folders(tmp_path, data_dir):
    shape = write_shape("gemma-4-31B-it", tmp_path / "work")
    sweeps = tmp_path / "sweeps"
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", shape["target"], "--drafter",
                           shape["drafter"], "--engine", "emulator", "--suites", "gsm8k", "-c", "1,8", "-n", "2",
                           "--max-tokens", "16", "--data-dir", str(data_dir), "--out", str(sweeps),
                           "--port", str(free_port())],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr
    folder = next(sweeps.iterdir())
    html = build_report([folder], out=tmp_path / "r" / "report.html").read_text()
    assert "The card's table" in html and "beside gemma-4-31B-it's card" in html
    assert "emulated (no model ran)" in html and "78 / 408" in html and "2 row(s) are not measurements" in html
    results = tmp_path / "mission.json"
    subprocess.run([sys.executable, "-m", "benchmarks.peers.big_sweep", "--out", str(results), str(folder)],
                   check=True, capture_output=True, cwd=ROOT)
    data = json.loads(results.read_text())
    assert data["runs"][0]["weights"] == "emulated"
    table = renderers_mission.mission_card([data])
    assert len(table.rows) == 2 and [r[3] for r in table.rows] == ["1", "8"]
    for row in table.rows:  # the docs' row is the report's row, cell for cell
        assert "<td>" + "</td><td>".join(row[:3]) + "</td>" in html.replace('<td class="n">', "<td>")


def test_a_lost_sweep_folders_printed_cells_are_read_back_with_what_they_lack_said():
    from benchmarks.peers.big_sweep import console_runs

    log = """mission.sh: steps builtin-tau on --gpu h100 --tp 2, until 01:00:00 UTC (430 s)
gpu: NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04
gpu: NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04
+ python3 -m dflash_bench sweep --model /srv/mission/gemma-4-31B-it --drafter /srv/mission/gemma-4-31B-it-DFlash --engine builtin --runner process --gpu h100 -c 1 --out /srv/mission/s --engine-arg=--fast --engine-arg=--load-format=dummy --engine-arg=--synthetic-acceptance=6.5 --engine-arg=--benchmark-only --tensor-parallel-size 2
builtin-ar-gsm8k-c1: 1,074.9 tok/s  ok
builtin-dflash-gsm8k-c1: 376.1 tok/s  τ 6.18  ok
builtin-dflash-gsm8k-c8: 9.0 tok/s  failed
sweep folder: /srv/mission/s/builtin-tau-h100-tp2/20261128-015656-gemma-4-31B-it-builtin
"""
    (run,) = console_runs(log)
    assert run.sweep_id == "20261128-015656-gemma-4-31B-it-builtin" and run.source == "console"
    assert run.device == "2x NVIDIA H100 80GB HBM3" and run.gpus_per_server == 2 and run.weights == "random"
    assert run.command.startswith("dflash-bench sweep --model WORK/gemma-4-31B-it ")
    ar, dflash = run.rows  # the failed cell is not read as a measurement
    assert (ar.tok_s, ar.synthetic_tau, dflash.tau, dflash.synthetic_tau) == (1074.9, None, 6.18, 6.5)
    assert dflash.ttft_ms_p50 is None and dflash.tok_s_per_gpu == 188.05


def test_a_dflash_only_sweep_is_read_against_the_ar_sweep_of_the_same_workload():
    """mission.sh's -tau steps measure DFlash alone (`--modes dflash`); their AR cells are the plain step's sweep.
    A DFlash cell with no AR in its own sweep sits beside the AR cell of the one other sweep of the same engine,
    machine and workload, which then has no row of its own; a workload that differs, or two sweeps that both fit,
    pair nothing."""
    ar = line("vllm", "ar", 8, 400.0, source="plain", workload="w1", weights="random")
    other = line("vllm", "ar", 8, 300.0, source="short", workload="w2", weights="random")
    tau = line("vllm", "dflash", 8, 2000.0, tau=7.5, synthetic_tau=7.53, source="tau", workload="w1", weights="random")
    (row, lone) = sorted(card_rows([ar, other, tau], None), key=lambda r: r.dflash is None)
    assert row.ar == ar and row.dflash == tau and abs(row.speedup - 5.0) < 1e-9
    assert lone.ar == other and lone.dflash is None  # the AR of another workload keeps its own row, unpaired
    twice = card_rows([ar, ar.model_copy(update={"source": "plain2"}), tau], None)
    assert [r.ar is None for r in twice if r.dflash] == [True] and len(twice) == 3  # which AR is a guess: neither
    unknown = card_rows([ar, tau.model_copy(update={"workload": ""})], None)
    assert len(unknown) == 2 and not any(r.ar and r.dflash for r in unknown)  # no settings recorded: no partner


def test_the_report_pairs_a_dflash_only_sweep_with_its_ar_sweep_over_emulator_folders(tmp_path, data_dir):
    from dflash_bench.report.card import view_lines, workload_of
    from dflash_bench.report.views import load
    from dflash_bench.settings import SweepSettings

    plain = SweepSettings(model="m", engines=["vllm"], suites=["gsm8k"], concurrency=[1], modes=["ar"], max_tokens=16)
    assert workload_of(plain.model_dump(mode="json")) == workload_of(
        plain.model_copy(update={"modes": ["dflash"], "synthetic_acceptance": "card", "port": 1}).model_dump(mode="json"))
    assert workload_of(plain.model_dump(mode="json")) != workload_of(
        plain.model_copy(update={"max_tokens": 32}).model_dump(mode="json"))
    # --api came after results were committed: a sweep that leaves it out has the digest it had before it existed,
    # and one that sends completions a workload of its own
    before = {k: v for k, v in plain.model_dump(mode="json").items() if k != "api"}
    assert workload_of(before) == workload_of(plain.model_dump(mode="json"))
    assert workload_of(plain.model_copy(update={"api": "completions"}).model_dump(mode="json")) != workload_of(before)
    shape = write_shape("gemma-4-31B-it", tmp_path / "work")
    sweeps = tmp_path / "sweeps"
    for modes, tokens in (("ar", "16"), ("dflash", "16"), ("ar", "24")):
        proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", shape["target"], "--drafter",
                               shape["drafter"], "--engine", "emulator", "--suites", "gsm8k", "-c", "1", "-n", "2", "--max-tokens", tokens, "--modes", modes,
                               "--data-dir", str(data_dir), "--out", str(sweeps / f"{modes}-{tokens}"),
                               "--port", str(free_port())], capture_output=True, text=True, cwd=ROOT, timeout=600)
        assert proc.returncode == 0, proc.stderr
    folders = [next((sweeps / name).iterdir()) for name in ("ar-16", "dflash-16", "ar-24")]
    rows = card_rows([x for view in load(folders) for x in view_lines(view)], None)
    paired = [r for r in rows if r.ar and r.dflash]
    assert len(rows) == 2 and len(paired) == 1  # DFlash beside the 16-token AR sweep; the 24-token one alone
    assert paired[0].ar.source == folders[0].name and paired[0].dflash.source == folders[1].name
    html = build_report(folders, out=tmp_path / "r" / "report.html").read_text()
    assert "Where DFlash stops paying" in html


def test_eagle3_rows_sit_beside_their_own_ar_labelled_never_beside_the_card_or_the_reference():
    """A sweep of AR, DFlash and EAGLE-3: one row per speculative mode against the one AR cell they share, the
    EAGLE-3 row named as such in a mode column and in "not the card's", with neither the card's DFlash row nor the
    builtin engine's τ (both DFlash's) beside it; and the engines' table marks the fastest per mode, and says where
    each mode stops paying on lines of its own."""
    from dflash_bench.report import engines

    lines = [line("vllm", "ar", c, ar, weights="random") for c, ar in ((1, 40.0), (8, 300.0))]
    lines += [line("vllm", "dflash", c, tok, tau=6.5, synthetic_tau=6.5, weights="random")
              for c, tok in ((1, 200.0), (8, 280.0))]
    lines += [line("vllm", "eagle3", c, tok, tau=3.0, synthetic_tau=3.0, weights="random")
              for c, tok in ((1, 90.0), (8, 330.0))]
    lines += [line("builtin", "ar", 1, 42.0), line("builtin", "dflash", 1, 210.0, tau=7.0)]
    sglang = [line("sglang", "ar", 8, 310.0, weights="random"),
              line("sglang", "dflash", 8, 250.0, tau=6.5, synthetic_tau=6.5, weights="random"),
              line("sglang", "eagle3", 8, 300.0, tau=3.0, synthetic_tau=3.0, weights="random")]
    rows = card_rows(lines, "gemma-4-31B-it")
    assert sorted((r.engine, r.mode, r.concurrency) for r in rows) == [
        ("builtin", "dflash", 1), ("vllm", "dflash", 1), ("vllm", "dflash", 8), ("vllm", "eagle3", 1),
        ("vllm", "eagle3", 8)]  # the AR cells sit in both vLLM rows, never alone
    eagle = {r.concurrency: r for r in rows if r.mode == "eagle3"}
    assert eagle[1].ar.tok_s == 40.0 and abs(eagle[1].speedup - 90.0 / 40.0) < 1e-9
    assert (eagle[1].card_ar, eagle[1].card_speedup, eagle[1].reference_tau) == (None, None, None)
    assert eagle[1].labels[0] == "EAGLE-3, not DFlash"
    header, body = card_table(rows)
    cols = [dict(zip(header, b)) for b in body]
    assert [c["mode"] for c in cols if c["engine"] == "vllm"] == ["DFlash", "DFlash", "EAGLE-3", "EAGLE-3"]
    assert "speculative / AR" in header and "DFlash / AR" not in header and "card: DFlash / AR" in header
    assert [c["card: DFlash / AR"] for c in cols if c["mode"] == "EAGLE-3"] == ["-", "-"]
    assert card_table([r for r in rows if r.mode == "dflash"])[0].count("mode") == 0  # DFlash alone: as before

    assert not engines.has_modes(engines.suite_tables([r for r in rows if r.mode == "dflash"]))

    (table,) = engines.suite_tables(card_rows(lines + sglang, None))
    assert engines.header([table]) == engines.MODES_HEADER
    text = [dict(zip(engines.MODES_HEADER, r)) for r in engines.text_rows(table, modes=True)]
    at8 = {(t["engine"], t["mode"]): t for t in text if t["c"] == "8"}
    # the fastest DFlash (vLLM's 280) is marked though vLLM's EAGLE-3 ran faster (330): each mode among its own rows
    assert [k for k, t in at8.items() if t["speculative tok/s"].endswith("★")] == [("vllm", "DFlash"),
                                                                                  ("vllm", "EAGLE-3")]
    # the fastest AR server marked once, though two of its rows (DFlash's, EAGLE-3's) show it
    assert [k for k, t in at8.items() if t["AR tok/s"].endswith("★")] == [("sglang", "DFlash")]
    said = {(x.engine, x.mode): x.text for x in table.crossings}
    assert said[("vllm", "eagle3")] == "pays at every concurrency measured (2.25x at c=1, 1.10x at c=8)"
    assert said[("vllm", "dflash")] == "pays up to c=1 (5.00x), below 1 from c=8 (0.93x)"


def test_the_input_length_axis_sets_each_engines_speedup_along_prompt_length():
    """Cells of the --input-len axis (long-<N> suites) from two engines' sweeps: one row per engine and concurrency,
    DFlash / AR and τ at each length in ascending order, a length an engine did not run left empty; cells of a
    suite's own prompts are not on the axis."""
    from dflash_bench.report import engines

    lines = []
    for engine, n, suite, ar, df in (("vllm", 4096, "long-4k", 30.0, 27.0), ("vllm", 128, "long-128", 40.0, 200.0),
                                     ("vllm", 1024, "long-1k", 38.0, 120.0), ("builtin", 128, "long-128", 44.0, 180.0)):
        lines += [line(engine, "ar", 1, ar, suite=suite, input_len=n),
                  line(engine, "dflash", 1, df, suite=suite, input_len=n, tau=6.0, synthetic_tau=6.0)]
    lines += [line("vllm", "ar", 1, 41.0), line("vllm", "dflash", 1, 210.0, tau=6.0, synthetic_tau=6.0)]  # gsm8k
    table = engines.length_table(card_rows(lines, None))
    assert table.lengths == [128, 1024, 4096] and table.suites == ["long-128", "long-1k", "long-4k"]
    by = {r.engine: r for r in table.rows}
    assert [round(s, 3) for s in by["vllm"].speedups] == [5.0, round(120 / 38, 3), 0.9]
    assert by["builtin"].speedups == [180.0 / 44.0, None, None] and by["builtin"].taus == [6.0, None, None]
    assert engines.length_table(card_rows(lines[-2:], None)) is None  # no cell on the axis: no table


def test_rows_of_one_engine_and_kind_from_several_sweeps_are_named_by_sweep():
    """The same engine swept twice (two sweeps' DFlash of one kind, the second read against the first's AR cells):
    two rows at each concurrency that only their numbers would tell apart, so each names its sweep, and where DFlash
    stops paying is said per sweep; the one AR cell they share is one AR server, never the fastest of a race."""
    from dflash_bench.report import engines

    lines = [line("vllm", "ar", c, ar, workload="w") for c, ar in ((1, 40.0), (8, 300.0))]
    lines += [line("vllm", "dflash", c, tok, tau=6.5, workload="w") for c, tok in ((1, 200.0), (8, 280.0))]
    lines += [line("vllm", "dflash", c, tok, tau=6.4, source="s2", workload="w") for c, tok in ((1, 190.0), (8, 310.0))]
    (table,) = engines.suite_tables(card_rows(lines, None))
    assert sorted({r.engine for r in table.rows}) == ["vllm · s1", "vllm · s2"]
    said = {x.engine: x.text for x in table.crossings}
    assert said == {"vllm · s1": "pays up to c=1 (5.00x), below 1 from c=8 (0.93x)",
                    "vllm · s2": "pays at every concurrency measured (4.75x at c=1, 1.03x at c=8)"}
    assert not any(r.fastest_ar for r in table.rows)  # s2's DFlash is read against s1's AR: one AR server
    header, body = card_table(card_rows(lines, None))  # the card's table names the sweep of each row too
    assert sorted((dict(zip(header, b))["c"], dict(zip(header, b))["sweep"]) for b in body) == [
        ("1", "s1"), ("1", "s2"), ("8", "s1"), ("8", "s2")]
    assert "sweep" not in card_table(card_rows(lines[:4], None))[0]  # one sweep: no column
    assert [r.engine for r in table.rows if r.fastest_dflash] == ["vllm · s1", "vllm · s2"]
