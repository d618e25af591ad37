"""GPU telemetry: the no-NVML path (this machine's real NVML fails to start), the energy arithmetic on
hand-made samples with known answers, and on samples recorded on an H100 under a matmul load."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest

from dflash_bench.errors import UserError
from dflash_bench.store.telemetry_csv import read_csv
from dflash_bench.telemetry import (
    Sample,
    TelemetrySampler,
    gpu_inventory,
    probe,
    resolve_gpus,
    summarize,
    throttle_names,
    write_csv,
)

RECORDED = Path(__file__).parent / "data" / "telemetry_h100_load.csv"


def _samples(powers, dt=0.1, gpu=0, energy0_mj=None, instant=True):
    """Samples of one GPU every `dt` s with the given power; the counter (if any) follows the same
    power exactly, trapezoid by trapezoid, in whole mJ."""
    out, e = [], energy0_mj
    for i, p in enumerate(powers):
        if i and e is not None:
            e += round((powers[i - 1] + p) / 2 * dt * 1000)
        out.append(Sample(t_s=i * dt, gpu=gpu, time_unix=1e9 + i * dt, power_w=p,
                          power_instant_w=p if instant else None, energy_mj=e))
    return out


# ------------------------------------------------------------------ without NVML


@pytest.fixture(scope="module")
def no_nvml():
    status = probe()
    if status.enabled:
        pytest.skip("this machine has a working NVML; the no-NVML path cannot be exercised here")
    return status


def test_no_nvml_turns_telemetry_off_with_one_reason(no_nvml, tmp_path):
    assert not no_nvml.enabled and no_nvml.reason
    assert no_nvml.message == f"GPU telemetry off: {no_nvml.reason}"
    assert no_nvml.as_manifest() == f"off: {no_nvml.reason}"

    sampler = TelemetrySampler([0], interval_s=0.1)
    assert not sampler.enabled and sampler.status.reason == no_nvml.reason
    threads = threading.active_count()
    with sampler.window():
        assert threading.active_count() == threads  # no sampling thread
    assert sampler.samples == []
    sampler.write_csv(tmp_path / "telemetry.csv")
    assert read_csv(tmp_path / "telemetry.csv") == []

    assert gpu_inventory() == []
    assert resolve_gpus() == []  # no NVML: no GPUs
    energy = sampler.summarize(1000)
    assert energy.energy_j is None and energy.source == "none" and not energy.valid
    assert no_nvml.reason in energy.reason
    fields = energy.summary_fields()
    assert fields["telemetry"] == no_nvml.as_manifest() and fields["j_per_token"] is None


def test_telemetry_command_says_why_it_is_off(no_nvml):
    from typer.testing import CliRunner

    from dflash_bench.cli import app

    res = CliRunner().invoke(app, ["telemetry", "--seconds", "1"])
    assert res.exit_code == 1
    assert res.output.strip() == f"GPU telemetry off: {no_nvml.reason}"


def test_bad_interval_is_a_user_error():
    with pytest.raises(UserError, match="interval"):
        TelemetrySampler(None, interval_s=0)


@pytest.mark.parametrize("args,message", [
    (["--seconds", "-1"], "--seconds must be 0 or more"),
    (["--seconds", "1", "--interval", "0"], "--interval above 0"),
    (["--out", "samples.csv"], "--out writes samples: give --seconds too"),
])
def test_telemetry_command_checks_its_options_first(args, message):
    """Checked before NVML is asked, so a wrong option is named on a machine without GPUs too."""
    from typer.testing import CliRunner

    from dflash_bench.cli import app

    res = CliRunner().invoke(app, ["telemetry", *args])
    assert res.exit_code != 0 and isinstance(res.exception, UserError) and message in str(res.exception)


# ------------------------------------------------------------------ arithmetic with known answers


def test_constant_power_integrates_to_power_times_time():
    e = summarize(_samples([200.0] * 101), output_tokens=500, interval_s=0.1)  # 10 s at 200 W
    assert e.source == "integrated" and e.valid and e.reason.endswith("has no energy counter")
    assert e.energy_j == pytest.approx(2000.0)
    assert e.avg_power_w == pytest.approx(200.0)
    assert e.j_per_token == pytest.approx(4.0)
    assert e.tokens_per_j == pytest.approx(0.25)


def test_ramp_is_integrated_by_trapezoids():
    ramp = [100.0 * i / 10 for i in range(11)]  # 0 -> 100 W over 1 s: exactly 50 J
    e = summarize(_samples(ramp), output_tokens=0)
    assert e.energy_j == pytest.approx(50.0)
    assert e.j_per_token is None and e.tokens_per_j is None  # no tokens, no per-token energy


def test_counter_delta_wins_when_present():
    ss = _samples([300.0] * 51, energy0_mj=7_000_000)  # 5 s at 300 W
    for s in ss:  # integrated power says 1500 J; make the power readings 10% high to tell them apart
        s.power_instant_w *= 1.1
    e = summarize(ss, output_tokens=3000)
    assert e.source == "counter" and e.valid and e.reason == ""
    assert e.energy_j == pytest.approx(1500.0)
    assert e.energy_counter_j == pytest.approx(1500.0)
    assert e.energy_integrated_j == pytest.approx(1650.0)
    assert e.j_per_token == pytest.approx(0.5)


def test_gap_makes_integrated_energy_invalid_and_says_where():
    ss = [s for s in _samples([250.0] * 101) if not 2.05 < s.t_s < 3.45]  # samples at 2.0 then 3.5
    e = summarize(ss, output_tokens=100, interval_s=0.1)
    assert e.source == "integrated" and not e.valid
    assert "1.50 s" in e.reason and "t=2.00 s" in e.reason
    assert e.energy_j == pytest.approx(2500.0)  # constant power: the trapezoid still bridges it
    assert e.max_gap_s == pytest.approx(1.5)


def test_gap_is_harmless_with_the_counter():
    ss = [s for s in _samples([250.0] * 101, energy0_mj=0) if not 2.05 < s.t_s < 3.45]
    e = summarize(ss, output_tokens=100, interval_s=0.1)
    assert e.source == "counter" and e.valid and e.energy_j == pytest.approx(2500.0)


def test_small_jitter_is_not_a_gap():
    ss = _samples([100.0] * 21)
    ss[5].t_s += 0.08  # one late tick: 0.18 s then 0.02 s
    e = summarize(ss, output_tokens=1, interval_s=0.1)
    assert e.valid and e.max_gap_s == pytest.approx(0.18)


def test_missing_samples_at_the_window_edges_are_gaps():
    ss = _samples([100.0] * 81)  # samples cover 0..8 s of a 10 s window
    assert summarize(ss, 1, window_s=8.0).valid
    e = summarize(ss, 1, window_s=10.0)
    assert not e.valid and "2.00 s at t=8.00 s" in e.reason


def test_counter_going_backwards_falls_back_to_integration():
    ss = _samples([100.0] * 21, energy0_mj=5_000_000)
    ss[10].energy_mj = 10  # driver reloaded mid-window
    e = summarize(ss, output_tokens=10)
    assert e.source == "integrated" and e.valid
    assert "went backwards" in e.reason
    assert e.energy_j == pytest.approx(200.0)


def test_several_gpus_add_up_and_one_missing_counter_means_integration_for_all():
    a = _samples([100.0] * 11, gpu=0, energy0_mj=0)
    b = _samples([300.0] * 11, gpu=1, energy0_mj=0)
    both = summarize(a + b, output_tokens=40)
    assert both.source == "counter" and both.energy_j == pytest.approx(400.0)  # 1 s at 100 W + 300 W
    assert both.avg_power_w == pytest.approx(400.0) and both.j_per_token == pytest.approx(10.0)
    assert [g.gpu for g in both.per_gpu] == [0, 1]
    for s in b:
        s.energy_mj = None
    mixed = summarize(a + b, output_tokens=40)
    assert mixed.source == "integrated" and mixed.energy_j == pytest.approx(400.0)
    assert "GPU 1 has no energy counter" in mixed.reason


def test_averaged_power_is_used_when_instant_power_is_missing():
    ss = _samples([100.0] * 11, instant=False)
    ss[-1].power_instant_w = 999.0  # instant power on only one sample: not usable, fall back
    e = summarize(ss, output_tokens=1)
    assert e.per_gpu[0].power_column == "power_w" and e.energy_j == pytest.approx(100.0)


def test_fewer_than_two_samples_have_no_energy():
    e = summarize(_samples([100.0]), output_tokens=5)
    assert e.energy_j is None and not e.valid and "fewer than 2" in e.reason


def test_throttle_reasons_are_named_and_idle_is_not_throttling():
    assert throttle_names(0x1 | 0x4) == ["gpu_idle", "sw_power_cap"]
    ss = _samples([100.0] * 4)
    for s, mask in zip(ss, [0x1, 0x4, 0x4 | 0x40, 0x0]):
        s.throttle_reasons = mask
    e = summarize(ss, 1)
    assert e.throttle_reasons == ["sw_power_cap", "hw_thermal"]
    assert e.throttled_frac == pytest.approx(0.5)


def test_summary_fields_fit_the_cell_summary():
    from dflash_bench.store import CellSummary

    e = summarize(_samples([100.0] * 11, energy0_mj=0), output_tokens=10)
    fields = e.summary_fields()
    assert set(fields) <= set(CellSummary.model_fields)
    assert set(e.extra_fields()) <= set(CellSummary.model_fields) and not set(fields) & set(e.extra_fields())
    cell = CellSummary(cell_id="x", engine="builtin", mode="ar", suite="gsm8k", concurrency=1, **fields,
                       **e.extra_fields())
    assert cell.telemetry == "on" and cell.energy_source == "counter" and cell.energy_j == pytest.approx(100.0)
    assert cell.energy_integrated_j == pytest.approx(100.0)


# ------------------------------------------------------------------ recorded on an H100


def test_recorded_h100_counter_and_instant_power_agree():
    ss = read_csv(RECORDED)
    assert len(ss) > 150 and {s.gpu for s in ss} == {0}
    e = summarize(ss, output_tokens=10_000, interval_s=0.1)
    assert e.source == "counter" and e.valid
    assert e.energy_integrated_j == pytest.approx(e.energy_counter_j, rel=0.01)
    idle = ss[0].power_instant_w
    assert e.avg_power_w > 3 * idle  # the load shows
    assert "sw_power_cap" in e.throttle_reasons


def test_recorded_h100_without_counter_or_instant_power():
    ss = read_csv(RECORDED)
    counted = summarize(ss, 1).energy_j
    no_counter = [dataclasses.replace(s, energy_mj=None) for s in ss]
    e = summarize(no_counter, 1)
    assert e.source == "integrated" and e.valid and e.energy_j == pytest.approx(counted, rel=0.01)
    # The 1 s averaged power lags the load's start: a little low, but within a few percent.
    averaged = [dataclasses.replace(s, energy_mj=None, power_instant_w=None) for s in ss]
    assert summarize(averaged, 1).energy_j == pytest.approx(counted, rel=0.05)
    gappy = [s for s in no_counter if not 5.0 < s.t_s < 8.0]
    g = summarize(gappy, 1, interval_s=0.1)
    assert not g.valid and "GPU 0" in g.reason


# ------------------------------------------------------------------ the CSV and GPU lists


def test_csv_round_trip_is_atomic_and_keeps_missing_values(tmp_path):
    ss = _samples([123.456789, 50.0, 0.5], energy0_mj=42)
    ss[1].temp_c, ss[1].throttle_reasons, ss[2].power_instant_w = 61, 0x4, None
    path = tmp_path / "cell" / "telemetry.csv"
    write_csv(path, ss)
    back = read_csv(path)
    assert [p.name for p in path.parent.iterdir()] == ["telemetry.csv"]  # no temp file left
    assert back[1].temp_c == 61 and back[1].throttle_reasons == 4 and back[2].power_instant_w is None
    assert back[0].power_w == pytest.approx(123.456789) and back[2].energy_mj == ss[2].energy_mj
    assert back[0].gpu_util_pct is None


def test_damaged_csv_is_a_user_error(tmp_path):
    path = tmp_path / "telemetry.csv"
    path.write_text("t_s,gpu,time_unix,power_w\n0.1,0,1.0,abc\n")
    with pytest.raises(UserError, match="line 2"):
        read_csv(path)
    with pytest.raises(UserError, match="cannot read"):
        read_csv(tmp_path / "missing.csv")


UUIDS = ["GPU-aaaa1111", "GPU-bbbb2222", "GPU-cccc3333", "GPU-dddd4444"]


@pytest.mark.parametrize(
    ("devices", "visible", "expected"),
    [
        (None, None, [0, 1, 2, 3]),
        (None, "2,3", [2, 3]),
        ([1], "2,3", [3]),
        ("0,1", "3,1", [3, 1]),
        (None, "GPU-cccc3333,bbbb", [2, 1]),  # full UUID and prefix without GPU-
        (None, "", []),
        (None, "-1", []),
        (None, "0,-1,1", [0]),  # CUDA stops at -1
        ([0, 1], None, [0, 1]),
    ],
)
def test_resolve_gpus_to_physical_indices(devices, visible, expected):
    assert resolve_gpus(devices, visible, uuids=UUIDS) == expected


@pytest.mark.parametrize(
    ("devices", "visible", "message"),
    [
        ([2], "0,1", "not visible"),
        (None, "7", "has 4"),
        (None, "GPU-", "matches 4 GPUs"),
        (None, "MIG-abc", "MIG"),
        ("x", None, "not a GPU number"),
    ],
)
def test_resolve_gpus_rejects_what_cuda_would_not_see(devices, visible, message):
    with pytest.raises(UserError, match=message):
        resolve_gpus(devices, visible, uuids=UUIDS)
