"""The gate compares like with like and knows the noise of a rerun: a partial cell fails unless gate.toml allows
its share; tau is judged as tau under one width policy, over the acceptance profile across policies, and not at
all (with the sentence why) where it was counted differently; a baseline carrying its run-to-run noise passes a
rerun of the same code and still fails a real regression."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_bench import gate
from dflash_bench.errors import UserError
from dflash_bench.store import CellPlan, CellSummary, Manifest, Stat, SweepDir, cell_id

# a profile of a block of 5 (4 draft positions): per position (verified, accepted)
FULL = [(100, 80), (100, 60), (100, 40), (100, 20)]  # tau at the full block 3.0
AUTO = [(100, 80), (60, 36), (20, 8), (0, 0)]  # the same acceptance per position, fewer steps verified far out


def plant(path: Path, *, tput=300.0, tau=3.0, policy="full", profile=FULL, definition=2, repeats=3, noise=(1.0,) * 3,
          failed_requests=0) -> Path:
    plan, summaries = [], []
    for r in range(repeats):
        for mode in ("ar", "dflash"):
            cid = cell_id("builtin", mode, "gsm8k", 1, r)
            plan.append(CellPlan(cell_id=cid, engine="builtin", mode=mode, suite="gsm8k", concurrency=1, repeat=r))
            t = tput * noise[r] * (1.0 if mode == "dflash" else 0.5)
            s = CellSummary(cell_id=cid, engine="builtin", mode=mode, suite="gsm8k", concurrency=1, repeat=r,
                            output_throughput=t, tpot_ms=Stat(n=10, mean=1000 / t, p50=1000 / t), num_requests=9,
                            num_ok=9 - failed_requests, num_failed=failed_requests)
            if mode == "dflash":
                s.acceptance_length, s.acceptance_definition, s.width_policy = tau, definition, policy
                s.acceptance_profile = profile
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


def test_tau_under_one_policy_is_tau_tight_at_a_fixed_width_and_noise_aware_under_auto(tmp_path):
    base = plant(tmp_path / "base", tau=3.0)
    low = plant(tmp_path / "low", tau=2.9)
    [tight] = checks(gate.gate(low, base))
    assert tight.method == "tight" and tight.verdict == "fail"
    auto_base = plant(tmp_path / "ab", tau=3.0, policy="auto", profile=AUTO)
    auto_low = plant(tmp_path / "al", tau=2.9, policy="auto", profile=AUTO)
    [auto] = checks(gate.gate(auto_low, auto_base))
    assert auto.metric.noisy and auto.method in ("bootstrap", "plain")


def test_tau_across_width_policies_is_judged_over_the_profile_the_two_both_verified(tmp_path):
    full = plant(tmp_path / "full", tau=3.0, policy="full", profile=FULL)
    # auto's realised tau is far lower (fewer positions verified), its acceptance per position the same
    auto = plant(tmp_path / "auto", tau=1.4, policy="auto", profile=AUTO)
    result = gate.gate(auto, full)
    [c] = checks(result)
    assert c.metric.label.endswith("both verified") and c.verdict == "pass" and "3 draft position(s)" in c.note
    assert c.baseline == [c.current[0]] * 3 and abs(c.baseline[0] - (1 + 0.8 + 0.6 + 0.4)) < 1e-9
    assert any("another width policy" in n and "full against auto" in n for n in result.notes)
    worse = plant(tmp_path / "worse", tau=1.4, policy="auto", profile=[(100, 70), (60, 30), (20, 6), (0, 0)])
    assert checks(gate.gate(worse, full))[0].verdict == "fail"


def test_a_baseline_without_a_profile_or_from_an_older_definition_is_not_compared_and_says_why(tmp_path):
    old = plant(tmp_path / "old", policy=None, profile=None)
    auto = plant(tmp_path / "auto", tau=1.4, policy="auto", profile=AUTO)
    result = gate.gate(auto, old)
    [c] = checks(result)
    assert c.verdict == "skipped" and c.method == "not comparable"
    assert "no width policy recorded" in c.note and "the baseline has no acceptance profile" in c.note
    assert any("none recorded against auto" in n for n in result.notes)
    older = plant(tmp_path / "older", definition=1)
    result = gate.gate(plant(tmp_path / "now"), older)
    [c] = checks(result)
    assert c.verdict == "skipped" and "different definitions" in c.note
    assert any("another definition" in n for n in result.notes) and result.exit_code == 0


def test_a_baseline_carrying_its_run_to_run_noise_passes_a_rerun_and_fails_a_regression(tmp_path):
    runs = [plant(tmp_path / f"r{i}", tput=300.0 * f, repeats=1, noise=(1.0,)) for i, f in enumerate((1.0, 1.1, 0.92))]
    out = tmp_path / "base.json"
    assert gate.main(runs[0], export=True, output=out, noise_from=runs[1:]) == 0
    base = gate.load_baseline(out)
    cell = next(c for c in base.cells if c.mode == "dflash")
    assert cell.noise_runs == 3 and 0.08 < cell.noise["output_throughput"] < 0.1
    rerun = plant(tmp_path / "rerun", tput=300.0 * 0.85, repeats=1, noise=(1.0,))  # within the box's noise
    assert gate.main(rerun, baseline=runs[0]) == 1  # without the noise figure: fails
    assert gate.main(rerun, baseline=out) == 0
    slow = plant(tmp_path / "slow", tput=300.0 * 0.6, repeats=1, noise=(1.0,))
    result = gate.gate(slow, out)
    assert result.exit_code == 1 and "run-to-run noise" in checks(result, "output_throughput")[0].note
    with pytest.raises(UserError, match="at least 2 other runs"):
        gate.main(runs[0], export=True, output=out, noise_from=runs[1:2])
    with pytest.raises(UserError, match="with --export-baseline"):
        gate.main(rerun, baseline=out, noise_from=runs[1:])
