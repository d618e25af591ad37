"""The gate compares like with like and knows the noise of a rerun: a partial cell fails unless gate.toml allows
its share; tau is judged as tau under one width policy, over the acceptance profile across policies, and not at
all (with the sentence why) where it was counted differently; a baseline carrying its run-to-run noise passes a
rerun of the same code and still fails a real regression."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_bench import gate
from dflash_bench.errors import UserError
from dflash_bench.gate.compare import family
from dflash_bench.store import CellPlan, CellSummary, Manifest, Stat, SweepDir, cell_id

# a profile of a block of 5 (4 draft positions): per position (verified, accepted)
FULL = [(100, 80), (100, 60), (100, 40), (100, 20)]  # tau at the full block 3.0
AUTO = [(100, 80), (60, 36), (20, 8), (0, 0)]  # the same acceptance per position, fewer steps verified far out


def plant(path: Path, *, tput=300.0, tau=3.0, policy="full", profile=FULL, definition=2, repeats=3, noise=(1.0,) * 3,
          failed_requests=0, widths=None, spec="dflash") -> Path:
    """widths: the verify widths the speculative cells' steps took (default: the policy's one width, none under auto);
    spec: the speculative mode beside AR."""
    if widths is None:
        widths = ([len(profile or FULL) + 1] if policy == "full" else [2, 3] if policy == "auto"
                  else [int(policy[1:])] if policy else [])
    plan, summaries = [], []
    for r in range(repeats):
        for mode in ("ar", spec):
            cid = cell_id("builtin", mode, "gsm8k", 1, r)
            plan.append(CellPlan(cell_id=cid, engine="builtin", mode=mode, suite="gsm8k", concurrency=1, repeat=r))
            t = tput * noise[r] * (1.0 if mode == spec else 0.5)
            s = CellSummary(cell_id=cid, engine="builtin", mode=mode, suite="gsm8k", concurrency=1, repeat=r,
                            output_throughput=t, tpot_ms=Stat(n=10, mean=1000 / t, p50=1000 / t), num_requests=9,
                            num_ok=9 - failed_requests, num_failed=failed_requests)
            if mode == spec:
                s.acceptance_length, s.acceptance_definition, s.width_policy = tau, definition, policy
                s.acceptance_profile = profile
                s.verify_widths = {w: 10 for w in widths} or None
            if failed_requests:
                s.status, s.failure_reason = "partial", f"{failed_requests} of 9 measured requests failed: HTTP 500"
            summaries.append(s)
    sweep = SweepDir.create(path, Manifest(sweep_id=path.name, plan=plan))
    for s in summaries:
        sweep.write_summary(s)
    return path


def checks(result: gate.GateResult, metric: str = "acceptance_length") -> list[gate.Check]:
    return [c for c in result.checks if c.metric.name == metric]


def test_a_partial_cell_fails_the_gate_unless_gate_toml_allows_its_share(tmp_path):
    base = plant(tmp_path / "base")
    part = plant(tmp_path / "part", failed_requests=3)
    result = gate.gate(part, base)
    [*fails] = checks(result, "failed_requests")
    assert len(fails) == 6 and all(c.verdict == "fail" for c in fails)  # each repeat of each mode
    assert "3 of 9 measured requests failed: HTTP 500" in fails[0].note and result.exit_code == 1
    loose = tmp_path / "loose.toml"
    loose.write_text("[cells]\nallow_failed_share = 0.4\n")
    assert not checks(gate.gate(part, base, gate.load_config(loose)), "failed_requests")[0].verdict == "fail"
    assert gate.main(part, baseline=base, thresholds=loose) == 0


def test_tau_at_one_fixed_width_is_tight_and_under_widths_chosen_by_load_not_compared(tmp_path):
    base = plant(tmp_path / "base", tau=3.0)
    low = plant(tmp_path / "low", tau=2.9)
    [tight] = checks(gate.gate(low, base))
    assert tight.method == "tight" and tight.verdict == "fail" and tight.note == "both verified full"
    assert checks(gate.gate(plant(tmp_path / "same", tau=3.0), base))[0].verdict == "pass"
    w4 = plant(tmp_path / "w4", tau=2.5, policy="w4")
    assert checks(gate.gate(plant(tmp_path / "w4b", tau=2.4, policy="w4"), w4))[0].verdict == "fail"
    # two runs under auto: each its own widths, so their tau (here 10% apart) says nothing about the code
    auto_base = plant(tmp_path / "ab", tau=3.0, policy="auto", profile=AUTO)
    auto_low = plant(tmp_path / "al", tau=2.7, policy="auto", profile=AUTO, widths=[4, 6])
    result = gate.gate(auto_low, auto_base)
    [auto] = checks(result)
    assert auto.verdict == "skipped" and auto.method == "not comparable" and result.exit_code == 0
    assert "widths chosen by load (2, 3 tokens a step)" in auto.note and "(4, 6 tokens a step)" in auto.note
    assert any("not all verified at one fixed width (auto against auto)" in n for n in result.notes)


def test_an_eagle3_cells_tau_is_compared_like_with_like_as_dflashs(tmp_path):
    """EAGLE-3 speculates too: its τ is tight at one fixed width, and under widths chosen by load not compared, with
    the sentence why, as DFlash's."""
    base = plant(tmp_path / "base", tau=3.0, spec="eagle3")
    [tight] = checks(gate.gate(plant(tmp_path / "low", tau=2.9, spec="eagle3"), base))
    assert tight.cell == "builtin/eagle3/gsm8k/c1" and tight.verdict == "fail" and tight.note == "both verified full"
    auto_base = plant(tmp_path / "ab", tau=3.0, policy="auto", profile=AUTO, spec="eagle3")
    result = gate.gate(plant(tmp_path / "al", tau=2.7, policy="auto", profile=AUTO, widths=[4, 6], spec="eagle3"),
                       auto_base)
    [auto] = checks(result)
    assert auto.verdict == "skipped" and auto.method == "not comparable" and result.exit_code == 0
    assert any("speculative cells and the sweep's were not all verified at one fixed width" in n for n in result.notes)


def test_tau_across_widths_is_not_compared_unless_auto_took_one_width_every_step(tmp_path):
    """The acceptance profile does not bridge two widths (tests/test_tau_width.py): across widths the gate says why
    and compares nothing; a cell under auto whose steps all took the whole block is a full-block cell."""
    full = plant(tmp_path / "full", tau=3.0, policy="full", profile=FULL)
    auto = plant(tmp_path / "auto", tau=1.4, policy="auto", profile=AUTO)
    result = gate.gate(auto, full)
    [c] = checks(result)
    assert c.verdict == "skipped" and "the baseline verified the whole block every step" in c.note
    assert "the sweep verified widths chosen by load" in c.note and "--verify-width" in c.note
    assert any("full against auto" in n for n in result.notes) and result.exit_code == 0
    w4 = plant(tmp_path / "w4", tau=2.2, policy="w4")
    assert "4 token(s) a step" in checks(gate.gate(w4, full))[0].note
    whole = plant(tmp_path / "whole", tau=2.9, policy="auto", profile=FULL, widths=[5])
    [c] = checks(gate.gate(whole, full))
    assert c.method == "tight" and c.verdict == "fail" and c.note == "both verified full"


def test_a_baseline_without_a_width_or_from_an_older_definition_is_not_compared_and_says_why(tmp_path):
    old = plant(tmp_path / "old", policy=None, profile=None)
    auto = plant(tmp_path / "auto", tau=1.4, policy="auto", profile=AUTO)
    result = gate.gate(auto, old)
    [c] = checks(result)
    assert c.verdict == "skipped" and c.method == "not comparable"
    assert "its engine's own way (no width policy recorded)" in c.note and "widths chosen by load" in c.note
    assert any("none recorded against auto" in n for n in result.notes)
    older = plant(tmp_path / "older", definition=1)
    result = gate.gate(plant(tmp_path / "now"), older)
    [c] = checks(result)
    assert c.verdict == "skipped" and "different definitions" in c.note
    assert any("another definition" in n for n in result.notes) and result.exit_code == 0


def test_the_baseline_own_repeats_set_the_run_to_run_band_and_a_real_drop_still_fails(tmp_path):
    """A run that sits slower throughout, as a busier machine makes it, passes where the baseline's own repeats moved
    as much; where neither side's repeats moved, or by more than the noise, it fails."""
    spread = (1.0, 1.1, 0.9)
    noisy = plant(tmp_path / "noisy", noise=spread)
    still = plant(tmp_path / "still", noise=(1.0, 1.006, 0.994))
    busier = plant(tmp_path / "busier", tput=300.0 * 0.8, noise=spread)
    result = gate.gate(busier, noisy)
    [tput] = [c for c in checks(result, "output_throughput") if c.cell.startswith("builtin/dflash")]
    assert result.exit_code == 0 and tput.verdict == "pass" and "(the baseline's repeats)" in tput.note
    assert "run-to-run noise cv 10.0%" in tput.note
    assert gate.gate(plant(tmp_path / "busier_still", tput=300.0 * 0.8, noise=(1.0, 1.006, 0.994)), still).exit_code == 1
    assert gate.gate(plant(tmp_path / "slow", tput=300.0 * 0.45, noise=spread), noisy).exit_code == 1


def test_a_run_whose_own_passes_swung_widens_its_timing_checks(tmp_path):
    """A run measured while the machine's load swung (its own passes far apart) is as uncertain as they disagree,
    which a baseline from a quieter stretch cannot know: its throughput and TPOT take its own spread, so a run at
    half the speed passes there; the same drop in a run whose passes held still fails."""
    quiet = plant(tmp_path / "quiet", noise=(1.0, 1.01, 0.99))
    swung = plant(tmp_path / "swung", tput=300.0 * 0.5, noise=(1.0, 1.4, 0.6))
    result = gate.gate(swung, quiet)
    timings = checks(result, "output_throughput") + checks(result, "tpot_ms_p50")
    assert result.exit_code == 0 and len(timings) == 4 and all(c.verdict == "pass" for c in timings)
    assert all("(the sweep's own repeats)" in c.note for c in timings)
    calm = plant(tmp_path / "calm", tput=300.0 * 0.5, noise=(1.0, 1.01, 0.99))
    assert {c.metric.name for c in gate.gate(calm, quiet).failures} == {"output_throughput", "tpot_ms_p50"}


def plant_suites(path: Path, factors: dict[str, tuple[float, ...]], scale: float = 1.0) -> Path:
    """AR and DFlash cells of several suites at concurrency 1; `factors`: per suite, each repeat's factor on the
    DFlash cells' throughput alone (so on the repeat's speedup), `scale` on every DFlash cell's."""
    plan, summaries = [], []
    for suite, per_repeat in factors.items():
        for r, f in enumerate(per_repeat):
            for mode in ("ar", "dflash"):
                cid = cell_id("builtin", mode, suite, 1, r)
                plan.append(CellPlan(cell_id=cid, engine="builtin", mode=mode, suite=suite, concurrency=1, repeat=r))
                t = 200.0 * f * scale if mode == "dflash" else 100.0
                summaries.append(CellSummary(cell_id=cid, engine="builtin", mode=mode, suite=suite, concurrency=1,
                                             repeat=r, output_throughput=t, tpot_ms=Stat(n=9, mean=1000 / t, p50=1000 / t)))
    sweep = SweepDir.create(path, Manifest(sweep_id=path.name, plan=plan))
    for s in summaries:
        sweep.write_summary(s)
    return path


def test_a_paired_speedup_takes_the_whole_spread_of_its_cells_repeats(tmp_path):
    """A speedup divides two cells measured together, yet on a loaded CPU the load moves it cell by cell rather than
    every cell of a pass alike, and a run at another load sits elsewhere in that spread: its figure is the whole
    spread of the group's repeats, as throughput's is, however the moves line up across cells. A DFlash 20% slower
    passes a baseline whose speedups moved that much and fails one whose speedups held still."""
    from dflash_bench.gate.noise import repeat_noise

    suites = ("gsm8k", "humaneval", "math500", "mbpp")
    shared = plant_suites(tmp_path / "shared", {s: (1.0, 1.12, 0.88) for s in suites})
    own = plant_suites(tmp_path / "own", {s: ((1.0, 1.12, 0.88), (0.88, 1.0, 1.12), (1.12, 0.88, 1.0),
                                              (1.0, 1.0, 1.0))[i] for i, s in enumerate(suites)})
    still = plant_suites(tmp_path / "still", {s: (1.0, 1.01, 0.99) for s in suites})
    key = (("builtin", "dflash", 1), "speedup")
    assert repeat_noise(gate.collect(shared))[key].cv > 0.1 and repeat_noise(gate.collect(own))[key].cv > 0.08
    assert repeat_noise(gate.collect(still))[key].cv < 0.02
    slower = plant_suites(tmp_path / "slower", {s: (1.0, 1.01, 0.99) for s in suites}, scale=0.8)
    assert not any(c.metric.name == "speedup" for c in gate.gate(slower, own).failures)
    assert not any(c.metric.name == "speedup" for c in gate.gate(slower, shared).failures)
    assert {c.cell for c in gate.gate(slower, still).failures if c.metric.name == "speedup"} == {
        f"builtin/dflash/{s}/c1" for s in suites}


def test_a_gate_of_many_checks_holds_its_confidence_over_all_of_them(tmp_path):
    """Each noise-aware check takes a 1 - 5%/checks interval (Bonferroni), and says so, so that a rerun passes every
    check of a demo's gate with 95% confidence rather than failing one of fifty now and then."""
    base, rerun = plant(tmp_path / "b"), plant(tmp_path / "r", noise=(0.99, 1.0, 1.01))
    result = gate.gate(rerun, base)
    noisy = [c for c in result.checks if c.metric.noisy]
    assert len(noisy) == 5 and all(c.confidence == pytest.approx(0.99) for c in noisy)
    assert any("each of the 5 noise-aware checks takes a 99% interval" in n for n in result.notes)
    assert family(gate.Bootstrap(), 1).confidence == 0.95
    one, many = gate.Bootstrap(confidence=0.95), gate.Bootstrap(confidence=1 - 0.05 / 50)
    narrow = gate.bootstrap_change([100, 104, 97], [95, 99, 101], one, seed_key="x")
    wide = gate.bootstrap_change([100, 104, 97], [95, 99, 101], many, seed_key="x")
    assert wide[0] < narrow[0] and wide[1] > narrow[1]


def test_a_baseline_carrying_its_runs_noise_passes_a_rerun_and_fails_a_regression(tmp_path):
    runs = [plant(tmp_path / f"r{i}", tput=300.0 * f, repeats=1, noise=(1.0,)) for i, f in enumerate((1.0, 1.1, 0.92))]
    out = tmp_path / "base.json"
    assert gate.main(runs[0], export=True, output=out, noise_from=runs[1:]) == 0
    base = gate.load_baseline(out)
    cell = next(c for c in base.cells if c.mode == "dflash")
    assert cell.noise_runs == 3 and 0.08 < cell.noise["output_throughput"] < 0.1
    rerun = plant(tmp_path / "rerun", tput=300.0 * 0.85, repeats=1, noise=(1.0,))  # within the box's noise
    assert gate.main(rerun, baseline=runs[0]) == 1  # without the noise figure: fails
    assert gate.main(rerun, baseline=out) == 0
    slow = plant(tmp_path / "slow", tput=300.0 * 0.55, repeats=1, noise=(1.0,))
    result = gate.gate(slow, out)
    assert result.exit_code == 1 and "(the baseline's 3 runs)" in checks(result, "output_throughput")[0].note
    assert gate.main(runs[0], export=True, output=out, noise_from=runs[1:2]) == 0  # one other run is a spread too
    assert gate.load_baseline(out).cells[0].noise_runs == 2
    with pytest.raises(UserError, match="with --export-baseline"):
        gate.main(rerun, baseline=out, noise_from=runs[1:])
