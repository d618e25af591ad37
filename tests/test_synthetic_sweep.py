"""`sweep --synthetic-acceptance TAU|card`: each DFlash server launched with its suite's profile (one server per
profile), every cell recording the profile it was given; engines without a synthetic mode refused before anything
starts; and the --modes / --waves options the mission's steps use."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dflash_bench.errors import UserError
from dflash_bench.store import SweepDir
from dflash_bench.options import check_fields
from dflash_bench.sweep.check import checked
from dflash_bench.sweep.plan import SweepSettings, launches, plan_cells
from dflash_bench.sweep.prompts import prompts_per_cell
from dflash_bench.sweep.run import server_groups
from dflash_bench.synthetic import suite_profile
from dflash_bench.models import resolve
from sweep_helpers import assert_servers_gone, only_sweep, results

GEMMA = resolve("gemma-4-31B-it")
SUITES = ["gsm8k", "mt-bench", "spec-bench"]


def _settings(**kw) -> SweepSettings:
    base = dict(model="gemma-4-31B-it", engines=["vllm"], suites=SUITES, concurrency=[1, 8])
    return SweepSettings(**(base | kw))


def test_card_gives_each_suite_its_own_dflash_server_and_the_ar_server_none():
    plan = plan_cells(_settings(synthetic_acceptance="card"))
    assert all(c.synthetic is None for c in plan if c.mode == "ar")
    for c in plan:
        if c.mode == "dflash":
            assert c.synthetic == suite_profile("card", GEMMA, c.suite)
    groups = launches(plan)
    assert [(g.mode, [c.suite for c in g.cells][0], len(g.cells)) for g in groups] == [
        ("ar", "gsm8k", 6), ("dflash", "gsm8k", 2), ("dflash", "mt-bench", 2), ("dflash", "spec-bench", 2)]
    assert [g.synthetic.tau if g.synthetic else None for g in groups] == [None, 7.53, 4.23, 6.9]


def test_the_suites_the_card_lacks_share_one_profile_and_one_server():
    """The input-length axis at the card's tau: every long-<N> suite draws the card's mean, so one DFlash server
    measures them all, and the lengths differ in nothing else."""
    groups = launches(plan_cells(_settings(synthetic_acceptance="card", suites=["gsm8k"], input_lens=[128, 1024, 4096])))
    assert [(g.mode, sorted({c.suite for c in g.cells})) for g in groups] == [
        ("ar", ["gsm8k", "long-128", "long-1k", "long-4k"]), ("dflash", ["gsm8k"]),
        ("dflash", ["long-128", "long-1k", "long-4k"])]


def test_a_mean_gives_every_dflash_cell_one_profile_and_one_server():
    groups = launches(plan_cells(_settings(synthetic_acceptance="6.5")))
    assert [(g.mode, len(g.cells)) for g in groups] == [("ar", 6), ("dflash", 6)]
    assert groups[1].synthetic is not None and groups[1].synthetic.tau == 6.5


def test_paired_card_brings_both_servers_up_again_for_each_profile():
    plan = plan_cells(_settings(synthetic_acceptance="card", paired=True))
    groups = server_groups(launches(plan, paired=True), paired=True)
    assert [[(launch.mode, len(launch.cells)) for launch in g] for g in groups] == [[("ar", 2), ("dflash", 2)]] * 3
    assert [g[1].synthetic.tau for g in groups] == [7.53, 4.23, 6.9]  # type: ignore[union-attr]


def test_a_dflash_only_sweep_at_the_cards_tau_and_waves_of_prompts():
    """mission.sh's tau steps: --modes dflash (the AR cells are another sweep's) and --waves 2 (every concurrency
    holds its requests in flight twice over, a concurrency-1 cell at least -n)."""
    plan = plan_cells(_settings(modes=["dflash"], synthetic_acceptance="card", repeats=2))
    assert {c.mode for c in plan} == {"dflash"} and len(plan) == 2 * 3 * 2 and all(c.synthetic for c in plan)
    assert [(g.cells[0].suite, g.cells[0].repeat) for g in launches(plan)] == [
        (s, r) for r in (0, 1) for s in SUITES]  # a server per suite's profile, repeat after repeat
    settings = _settings(waves=2, num_prompts=4, concurrency=[1, 8, 32])
    assert [prompts_per_cell(settings, c) for c in (1, 8, 32)] == [4, 16, 64]
    assert prompts_per_cell(_settings(num_prompts=4), 32) == 32  # without waves: raised to the concurrency
    with pytest.raises(UserError, match="--waves must be at least 1"):
        check_fields(SweepSettings, {"waves": 0})


def test_an_eagle3_server_draws_the_same_tau_over_its_own_draft_length():
    plan = plan_cells(_settings(modes=["ar", "dflash", "eagle3"], synthetic_acceptance="card", suites=["gsm8k"]))
    drawn = {c.mode: c.synthetic for c in plan if c.concurrency == 1}
    assert drawn["ar"] is None and drawn["dflash"] is not None and drawn["eagle3"] is not None
    assert len(drawn["eagle3"].rates) == GEMMA.eagle3_tokens and drawn["eagle3"].tau == drawn["dflash"].tau


@pytest.mark.parametrize("options, words", [
    (dict(engines=["vllm", "sglang"]), "SGLang's DFlash has no synthetic acceptance"),
    (dict(engines=["llamacpp"]), "the llamacpp engine has no synthetic acceptance"),
    (dict(engines=["builtin"]), "on its fast path only: add --engine-arg=--fast"),
    (dict(engines=["builtin"], engine_args=["--fast", "--synthetic-acceptance=3"]), "keep the sweep's option only"),
    (dict(engines=["vllm"], url_ar="http://127.0.0.1:1", url_dflash="http://127.0.0.1:2"), "--url-ar/--url-dflash"),
])
def test_what_cannot_draw_the_profile_is_refused_in_one_sentence(options, words):
    values = dict(model="gemma-4-31B-it", suites=SUITES, synthetic_acceptance="card") | options
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
        checked(values)
    assert checked(dict(values, engines=["vllm"], url_ar=None, url_dflash=None)).synthetic_acceptance == "card"


def test_card_for_a_pair_whose_card_has_no_tau_is_refused_before_the_plan():
    with pytest.raises(UserError, match="publishes none: give a mean tau instead"):
        checked(dict(model="Qwen3.5-4B", suites=["math500"], engines=["vllm"], synthetic_acceptance="card"))


@pytest.mark.parametrize("value", ["0.9", "high", "inf"])
def test_a_setting_neither_card_nor_a_mean_is_refused_from_the_command_line_or_a_manifest(value):
    with pytest.raises(UserError, match="a mean acceptance length \\(tau, at least 1\\) or 'card'"):
        check_fields(SweepSettings, {"synthetic_acceptance": value})
    check_fields(SweepSettings, {"synthetic_acceptance": "card"})


def test_sglang_is_refused_before_any_folder_or_server(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dflash_bench", "sweep", "--model", "gemma-4-31B-it", "--engine",
                           "sglang", "--synthetic-acceptance", "card", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: SGLang's DFlash has no synthetic acceptance")
    assert len(proc.stderr.strip().splitlines()) == 1 and not any(tmp_path.iterdir())


def test_a_card_sweep_through_the_emulator_records_each_cells_profile(tmp_path, data_dir):
    """A DFlash-only sweep at the card's tau, as mission.sh's tau steps run it, end to end on the emulator: each
    cell's summary, results.csv row and plan entry carry the profile its server drew; the server's command carried
    the same rates; it resumes with nothing left to run."""
    from dflash_bench.launch import free_port

    argv = [sys.executable, "-m", "dflash_bench", "sweep", "--model", "gemma-4-31B-it", "--engine", "emulator",
            "--suites", "gsm8k,mt-bench", "-c", "1,2", "-n", "2", "--waves", "2", "--modes", "dflash",
            "--synthetic-acceptance", "card", "--max-tokens", "32", "--port", str(free_port()),
            "--engine-arg=--ttft-ms=5", "--engine-arg=--itl-ms=2", "--data-dir", str(data_dir), "--out", str(tmp_path)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    folder = only_sweep(tmp_path)
    sweep = SweepDir.open(folder)
    manifest = sweep.read_manifest()
    assert manifest.settings is not None and manifest.settings.synthetic_acceptance == "card"
    rows = results(folder)
    assert sorted(rows) == ["emulator-dflash-gsm8k-c1", "emulator-dflash-gsm8k-c2", "emulator-dflash-mt-bench-c1",
                            "emulator-dflash-mt-bench-c2"]
    for summary in sweep.summaries():
        drawn = suite_profile("card", GEMMA, summary.suite)
        assert drawn is not None and manifest.cell(summary.cell_id).synthetic == drawn
        assert summary.synthetic_acceptance == drawn.tau and summary.synthetic_source == f"card {summary.suite}"
        assert summary.synthetic_rates == list(drawn.rates)
        row = rows[summary.cell_id]
        assert [float(x) for x in row["synthetic_rates"].split(";")] == list(drawn.rates)
        assert summary.num_requests == (2 if summary.concurrency == 1 else 4) * (2 if summary.suite == "mt-bench" else 1)
    servers = [s for k, s in manifest.servers.items() if k.startswith("emulator-dflash")]
    assert len(servers) == 2  # one per profile
    for server in servers:
        given = server.command[server.command.index("--acceptance-rates") + 1]
        assert given in {",".join(map(str, suite_profile("card", GEMMA, s).rates)) for s in ("gsm8k", "mt-bench")}  # type: ignore[union-attr]
    assert_servers_gone(folder)
    again = subprocess.run([*argv[:4], "--resume", str(folder), "--data-dir", str(data_dir)],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert json.loads((folder / "manifest.json").read_text())["status"] == "complete"
