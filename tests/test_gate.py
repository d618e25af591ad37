"""The regression gate on sweep folders written through dflash_bench.store, values planted by the tests."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dflash_bench import gate
from dflash_bench.cli import app
from dflash_bench.errors import UserError
from dflash_bench.store import (
    AccuracySummary, CellPlan, CellSummary, LosslessSummary, Manifest, Stat, SweepDir, cell_id,
)

AR = {1: 100.0, 8: 480.0, 32: 1200.0}  # tok/s of the AR cells per concurrency; DFlash is 3x
SMALL_NOISE = (1.0, 1.006, 0.994)


def plant(path: Path, *, concurrency=(1, 8), repeats=3, noise=SMALL_NOISE, scale=None, tau_scale=1.0,
          exact=None, accuracy=None, failed=(), reason="server exited with code 137", suite="gsm8k", models=None,
          warned=(), modes=("ar", "dflash")) -> Path:
    """A sweep folder with known numbers. scale: {(mode, c): factor on throughput}; failed: cell ids;
    warned: speculative cell ids whose summary says they did not speculate (dflash_warning); an eagle3 mode runs
    at 2x AR."""
    scale = scale or {}
    plan, summaries = [], []
    for r in range(repeats):
        for mode in modes:
            for c in concurrency:
                cid = cell_id("vllm", mode, suite, c, r)
                plan.append(CellPlan(cell_id=cid, engine="vllm", mode=mode, suite=suite, concurrency=c, repeat=r))
                if cid in failed:
                    summaries.append(CellSummary(cell_id=cid, engine="vllm", mode=mode, suite=suite, concurrency=c,
                                                 repeat=r, status="failed", failure_reason=reason))
                    continue
                tput = AR[c] * {"ar": 1.0, "dflash": 3.0, "eagle3": 2.0}[mode] * noise[r] * scale.get((mode, c), 1.0)
                tpot = 1000.0 * c / tput
                quality = {"lossless": LosslessSummary(exact_match_rate=exact)} if exact is not None and mode == "dflash" else {}
                if accuracy is not None:
                    quality["accuracy"] = AccuracySummary(status="ok", n=50, accuracy=accuracy[mode])
                summaries.append(CellSummary(
                    cell_id=cid, engine="vllm", mode=mode, suite=suite, concurrency=c, repeat=r,
                    output_throughput=tput, tpot_ms=Stat(n=10, mean=tpot, p50=tpot),
                    acceptance_length=6.0 * tau_scale if mode == "dflash" else None, **quality,
                    dflash_warning="tau 1.00: the drafter's tokens were (almost) never accepted" if cid in warned else None))
    sweep = SweepDir.create(path, Manifest(sweep_id=path.name, plan=plan, models=models or {"target": {"id": "t"}, "drafter": {"id": "d"}}))
    for s in summaries:
        sweep.write_summary(s)
    sweep.write_results_csv()
    return path


def cli(*args) -> tuple[int, str]:
    """Invoke `dflash-bench gate` the way cli.main does: a UserError becomes its exit code and one line."""
    res = CliRunner().invoke(app, ["gate", *map(str, args)])
    if isinstance(res.exception, UserError):
        return res.exception.exit_code, str(res.exception)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res.exit_code, res.output


def failing(result: gate.GateResult) -> set[tuple[str, str]]:
    return {(c.cell, c.metric.name) for c in result.failures}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return plant(tmp_path_factory.mktemp("b") / "baseline")


def test_identical_sweeps_pass(base, tmp_path):
    code, out = cli(base, "--baseline", base, "--junit", tmp_path / "j.xml", "--markdown", tmp_path / "m.md")
    assert code == 0, out
    assert "PASS" in out
    result = gate.gate(base, base)
    # per cell: throughput and TPOT; DFlash cells add acceptance length and speedup
    assert len(result.checks) == 2 * 2 + 2 * 4
    assert all(c.method == "bootstrap" for c in result.checks if c.metric.noisy)
    assert all(c.verdict == "pass" for c in result.checks)
    assert not result.missing and not result.new


def test_planted_throughput_drop_fails_and_names_its_cell(base, tmp_path):
    sweep = plant(tmp_path / "s", scale={("dflash", 8): 0.90})
    code, out = cli(sweep, "--baseline", base, "--markdown", tmp_path / "m.md")
    assert code == 1
    assert "FAIL" in out and "vllm/dflash/gsm8k/c8" in out
    result = gate.gate(sweep, base)
    # DFlash throughput fell 10% and with it the speedup; TPOT rose 11%
    assert failing(result) == {("vllm/dflash/gsm8k/c8", "output_throughput"), ("vllm/dflash/gsm8k/c8", "speedup"),
                               ("vllm/dflash/gsm8k/c8", "tpot_ms_p50")}
    thr = next(c for c in result.failures if c.metric.name == "output_throughput")
    assert thr.change == pytest.approx(-0.10)
    assert thr.ci[1] < -0.05  # the whole interval is past the threshold
    text = (tmp_path / "m.md").read_text()
    assert "### Regressions" in text and "vllm/dflash/gsm8k/c8" in text.split("<details>")[0]


def test_small_drop_inside_noise_passes_where_a_plain_threshold_fails(tmp_path):
    noisy = (0.92, 1.0, 1.08)
    b = plant(tmp_path / "b", noise=noisy)
    one_pct = gate.gate(plant(tmp_path / "s1", noise=noisy, scale={("ar", 1): 0.99}), b)
    assert one_pct.passed
    # a 7% drop of a cell whose repeats scatter +-8%: the interval reaches inside the threshold, so it passes...
    seven = gate.gate(plant(tmp_path / "s7", noise=noisy, scale={("ar", 1): 0.93}), b)
    chk = next(c for c in seven.checks if (c.cell, c.metric.name) == ("vllm/ar/gsm8k/c1", "output_throughput"))
    assert chk.method == "bootstrap" and chk.verdict == "pass"
    assert chk.change == pytest.approx(-0.07) and chk.ci[0] < -0.05 < chk.ci[1]
    # ...while the same drop without repeats meets the plain threshold, labelled so
    b1 = plant(tmp_path / "b1", repeats=1)
    plain = gate.gate(plant(tmp_path / "p7", repeats=1, scale={("ar", 1): 0.93}), b1)
    chk = next(c for c in plain.checks if (c.cell, c.metric.name) == ("vllm/ar/gsm8k/c1", "output_throughput"))
    assert chk.method == "plain" and chk.verdict == "fail" and "1 vs 1 repeats: plain threshold" in chk.note


def test_bootstrap_is_seeded_and_deterministic():
    boot = gate.Bootstrap(resamples=500, seed=3)
    base, cur = [100, 104, 97, 102, 99], [95, 99, 101, 96, 98]
    a = gate.bootstrap_change(base, cur, boot, seed_key="x")
    assert a == gate.bootstrap_change(base, cur, boot, seed_key="x")
    assert a != gate.bootstrap_change(base, cur, gate.Bootstrap(resamples=500, seed=4), seed_key="x")
    lo, hi = a
    assert lo < sum(cur) / sum(base) - 1 < hi


def test_tau_drop_of_five_percent_fails_one_percent_passes(base, tmp_path):
    five = gate.gate(plant(tmp_path / "t5", tau_scale=0.95), base)
    assert failing(five) == {("vllm/dflash/gsm8k/c1", "acceptance_length"), ("vllm/dflash/gsm8k/c8", "acceptance_length")}
    assert all(c.method == "tight" for c in five.failures)
    assert gate.gate(plant(tmp_path / "t1", tau_scale=0.99), base).passed


def test_tpot_rise_fails_and_throughput_gain_is_improvement(base, tmp_path):
    faster = gate.gate(plant(tmp_path / "f", scale={("ar", 1): 1.2}), base)
    verdicts = {c.metric.name: c.verdict for c in faster.checks if c.cell == "vllm/ar/gsm8k/c1"}
    assert verdicts == {"output_throughput": "improved", "tpot_ms_p50": "improved"}
    # a faster AR lowers the c1 speedup by 1/1.2: that is a speedup regression
    assert failing(faster) == {("vllm/dflash/gsm8k/c1", "speedup")}


def test_mismatched_plans_are_reported(base, tmp_path):
    sweep = plant(tmp_path / "s", concurrency=(8, 32))
    code, out = cli(sweep, "--baseline", base)
    assert code == 0
    assert "missing from the sweep" in out and "vllm/ar/gsm8k/c1" in out
    assert "new in the sweep" in out and "vllm/dflash/gsm8k/c32" in out
    result = gate.gate(sweep, base)
    assert result.missing == ["vllm/ar/gsm8k/c1", "vllm/dflash/gsm8k/c1"]
    assert result.new == ["vllm/ar/gsm8k/c32", "vllm/dflash/gsm8k/c32"]
    assert {c.cell for c in result.checks} == {"vllm/ar/gsm8k/c8", "vllm/dflash/gsm8k/c8"}
    strict = tmp_path / "strict.toml"
    strict.write_text("[cells]\nfail_on_missing = true\n")
    code, out = cli(sweep, "--baseline", base, "--thresholds", strict)
    assert code == 1 and "2 cell(s) missing" in out


def test_nothing_in_common_is_unusable(base, tmp_path):
    other = plant(tmp_path / "o", suite="math500")
    code, msg = cli(other, "--baseline", base)
    assert code == 2
    assert "no cell in common" in msg and "vllm/ar/math500/c1" in msg and "\n" not in msg


@pytest.mark.parametrize("content, words", [
    ("{\"kind\": \"dflash-bench-baseline\", \"cells\": [", "not valid JSON"),
    ("[1, 2]", "not a dflash-bench baseline file"),
    ("{\"kind\": \"dflash-bench-baseline\", \"schema_version\": 1, \"sweep_id\": \"x\", \"cells\": [{\"engine\": 3}]}", "is corrupt"),
    ("{\"kind\": \"dflash-bench-baseline\", \"schema_version\": 9, \"sweep_id\": \"x\"}", "schema version 9"),
])
def test_corrupt_baseline_exits_2_with_one_sentence(base, tmp_path, content, words):
    bad = tmp_path / "baseline.json"
    bad.write_text(content)
    code, msg = cli(base, "--baseline", bad)
    assert code == 2 and words in msg and "\n" not in msg


def test_corrupt_baseline_through_the_console_script(base, tmp_path):
    bad = tmp_path / "baseline.json"
    bad.write_bytes(b"\x00\xff garbage")
    out = subprocess.run([sys.executable, "-m", "dflash_bench", "gate", str(base), "--baseline", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.startswith("error: baseline") and out.stderr.count("\n") == 1
    assert "Traceback" not in out.stderr + out.stdout


def test_regression_exit_code_through_the_console_script(base, tmp_path):
    sweep = plant(tmp_path / "s", scale={("ar", 8): 0.8})
    out = subprocess.run([sys.executable, "-m", "dflash_bench", "gate", str(sweep), "--baseline", str(base)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert "vllm/ar/gsm8k/c8" in out.stdout


def test_export_round_trips(base, tmp_path):
    file = tmp_path / "baseline.json"
    code, out = cli("--export-baseline", base, "-o", file)
    assert code == 0 and "wrote" in out
    loaded = gate.load_baseline(file)
    # everything but created_at (stamped to the second when built: a fresh collect may fall in the next second)
    fresh = gate.collect(base)
    assert loaded.model_dump(exclude={"created_at"}) == fresh.model_dump(exclude={"created_at"})
    assert loaded.cells[0].repeats == [0, 1, 2]
    dflash8 = next(c for c in loaded.cells if c.name == "vllm/dflash/gsm8k/c8")
    assert dflash8.metrics["output_throughput"] == pytest.approx([1440.0, 1440.0 * 1.006, 1440.0 * 0.994])
    assert dflash8.metrics["speedup"] == pytest.approx([3.0, 3.0, 3.0])
    assert file.stat().st_size < 20_000
    sweep = plant(tmp_path / "s", scale={("dflash", 1): 0.85})
    from_file, from_dir = gate.gate(sweep, file), gate.gate(sweep, base)
    assert [(c.cell, c.metric.name, c.verdict, c.ci) for c in from_file.checks] == \
           [(c.cell, c.metric.name, c.verdict, c.ci) for c in from_dir.checks]


def test_export_needs_output_and_a_complete_cell(base, tmp_path):
    code, msg = cli("--export-baseline", base)
    assert code == 2 and "-o" in msg
    empty = plant(tmp_path / "e", repeats=1, failed={cell_id("vllm", m, "gsm8k", c) for m in ("ar", "dflash") for c in (1, 8)})
    code, msg = cli("--export-baseline", empty, "-o", tmp_path / "x.json")
    assert code == 2 and "no complete cell" in msg and not (tmp_path / "x.json").exists()


def test_junit_parses_with_the_right_counts(base, tmp_path):
    sweep = plant(tmp_path / "s", concurrency=(1,), scale={("ar", 1): 0.5})  # c8 missing; AR c1 halved
    junit = tmp_path / "gate.xml"
    code, _ = cli(sweep, "--baseline", base, "--junit", junit)
    assert code == 1
    suite = ET.parse(junit).getroot().find("testsuite")
    cases = suite.findall("testcase")
    # c1: AR 2 metrics + DFlash 4 metrics; two baseline cells missing from the sweep
    assert int(suite.get("tests")) == len(cases) == 6 + 2
    failures = [c for c in cases if c.find("failure") is not None]
    # AR throughput halved: its throughput and TPOT fail; the c1 speedup doubles, an improvement
    assert int(suite.get("failures")) == len(failures) == 2
    assert {(c.get("classname"), c.get("name")) for c in failures} == {
        ("dflash_bench.gate.vllm.ar.gsm8k.c1", "output throughput"), ("dflash_bench.gate.vllm.ar.gsm8k.c1", "TPOT p50")}
    assert int(suite.get("skipped")) == len([c for c in cases if c.find("skipped") is not None]) == 2
    thr = next(c for c in failures if c.get("name") == "output throughput").find("failure")
    assert "-50.0%" in thr.get("message") and "allowed -5.0%" in thr.get("message")
    assert "baseline: [100, 100.6, 99.4]" in thr.text and "sweep: [50, 50.3, 49.7]" in thr.text


def test_junit_survives_terminal_escapes_in_a_failure_reason(base, tmp_path):
    sweep = plant(tmp_path / "s", failed={cell_id("vllm", "ar", "gsm8k", 1)}, reason="\x1b[31mCUDA error\x1b[0m \x00 <oom> & more")
    junit = tmp_path / "gate.xml"
    assert cli(sweep, "--baseline", base, "--junit", junit)[0] == 1
    failures = [f for f in ET.parse(junit).iter("failure")]
    assert len(failures) == 2  # the AR c1 cell's throughput and TPOT
    assert all("[31mCUDA error[0m  <oom> & more" in f.get("message") for f in failures)


def test_lossless_rate_gated_when_present_skipped_when_absent(tmp_path):
    b = plant(tmp_path / "b", exact=1.0)
    drop = gate.gate(plant(tmp_path / "d", exact=0.9), b)
    assert failing(drop) == {("vllm/dflash/gsm8k/c1", "exact_match_rate"), ("vllm/dflash/gsm8k/c8", "exact_match_rate")}
    absent = gate.gate(plant(tmp_path / "a"), b)
    skipped = [c for c in absent.checks if c.verdict == "skipped"]
    assert absent.passed and {c.metric.name for c in skipped} == {"exact_match_rate"} and len(skipped) == 2


def test_task_accuracy_gated_when_scored(tmp_path):
    b = plant(tmp_path / "b", accuracy={"ar": 0.90, "dflash": 0.90})
    drop = gate.gate(plant(tmp_path / "d", accuracy={"ar": 0.90, "dflash": 0.80}), b)
    assert failing(drop) == {("vllm/dflash/gsm8k/c1", "accuracy"), ("vllm/dflash/gsm8k/c8", "accuracy")}
    assert gate.gate(plant(tmp_path / "s", accuracy={"ar": 0.88, "dflash": 0.88}), b).passed  # -2.2%: inside 5%
    unscored = gate.gate(plant(tmp_path / "u"), b)
    assert unscored.passed and {c.metric.name for c in unscored.checks if c.verdict == "skipped"} == {"accuracy"}


def test_failed_cell_fails_its_metrics_with_the_reason(base, tmp_path):
    sweep = plant(tmp_path / "s", failed={cell_id("vllm", "dflash", "gsm8k", 1, 2)})
    result = gate.gate(sweep, base)
    assert {c for c, _ in failing(result)} == {"vllm/dflash/gsm8k/c1"}
    assert all("code 137" in c.note and c.method == "failed cell" for c in result.failures)
    no_reason = gate.collect(plant(tmp_path / "n", failed={cell_id("vllm", "ar", "gsm8k", 8)}, reason=None))
    assert next(c for c in no_reason.cells if c.failed).failed == {"vllm-ar-gsm8k-c8": "failed"}
    long = gate.collect(plant(tmp_path / "l", failed={cell_id("vllm", "ar", "gsm8k", 8)}, reason="x" * 5000))
    assert len(next(c for c in long.cells if c.failed).failed["vllm-ar-gsm8k-c8"]) == 300


def test_a_dflash_cell_that_did_not_speculate_fails_the_gate_by_itself(base, tmp_path):
    warned = cell_id("vllm", "dflash", "gsm8k", 8, 1)
    sweep = plant(tmp_path / "s", warned={warned})
    result = gate.gate(sweep, base)  # every number matches the baseline: only the warning fails it
    assert failing(result) == {("vllm/dflash/gsm8k/c8", "speculation")}
    (chk,) = result.failures
    assert chk.method == "no speculation" and warned in chk.note and "never accepted" in chk.note
    junit = tmp_path / "gate.xml"
    code, out = cli(sweep, "--baseline", base, "--junit", junit, "--markdown", tmp_path / "m.md")
    assert code == 1 and "speculation" in out
    assert [f.get("message") for f in ET.parse(junit).iter("failure") if "never accepted" in (f.text or "") + f.get("message")]
    assert "speculation" in (tmp_path / "m.md").read_text()
    assert gate.gate(base, sweep).passed  # the baseline's own warnings are not the sweep's regression


def test_eagle3_cells_are_gated_as_a_speculative_mode_beside_dflash(tmp_path):
    """A sweep run with --modes ar,dflash,eagle3: an EAGLE-3 cell's speedup over AR is gated as DFlash's is, and an
    EAGLE-3 cell that did not speculate fails the gate."""
    modes = ("ar", "dflash", "eagle3")
    base = plant(tmp_path / "b", modes=modes)
    (speedup,) = [c.metrics["speedup"] for c in gate.collect(base).cells if c.mode == "eagle3" and c.concurrency == 8]
    assert speedup == pytest.approx([2.0] * 3)
    slower = plant(tmp_path / "s", modes=modes, scale={("eagle3", 8): 0.7})
    assert failing(gate.gate(slower, base)) == {("vllm/eagle3/gsm8k/c8", m) for m in ("output_throughput", "tpot_ms_p50",
                                                                                     "speedup")}
    warned = plant(tmp_path / "w", modes=modes, warned={cell_id("vllm", "eagle3", "gsm8k", 1, 2)})
    assert failing(gate.gate(warned, base)) == {("vllm/eagle3/gsm8k/c1", "speculation")}


def test_tau_missing_from_the_sweep_fails(base, tmp_path):
    sweep = plant(tmp_path / "s", tau_scale=0.0)  # acceptance_length 0.0 is a value: a 100% drop
    assert ("vllm/dflash/gsm8k/c1", "acceptance_length") in failing(gate.gate(sweep, base))
    cur = gate.collect(base)
    for c in cur.cells:
        c.metrics.pop("acceptance_length", None)
    result = gate.compare(cur, gate.collect(base))
    assert {(c.metric.name, c.method) for c in result.failures} == {("acceptance_length", "not measured")}


def test_thresholds_file(base, tmp_path):
    sweep = plant(tmp_path / "s", scale={("ar", 8): 0.9})
    loose = tmp_path / "loose.toml"
    loose.write_text("[thresholds]\nthroughput = 0.15\ntpot = 0.15\n")
    assert cli(sweep, "--baseline", base, "--thresholds", loose)[0] == 0
    assert cli(sweep, "--baseline", base)[0] == 1
    for text, words in [("[thresholds]\nthroughput = 5\n", "thresholds.throughput"),
                        ("[thresholds]\nthruput = 0.1\n", "thruput"), ("[thresholds\n", "not valid TOML")]:
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        code, msg = cli(sweep, "--baseline", base, "--thresholds", bad)
        assert code == 2 and words in msg, msg
    assert cli(sweep, "--baseline", base, "--thresholds", tmp_path / "none.toml")[0] == 2


def test_example_thresholds_file_holds_the_defaults():
    example = Path(__file__).resolve().parents[1] / "examples" / "gate.toml"
    assert gate.load_config(example) == gate.GateConfig()


def test_markdown_escapes_and_notes_differing_models(tmp_path):
    b = plant(tmp_path / "b", suite="a|b<i>")
    s = plant(tmp_path / "s", suite="a|b<i>", models={"target": {"id": "other"}, "drafter": {"id": "d"}}, scale={("ar", 1): 0.5})
    from dflash_bench.gate.output import markdown

    text = markdown(gate.gate(s, b))
    assert "a\\|b&lt;i&gt;" in text and "<i>" not in text
    assert "models differ from the baseline's: target" in text


def test_bad_combinations_of_options(base, tmp_path):
    assert cli(base)[0] == 2  # no --baseline
    assert cli(base, "--baseline", base, "-o", tmp_path / "x.json")[0] == 2
    assert cli("--export-baseline", base, "-o", tmp_path / "x.json", "--baseline", base)[0] == 2
    code, msg = cli(tmp_path / "nowhere", "--baseline", base)
    assert code == 2 and "nowhere" in msg


@pytest.mark.parametrize("width", [80, 100, 160])
def test_the_console_table_fits_the_terminal_with_no_word_split(base, tmp_path, width):
    """Every line within the width, every header, cell name, metric word and verdict whole on its line (at 80-100
    columns the headers used to fold to "ver/dic/t"); the method and the interval shown where they fit."""
    import io

    from rich.console import Console

    from dflash_bench.gate.output import print_table

    sweep = plant(tmp_path / "s", scale={("dflash", 8): 0.8}, tau_scale=0.9, suite="humaneval")
    baseline = plant(tmp_path / "b", suite="humaneval")
    result = gate.gate(sweep, baseline)
    buf = io.StringIO()
    print_table(result, Console(file=buf, width=width, force_terminal=False))
    lines = buf.getvalue().splitlines()
    assert max(len(line) for line in lines) <= width, buf.getvalue()
    header = next(line for line in lines if "cell / metric" in line).split()
    assert {"baseline", "sweep", "change", "allowed", "verdict"} <= set(header), header
    assert width < 160 or {"method", "interval"} <= set(header), header
    words = {w for line in lines for w in line.split()}
    assert {"vllm/dflash/humaneval/c8", "throughput", "acceptance", "pass", "fail"} <= words
    for chk in result.checks:
        assert any(chk.metric.label in " ".join(line.split()) for line in lines), chk.metric.label
