"""benchmarks/tables/pages.py: the committed pages hold exactly what benchmarks/results/*.json give, and a changed
results value is caught."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.tables import pages as tables
from benchmarks.tables import renderers as table_renderers
from benchmarks.tables import renderers_mission

REPO = Path(__file__).resolve().parent.parent


def _copy_repo_pages(tmp: Path) -> Path:
    """README.md, docs/results/ and benchmarks/results/ in a root of their own, to change freely."""
    for page in {e.page for e in tables.TABLES + [a for a in tables.AWAITING if a.awaiting is not None]}:
        (tmp / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / page, tmp / page)
    shutil.copytree(REPO / "benchmarks" / "results", tmp / "benchmarks" / "results")
    return tmp


def test_committed_pages_match_their_results():
    # the command CI and a fresh clone run, as a user types it
    proc = subprocess.run([sys.executable, "-m", "benchmarks.tables", "--check"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_every_results_file_has_its_command_in_the_index():
    index = (REPO / "benchmarks" / "README.md").read_text()
    named = set(re.findall(r"`([a-z0-9_]+(?:_\*)?\.json)`", index))
    missing = [p.name for p in sorted((REPO / "benchmarks" / "results").glob("*.json"))
               if p.name not in named and not any(n.endswith("_*.json") and p.name.startswith(n[:-6]) for n in named)]
    assert not missing, f"benchmarks/README.md says no command for {missing}"


def test_every_benchmark_command_the_docs_give_runs_a_module_that_exists():
    texts = [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "benchmarks").rglob("*.md"),
             *(REPO / "benchmarks").rglob("*.py")]
    commands = {m for f in texts for m in re.findall(r"python -m (benchmarks(?:\.\w+)+)", f.read_text())}
    assert "benchmarks.speed.engine_speed" in commands and "benchmarks.tables" in commands
    gone = []
    for name in sorted(commands):
        spec = importlib.util.find_spec(name)
        if spec is None or (spec.submodule_search_locations is not None and importlib.util.find_spec(name + ".__main__") is None):
            gone.append(name)
    assert not gone, f"no module runs as {gone}"


def test_a_changed_result_fails_the_check_and_a_rewrite_mends_it(tmp_path, capsys):
    root = _copy_repo_pages(tmp_path)
    assert tables.main(["--check", "--root", str(root)]) == 0
    source = root / "benchmarks" / "results" / "engine_speed_h100.json"
    data = json.loads(source.read_text())
    data["rows"][0]["ar"]["tok_s"] *= 1.5
    source.write_text(json.dumps(data))

    assert tables.main(["--check", "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert "docs/results/fast-path-gpu.md" in err and "engine_speed" in err
    before = (root / "docs/results/fast-path-gpu.md").read_text()

    assert tables.main(["--root", str(root)]) == 0
    after = (root / "docs/results/fast-path-gpu.md").read_text()
    assert after != before and f"{data['rows'][0]['ar']['tok_s']:.1f}" in after
    assert tables.main(["--check", "--root", str(root)]) == 0


def test_prose_is_kept_and_only_blocks_are_rewritten(tmp_path):
    root = _copy_repo_pages(tmp_path)
    page = root / "docs/results/tiny-pair.md"
    text = page.read_text()
    start = text.index("<!-- table:acceptance -->\n") + len("<!-- table:acceptance -->\n")
    end = text.index("<!-- /table:acceptance -->")
    page.write_text("A line of prose added by hand.\n" + text[:start] + "| stale |\n" + text[end:])
    assert tables.main(["--check", "--root", str(root)]) == 1
    assert tables.main(["--root", str(root)]) == 0
    assert page.read_text() == "A line of prose added by hand.\n" + text


def test_a_block_without_an_entry_or_a_missing_source_is_one_sentence(tmp_path, capsys):
    root = _copy_repo_pages(tmp_path)
    page = root / "docs/results/demo.md"
    page.write_text(page.read_text() + "\n<!-- table:no_such_table -->\n<!-- /table:no_such_table -->\n")
    assert tables.main(["--check", "--root", str(root)]) == 2
    assert "no_such_table" in capsys.readouterr().err

    root = _copy_repo_pages(tmp_path / "second")
    (root / "benchmarks" / "results" / "zlab_check_cpu.json").unlink()
    assert tables.main(["--check", "--root", str(root)]) == 2
    assert "zlab_check_cpu.json is missing" in capsys.readouterr().err


def test_the_demo_range_reads_demo_repeats_files_too():
    # benchmarks/harness/demo_repeats.py writes one cell per suite and concurrency with the run's median speedup
    runs = [{"seconds": s, "cells": [{"suite": "gsm8k", "concurrency": 1, "repeats": 2, "speedup": x, "speedup_min": x - 0.1,
                                      "speedup_max": x + 0.1, "ar_tok_s": 100.0, "dflash_tok_s": 100.0 * x, "tau": t}]}
            for s, x, t in ((150.0, 1.8, 9.0), (170.0, 2.2, 9.5), (160.0, 0.9, 8.0))]
    data = {"command": "dflash-bench demo", "machine": {"cpu": "some CPU", "cores": 2}, "runs": runs}
    table = table_renderers.demo_runs([data])
    assert table.rows == [["gsm8k", "0.90-2.20x (τ 8.00-9.50), single repeats 0.80-2.30x, ahead in 2 of 3"]]
    assert "the median of its repeats" in table.notes[0]
    assert "3 runs, 150-170 s each" in table.notes[0]
    assert table_renderers.machine_of(data) == "some CPU, 2 cores" and table_renderers.command_of(data) == "dflash-bench demo"


def test_a_second_set_of_demo_runs_widens_the_range_and_is_named():
    """demo_repeats --append: another set of runs (an hour later, say) joins the file; the range covers both."""
    from benchmarks.harness.demo_repeats import merged

    def result(commit: str, started: str, speedups: tuple[float, ...]) -> dict:
        cells = lambda x: [{"suite": "gsm8k", "concurrency": 1, "repeats": 1, "speedup": x, "speedup_min": x,  # noqa: E731
                            "speedup_max": x, "ar_tok_s": 100.0, "dflash_tok_s": 100.0 * x, "tau": 5.0}]
        return {"command": "dflash-bench demo", "commit": commit, "machine": {"cpu": "c", "cores": 2},
                "runs": [{"started": started, "seconds": 100.0, "cells": cells(x)} for x in speedups]}

    both = merged(result("a1", "2026-11-27T03:47:51+00:00", (2.0, 2.2)), result("b2", "2026-11-27T04:46:20+00:00", (1.8,)))
    assert [s["commit"] for s in both["sets"]] == ["a1", "b2"] and [s["runs"] for s in both["sets"]] == [2, 1]
    assert both["c1_speedup_range"]["gsm8k"]["min"] == 1.8 and both["c1_speedup_range"]["gsm8k"]["max"] == 2.2
    again = merged(both, result("c3", "2026-11-27T06:00:00+00:00", (2.5,)))
    assert len(again["sets"]) == 3 and len(again["runs"]) == 4
    table = table_renderers.demo_summary([both])
    assert table.rows == [["gsm8k", "1.80-2.20x, ahead in 3 of 3"]]
    assert "The runs are 2 in a row from 03:47 UTC and 1 in a row from 04:46 UTC on 2026-11-27." in table.notes


def test_steady_stream_cells_are_marked_with_their_window(tmp_path):
    """benchmarks/peers/big_sweep.py keeps a steady-stream cell's window (tests/data/sweep_steady_flat, written by a
    steady sweep on the emulator), and the table marks its concurrency and says which window its numbers are."""
    out = tmp_path / "big.json"
    folder = REPO / "tests" / "data" / "sweep_steady_flat"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.peers.big_sweep", str(folder), "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert [r["steady"] for r in data["runs"][0]["rows"]] == [{"ramp": 2, "requests": 3}] * 2
    closed = json.loads(json.dumps(data))
    closed["runs"][0]["rows"][0]["steady"] = None
    table = renderers_mission.big_shape([closed])
    assert [row[5] for row in table.rows] == ["2", "2 (steady)"]
    label = "steady stream: a window of 3 completions after a ramp-up of 2"
    assert [n for n in table.notes if n.startswith("(steady)")] == [
        f"(steady): {label} (--steady-requests); the cell's numbers are that window's, not a closed batch's."]
    for row in closed["runs"][0]["rows"]:
        row["steady"] = None
    plain = renderers_mission.big_shape([closed])
    assert [row[5] for row in plain.rows] == ["2", "2"] and not any(n.startswith("(steady)") for n in plain.notes)


def test_the_release_claims_table_shows_measured_rows_beside_their_claims_and_names_what_is_awaited(tmp_path, data_dir):
    """An emulator sweep of gemma-4-26B-A4B-it's shape, made into its claim's results file by big_sweep, fills that
    claim's rows (published figure on the first, what differs said); the claims without a file are awaited rows and
    lines naming their calls."""
    from benchmarks.fixtures.shape_folders import write_shape
    from benchmarks.tables.renderers_claims import CLAIM_FILES
    from dflash_bench.launch import free_port

    shape = write_shape("gemma-4-26B-A4B-it", tmp_path / "work")
    sweep = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", shape["target"], "--drafter",
                            shape["drafter"], "--engine", "emulator", "--suites", "gsm8k", "-c", "1,2", "-n", "2",
                            "--max-tokens", "16", "--data-dir", str(data_dir), "--out", str(tmp_path / "sweeps"),
                            "--port", str(free_port())],
                           cwd=REPO, capture_output=True, text=True, timeout=600)
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    folder = next((tmp_path / "sweeps").iterdir())
    root = _copy_repo_pages(tmp_path / "root")
    for name in CLAIM_FILES.values():
        (root / "benchmarks" / "results" / name).unlink(missing_ok=True)
    out = root / "benchmarks" / "results" / CLAIM_FILES["gemma-26b"]
    made = subprocess.run([sys.executable, "-m", "benchmarks.peers.big_sweep", str(folder), "--pair",
                           "gemma-4-26B-A4B-it", "--out", str(out)], cwd=REPO, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    again = subprocess.run([sys.executable, "-m", "benchmarks.peers.big_sweep", str(folder), "--pair", "Qwen3-8B",
                            "--out", str(out)], cwd=REPO, capture_output=True, text=True)
    assert again.returncode != 0 and "holds gemma-4-26B-A4B-it's runs, not Qwen3-8B's" in again.stderr
    assert tables.main(["--root", str(root)]) == 0
    block = re.search(r"<!-- table:release_claims -->\n(.*?)<!-- /table:release_claims -->",
                      (root / "docs/results/release-claims.md").read_text(), re.S).group(1)
    rows = [line.split(" | ") for line in block.splitlines() if line.startswith("| ") and "---" not in line][1:]
    gemma = [r for r in rows if "emulator" in r[2]]
    assert [(r[3], r[4]) for r in gemma] == [("gsm8k", "1"), ("gsm8k", "2")]
    assert gemma[0][0] == "| gemma-26b: gemma-4-26B-A4B-it" and gemma[0][1].startswith("222.3 tok/s, 3.4x over AR")
    assert gemma[1][0] == "| " and all(r[7].endswith("x") for r in gemma)  # DFlash / AR of each measured cell
    assert sum("| awaited |" in line for line in block.splitlines()) == 3
    assert "differs: GPU: 1x" in block and "weights emulated" in block
    assert f"Awaited: `benchmarks/results/{CLAIM_FILES['qwen3-8b']}`: measured by `bash benchmarks/peers/mission.sh" in block
    assert f"Source: `benchmarks/results/{CLAIM_FILES['gemma-26b']}`" in block
    assert f"Awaited: `benchmarks/results/{CLAIM_FILES['gemma-26b']}`" not in block


def test_the_claims_table_sets_dflash_against_eagle3_and_reads_per_user_speed():
    from benchmarks.tables.renderers_claims import CLAIM_FILES, release_claims

    def row(mode: str, tok: float, tau: float | None = None) -> dict:
        return {"engine": "vllm", "mode": mode, "suite": "gsm8k", "concurrency": 8, "gpus": 1, "status": "complete",
                "tok_s": tok, "tok_s_per_gpu": tok, "ttft_ms_p50": 30.0, "tpot_ms_p50": 8.0 if mode == "dflash" else 20.0,
                "peak_mem_mib": None, "prefix_cache_hit_rate": None, "tau": tau,
                "synthetic_tau": 6.5 if mode != "ar" else None,
                "synthetic_source": "6.5, over 7 drafts" if mode == "eagle3" else "6.5" if mode == "dflash" else None}
    run = {"sweep_id": "s", "device": "1x NVIDIA H200", "gpus_per_server": 1, "command": "dflash-bench sweep X",
           "servers": {}, "weights": "random",
           "rows": [row("ar", 400.0), row("dflash", 1000.0, 6.4), row("eagle3", 800.0, 6.5)]}
    results = [{"pair": "Qwen3-8B", "runs": [run], "measured": "one H200, 2026-11-29"} if key == "eagle3" else None
               for key in CLAIM_FILES]
    table = release_claims(results)
    measured = next(r for r in table.rows if r[0] == "eagle3: Qwen3-8B")
    assert measured[5:] == ["400.0", "1000.0", "2.50x", "6.40 (drawn 6.5)", "800.0 (τ 6.50, drawn 6.5)", "1.25x",
                            "50.0", "125.0", "50.0", "1000.0"]
    assert measured[2] == "vLLM, 1x H200 (run 1)"
    assert any("acceptance drawn at tau 6.5 (published: measured)" in n and "GPU: 1x H200 a server" in n
               for n in table.notes)
    assert "eagle3: measured on one H200, 2026-11-29." in table.notes  # the file's where and when, once a claim
    assert any(n.startswith("eagle3 run 1: EAGLE-3's τ is drawn over its own 7 drafts a step") for n in table.notes)
    run["routing"] = "alike"  # a mixture's random weights, routed as they route: said on the row and in its note
    table = release_claims(results)
    measured = next(r for r in table.rows if r[0] == "eagle3: Qwen3-8B")
    assert measured[2] == "vLLM, 1x H200 (run 1, experts alike)"
    assert any("every token routed to the same few experts" in n for n in table.notes)
    run["routing"] = "random"  # the note names the switch of the run's own engine
    notes = [n for n in release_claims(results).notes if "experts drawn at random for each token" in n]
    assert len(notes) == 1 and "(VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random;" in notes[0]
    for row in run["rows"]:
        row["engine"] = "sglang"
    notes = [n for n in release_claims(results).notes if "experts drawn at random for each token" in n]
    assert len(notes) == 1 and "(SGLANG_SIMULATE_UNIFORM_EXPERTS=1;" in notes[0] and "VLLM_MOE" not in notes[0]


def test_a_runs_routing_is_read_from_its_servers_environment_and_its_pairs_shape():
    """A mixture's random weights: "random" where every server drew experts through its engine's switch, "alike"
    where any did not (another engine's switch is not its own); a dense pair, real weights or no server started:
    nothing to say."""
    from benchmarks.peers.big_sweep import routing_of

    vllm = ("vllm", ["VLLM_MOE_ROUTING_SIMULATION_STRATEGY", "VLLM_SERVER_DEV_MODE"])
    sglang = ("sglang", ["SGLANG_SIMULATE_UNIFORM_EXPERTS"])
    assert routing_of("gpt-oss-120b", "random", [vllm, vllm]) == "random"
    assert routing_of("gpt-oss-120b", "random", [sglang]) == "random"
    assert routing_of("gemma-4-26B-A4B-it", "random", [vllm, ("vllm", ["VLLM_SERVER_DEV_MODE"])]) == "alike"
    assert routing_of("gemma-4-26B-A4B-it", "random", [("sglang", vllm[1])]) == "alike"
    assert routing_of("gemma-4-26B-A4B-it", "random", []) is None  # no server started: nothing was routed
    assert routing_of("gpt-oss-120b", "real", []) is None
    assert routing_of("gemma-4-31B-it", "random", []) is None


def test_the_readmes_headline_sets_the_engines_side_by_side_per_suite_at_the_cards_tau():
    """big_sweep's file of mission.sh's sweeps (each engine's AR, its DFlash alone at the card's tau, and a random
    drafter's): the README's table has a row per suite and concurrency with each engine's AR and DFlash tok/s, its
    DFlash / AR over its own AR run of the same workload and the τ it realized of the drawn one, the card beside;
    the random drafter's rows are the docs' table's; each engine's line says where DFlash stops paying."""
    def run(engine: str, mode: str, tok: list[float], workload: str = "w", card: bool = True) -> dict:
        rows = [{"engine": engine, "mode": mode, "suite": "gsm8k", "concurrency": c, "gpus": 2, "status": "complete",
                 "tok_s": t, "tok_s_per_gpu": t / 2, "ttft_ms_p50": 30.0, "tpot_ms_p50": 1000.0 * c / t,
                 "peak_mem_mib": None, "prefix_cache_hit_rate": None, "tau": 7.5 if mode == "dflash" else None,
                 "synthetic_tau": 7.53 if mode == "dflash" and card else None,
                 "synthetic_source": "card gsm8k" if mode == "dflash" and card else None} for c, t in zip((1, 32), tok)]
        return {"sweep_id": f"{engine}-{mode}-{card}", "device": "2x NVIDIA H200", "gpus_per_server": 2,
                "weights": "random", "command": f"dflash-bench sweep --engine {engine} --modes {mode}", "servers": {},
                "workload": workload, "versions": {"vllm": "0.26.0"}, "rows": rows}
    data = {"pair": "gemma-4-31B-it", "weights": "random", "measured": "two H200s, 2026-11-30",
            "runs": [run("vllm", "ar", [56.0, 1278.0]), run("vllm", "dflash", [332.0, 3566.0]),
                     run("vllm", "dflash", [40.0, 500.0], card=False),
                     run("builtin", "ar", [58.6, 1420.0]), run("builtin", "dflash", [406.7, 1300.0])]}
    table = renderers_mission.mission_by_suite([data])
    cells = {r[1]: dict(zip(table.header, r)) for r in table.rows}
    assert list(cells) == ["1", "32"] and all(r[0] == "gsm8k" for r in table.rows)
    assert cells["1"]["builtin: AR / DFlash tok/s"] == "58.6 / 406.7 ★" and cells["1"]["vllm: DFlash / AR"] == \
        "5.93x (τ 7.50 of 7.53)"
    assert cells["32"]["vllm: AR / DFlash tok/s"] == "1,278.0 / 3,566.0 ★"  # not the random drafter's 500.0
    assert cells["32"]["builtin: DFlash / AR"] == "0.92x (τ 7.50 of 7.53)"
    assert cells["1"]["card (1x B300): DFlash / AR"] == "5.30x (τ 7.53)"
    assert "- builtin: below 1 in gsm8k c=32 (0.92x); at c=32 0.92x (gsm8k) to 0.92x (gsm8k)" in table.notes
    assert "- vllm: pays in every cell measured (2, 1 suite); at c=32 2.79x (gsm8k) to 2.79x (gsm8k)" in table.notes
    assert not any("2026-11-30" in n for n in table.notes)  # the calls' history is the docs' to quote
    assert not any("dflash-bench sweep" in n for n in table.notes)  # the docs' table gives each run's command
    assert any("dflash-bench sweep --engine vllm --modes dflash" in n
               for n in renderers_mission.mission_engines([data]).notes)
    data["runs"][1]["workload"] = "other"  # an AR run of another workload is not vLLM's DFlash's partner
    unpaired = renderers_mission.mission_by_suite([data])
    assert [h for h in unpaired.header if h.startswith("vllm")] == []  # no vLLM DFlash beside its own AR: no column


def test_the_input_length_rows_are_set_along_one_axis_as_the_report_sets_them():
    """big_sweep's file of the long-<N> sweeps keeps each cell's prompt length; the docs' by-length table gives, per
    engine and concurrency, DFlash / AR and τ at each length, lengths ascending, and '-' where a length is missing."""
    def rows(mode: str, tok: dict[tuple[int, int], float]) -> list[dict]:
        return [{"engine": "vllm", "mode": mode, "suite": {128: "long-128", 1024: "long-1k"}[n], "concurrency": c,
                 "gpus": 1, "status": "complete", "tok_s": t, "tok_s_per_gpu": t, "ttft_ms_p50": 30.0,
                 "tpot_ms_p50": 10.0, "peak_mem_mib": None, "prefix_cache_hit_rate": None,
                 "tau": 6.8 if mode == "dflash" else None, "synthetic_tau": 6.9 if mode == "dflash" else None,
                 "synthetic_source": "card mean" if mode == "dflash" else None, "input_len": n}
                for (n, c), t in tok.items()]
    run = {"sweep_id": "s", "device": "1x NVIDIA H200", "gpus_per_server": 1, "weights": "random", "command": "x",
           "servers": {}, "rows": rows("ar", {(1024, 1): 50.0, (128, 1): 56.0, (128, 8): 400.0})
           + rows("dflash", {(1024, 1): 200.0, (128, 1): 330.0, (128, 8): 1800.0})}
    table = renderers_mission.mission_lengths([{"pair": None, "weights": "random", "runs": [run]}])
    assert table.header == ["engine", "τ of", "c", "long-128 (128 tokens)", "long-1k (1024 tokens)"]
    assert [r[2:] for r in table.rows] == [["1", "5.89x (τ 6.80)", "4.00x (τ 6.80)"], ["8", "4.50x (τ 6.80)", "-"]]
    without = [dict(r, input_len=0) for r in run["rows"]]  # a file of the suites' own prompts: no such axis
    assert renderers_mission.mission_lengths([{"pair": None, "weights": "random", "runs": [dict(run, rows=without)]}]).rows == []


def test_a_cells_first_tokens_are_set_beside_its_ttft_and_the_servers_split():
    """The first-token table gives, per cell of more than one request at a time, its tok/s, the TTFT's median (and
    a multi-turn suite's later turns' alone), mean and p90, the server's queue and prefill, and the groups its first
    tokens came in; a one-at-a-time cell, a failed cell and a cell read from an older file (no groups) are left out."""
    base = {"engine": "builtin", "mode": "ar", "suite": "gsm8k", "gpus": 1, "status": "complete", "tok_s": 1440.4,
            "tok_s_per_gpu": 1440.4, "ttft_ms_p50": 302.5, "tpot_ms_p50": 21.9, "peak_mem_mib": None,
            "prefix_cache_hit_rate": None, "tau": None, "ttft_ms_mean": 366.3, "ttft_ms_p90": 508.6,
            "server_queue_ms": 118.7, "server_prefill_ms": 231.0}
    groups = [{"requests": 1, "ttft_ms": 31.0}, {"requests": 18, "ttft_ms": 302.4}, {"requests": 13, "ttft_ms": 497.1}]
    run = {"sweep_id": "s", "device": "1x NVIDIA H200", "gpus_per_server": 1, "weights": "random", "command": "x",
           "servers": {}, "rows": [dict(base, concurrency=32, first_tokens=groups),
                                   dict(base, concurrency=32, suite="mt-bench", ttft_ms_p50_later_turns=130.3,
                                        first_tokens=groups[1:]),
                                   dict(base, concurrency=1, first_tokens=groups[:1]),
                                   dict(base, concurrency=8, tok_s=None, status="failed", first_tokens=[]),
                                   dict(base, concurrency=16)]}
    table = renderers_mission.first_tokens([{"pair": None, "weights": "random", "runs": [run], "measured": "here",
                                             "first_token_gap_ms": 5.0}])
    assert table.rows == [["1", "builtin", "ar", "gsm8k", "32", "1440.4", "302.5", "-", "366.3", "508.6", "118.7",
                           "231.0", "1 at 31, 18 at 302, 13 at 497"],
                          ["1", "builtin", "ar", "mt-bench", "32", "1440.4", "302.5", "130.3", "366.3", "508.6",
                           "118.7", "231.0", "18 at 302, 13 at 497"]]
    assert any("more than 5 ms after the one before" in n for n in table.notes) and table.notes[-1] == "Measured on here."
