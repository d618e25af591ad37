"""The absolute metrics between runs of different machine speeds: where the two runs' speed probes differ beyond
their band, output throughput and TPOT are reported as not comparable (skipped, the sentence says how much slower),
while the speedup measured inside each run still fails a slower DFlash server; probes within the band, or a
baseline without any, gate them as measured."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dflash_bench import gate
from dflash_bench.cli import app
from dflash_bench.gate.config import GateConfig
from dflash_bench.gate.machine import machine_speeds
from dflash_bench.store import CellPlan, CellSummary, MachineSpeed, Manifest, SpeedProbe, Stat, SweepDir, cell_id
from dflash_bench.telemetry import speed_probe

NOISE = (1.0, 1.01, 0.99)
PROBE = (0.040, 0.041, 0.039, 0.040, 0.042)  # one run's probe trials, seconds


def plant(path: Path, *, machine: float | None = 1.0, dflash: float = 1.0, slower_probe: float | None = None) -> Path:
    """A demo-like sweep folder: AR and DFlash at c1 and c8, 3 repeats. `machine`: every server's tok/s scaled
    (a slower machine slows both alike); `dflash`: DFlash's alone; `slower_probe`: the speed probe's trials that many
    times longer than PROBE (None: no probe recorded, a folder from before runs were probed)."""
    plan, summaries = [], []
    for r in range(3):
        for c in (1, 8):
            for mode in ("ar", "dflash"):
                cid = cell_id("builtin", mode, "gsm8k", c, r)
                plan.append(CellPlan(cell_id=cid, engine="builtin", mode=mode, suite="gsm8k", concurrency=c, repeat=r))
                tput = 50.0 * c * NOISE[r] * (machine or 1.0) * ((2.5 * dflash) if mode == "dflash" else 1.0)
                tpot = 1000.0 * c / tput
                summaries.append(CellSummary(
                    cell_id=cid, engine="builtin", mode=mode, suite="gsm8k", concurrency=c, repeat=r,
                    output_throughput=tput, tpot_ms=Stat(n=10, mean=tpot, p50=tpot),
                    acceptance_length=4.0 if mode == "dflash" else None))
    speed = None if slower_probe is None else MachineSpeed(workload=speed_probe.WORKLOAD, probes=[
        SpeedProbe(at=at, seconds=[s * slower_probe for s in PROBE]) for at in ("start", "after group 1 of 1")])
    sweep = SweepDir.create(path, Manifest(sweep_id=path.name, plan=plan, machine_speed=speed))
    for s in summaries:
        sweep.write_summary(s)
    sweep.write_results_csv()
    return path


def verdicts(result: gate.GateResult, metric: str) -> set[str]:
    return {c.verdict for c in result.checks if c.metric.name == metric}


def test_a_machine_four_times_slower_sets_the_absolute_checks_aside_and_still_gates_the_speedup(tmp_path):
    base = gate.collect(plant(tmp_path / "base", slower_probe=1.0))
    same_code = gate.compare(gate.collect(plant(tmp_path / "slow", machine=0.25, slower_probe=4.0)), base)
    assert same_code.passed, [c.note for c in same_code.failures]
    assert same_code.machine is not None and not same_code.machine.comparable
    for metric in ("output_throughput", "tpot_ms_p50"):
        checks = [c for c in same_code.checks if c.metric.name == metric]
        assert {(c.method, c.verdict) for c in checks} == {("not comparable", "skipped")}
        assert all("not gated: this machine ran 4.00 times slower than the baseline's" in c.note for c in checks)
    assert verdicts(same_code, "speedup") == {"pass"} and verdicts(same_code, "acceptance_length") == {"pass"}
    assert any(n.startswith("not comparable: this machine ran 4.00 times slower") for n in same_code.notes)
    # a DFlash server 30% slower on that slow machine: the speedup, measured inside the run, fails it
    broken = gate.compare(gate.collect(plant(tmp_path / "broken", machine=0.25, dflash=0.7, slower_probe=4.0)), base)
    assert verdicts(broken, "speedup") == {"fail"} and not broken.passed
    assert verdicts(broken, "output_throughput") == {"skipped"}
    # and a faster machine says so the other way
    fast = gate.compare(gate.collect(plant(tmp_path / "fast", machine=3.0, slower_probe=1 / 3)), base)
    assert fast.passed and "ran 3.00 times faster" in fast.checks[0].note + " ".join(fast.notes)


def test_probes_within_their_band_gate_the_absolute_metrics_as_measured(tmp_path):
    base = gate.collect(plant(tmp_path / "base", slower_probe=1.0))
    sweep = gate.collect(plant(tmp_path / "slow", machine=0.25, slower_probe=1.05))
    speeds = machine_speeds(sweep, base, GateConfig())
    assert speeds.comparable and speeds.slower is not None and 1.04 < speeds.slower < 1.06
    result = gate.compare(sweep, base)
    assert verdicts(result, "output_throughput") == {"fail"} and verdicts(result, "tpot_ms_p50") == {"fail"}
    assert verdicts(result, "speedup") == {"pass"}
    assert any(n.startswith("machine speed: the sweep's probe took 1.05 times the baseline's") for n in result.notes)
    # the band is the tolerance plus the probes' own spread: a looser tolerance takes in a 1.4x slower probe
    loose = GateConfig.model_validate({"machine": {"speed_tolerance": 0.5}})
    slower = gate.collect(plant(tmp_path / "slower", machine=0.25, slower_probe=1.4))
    assert not machine_speeds(slower, base, GateConfig()).comparable
    assert machine_speeds(slower, base, loose).comparable


def test_spread_probes_widen_the_band(tmp_path):
    """Probes whose own trials swing (a run on a machine whose load moved) do not tell one speed from another as
    finely: the same 1.4x ratio is inside their band."""
    base, sweep = gate.collect(plant(tmp_path / "base", slower_probe=1.0)), gate.collect(plant(tmp_path / "s"))
    swinging = [0.02, 0.06, 0.03, 0.05, 0.04]
    base.provenance.machine_speed = MachineSpeed(workload=speed_probe.WORKLOAD, probes=[SpeedProbe(at="start", seconds=swinging)])
    sweep.provenance.machine_speed = MachineSpeed(workload=speed_probe.WORKLOAD, probes=[
        SpeedProbe(at="start", seconds=[1.4 * s for s in swinging])])
    speeds = machine_speeds(sweep, base, GateConfig())
    assert speeds.slower is not None and abs(speeds.slower - 1.4) < 1e-9 and speeds.comparable and speeds.band > 1.5


def test_a_baseline_without_a_probe_is_gated_as_before_and_says_so(tmp_path):
    base = gate.collect(plant(tmp_path / "base", slower_probe=None))
    result = gate.compare(gate.collect(plant(tmp_path / "slow", machine=0.25, slower_probe=4.0)), base)
    assert verdicts(result, "output_throughput") == {"fail"} and not result.passed
    assert result.notes[0] == ("the baseline recorded no machine-speed probe (written before runs were probed): "
                               "throughput and TPOT are compared as measured, whatever the machine's speed")
    other = gate.collect(plant(tmp_path / "other", slower_probe=1.0))
    assert other.provenance.machine_speed is not None
    other.provenance.machine_speed.workload = "cpu-v0"
    result = gate.compare(gate.collect(plant(tmp_path / "slow2", machine=0.25, slower_probe=4.0)), other)
    assert verdicts(result, "output_throughput") == {"fail"} and "another workload" in result.notes[0]


def test_the_gate_command_says_how_much_slower_the_machine_ran(tmp_path):
    exported = tmp_path / "baseline.json"
    runner = CliRunner()
    res = runner.invoke(app, ["gate", "--export-baseline", str(plant(tmp_path / "base", slower_probe=1.0)),
                              "-o", str(exported)])
    assert res.exit_code == 0, res.output
    assert json.loads(exported.read_text())["provenance"]["machine_speed"]["workload"] == speed_probe.WORKLOAD
    slow = plant(tmp_path / "slow", machine=0.25, slower_probe=4.0)
    res = runner.invoke(app, ["gate", str(slow), "--baseline", str(exported)], env={"COLUMNS": "100"})
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "not comparable: this machine ran 4.00 times slower than the baseline's" in text
    assert "the speedup (DFlash/AR, measured together in each run) and τ are gated" in text
    # the same baseline exported before runs were probed: gated as measured, one line says why
    old = json.loads(exported.read_text())
    del old["provenance"]["machine_speed"]
    exported.write_text(json.dumps(old))
    res = runner.invoke(app, ["gate", str(slow), "--baseline", str(exported)], env={"COLUMNS": "100"})
    assert res.exit_code == 1, res.output
    assert "the baseline recorded no machine-speed probe" in " ".join(res.output.split())


def test_the_probe_is_recorded_into_the_manifest_and_never_mixes_workloads():
    manifest = Manifest(sweep_id="s")
    first = speed_probe.record(manifest, "start")
    assert first is not None and len(first.seconds) == speed_probe.TRIALS and min(first.seconds) > 0
    speed_probe.record(manifest, "end")
    assert manifest.machine_speed is not None and [p.at for p in manifest.machine_speed.probes] == ["start", "end"]
    older = Manifest(sweep_id="o", machine_speed=MachineSpeed(workload="cpu-v0", probes=[SpeedProbe(at="start", seconds=[1.0])]))
    assert speed_probe.record(older, "after group 1 of 1") is None
    assert older.machine_speed is not None and older.machine_speed.seconds() == [1.0]
