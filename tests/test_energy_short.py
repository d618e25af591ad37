"""Energy you can compare: a window too short for its source is invalid with the reason and
shows no J/token; a pair whose cells read different sources shows no ratio; --min-cell-seconds lengthens a
cell until its energy is measurable. The sampler reads a fake NVML whose energy counter, like a real GPU's,
moves only every 100 ms (the thread, the clock and the emulator serving the load are real)."""

from __future__ import annotations

import math
import sys
import time
from types import SimpleNamespace

import pytest

from benchmarks.fixtures.fake_nvml import POWER_W, UPDATE_S, FakeNvml
from dflash_bench.telemetry import Sample, TelemetrySampler, summarize
from dflash_bench.telemetry.energy import MIN_SAMPLES


@pytest.fixture
def fake_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())


def test_a_window_with_too_few_samples_is_invalid_and_has_no_j_per_token(fake_nvml):
    sampler = TelemetrySampler([0], interval_s=0.1)
    assert sampler.enabled
    with sampler.window():
        time.sleep(0.35)  # at most 2 edge samples + 3 ticks: fewer than MIN_SAMPLES, however loaded the machine
    e = sampler.summarize(1000)
    assert e.n_samples < MIN_SAMPLES
    assert not e.valid and "telemetry samples" in e.reason and "--min-cell-seconds" in e.reason
    assert e.j_per_token is None and e.summary_fields()["j_per_token"] is None


def _samples(seconds: float, dt: float) -> list[Sample]:
    """The fake's counter, sampled every dt s (the arithmetic, with no clock)."""
    out = []
    for i in range(round(seconds / dt) + 1):
        t = i * dt
        energy = int(math.floor(t / UPDATE_S + 1e-9) * UPDATE_S * POWER_W * 1000)
        out.append(Sample(t_s=t, gpu=0, time_unix=1e9 + t, power_w=POWER_W, power_instant_w=POWER_W, energy_mj=energy))
    return out


def test_a_counter_that_moved_fewer_times_than_it_updates_in_a_second_is_not_used():
    short = summarize(_samples(0.5, 0.02), output_tokens=100, interval_s=0.02)  # 26 samples, 5 moves, 10/s
    assert short.n_samples >= MIN_SAMPLES
    assert short.source == "integrated" and short.valid  # the power integral has samples enough
    assert "moved 5 times" in short.reason and "10 times a second" in short.reason
    assert short.energy_j == pytest.approx(POWER_W * 0.5)
    long = summarize(_samples(1.5, 0.02), output_tokens=100, interval_s=0.02)  # 15 moves: the counter holds
    assert long.source == "counter" and long.valid and long.energy_j == pytest.approx(POWER_W * 1.5)


def test_a_pair_read_from_different_sources_shows_no_ratio(tmp_path):
    import pandas as pd

    from dflash_bench.report.tables import energy_rows

    done = [dict(engine="builtin", suite="gsm8k", concurrency=c, mode=m, j_per_token=j, avg_power_w=200.0,
                 energy_source=src, energy_valid=ok, energy_note=note)
            for c, m, j, src, ok, note in [(1, "ar", 0.1, "counter", True, None), (1, "dflash", 0.05, "integrated", True, None),
                                           (8, "ar", 0.1, "counter", True, None), (8, "dflash", 0.05, "counter", True, None),
                                           (32, "ar", 0.1, "counter", True, None),
                                           (32, "dflash", 0.05, "integrated", False, "only 3 telemetry samples")]]

    rows = {r["concurrency"]: r for r in energy_rows(SimpleNamespace(done=pd.DataFrame(done)))}
    assert "no ratio" in rows[1]["ratio_note"] and "counter" in rows[1]["ratio_note"]
    assert "ratio_note" not in rows[8] and rows[8]["j_per_token_dflash"] == 0.05
    assert rows[32]["j_per_token_dflash"] is None and "3 telemetry samples" in rows[32]["invalid_dflash"]


def test_min_cell_seconds_lengthens_a_cell_until_its_energy_is_measurable(fake_nvml, tmp_path):
    from dflash_bench.client.cell import measure
    from dflash_bench.client.loadgen import LoadSettings
    from dflash_bench.client.protocol import RequestSettings
    from dflash_bench.client.summary import summarize_cell
    from dflash_bench.emulator import EmulatorProcess

    prompts = [SimpleNamespace(id=f"p{i}", turns=[f"prompt {i}"]) for i in range(4)]
    with EmulatorProcess(mode="ar", ttft_ms=1, itl_ms=1, output_len=8) as em:
        m = measure(em.url, prompts, RequestSettings(max_tokens=8), LoadSettings(concurrency=2, min_seconds=2.0),
                    TelemetrySampler([0], interval_s=0.1))
    s = summarize_cell(m, cell_id="c", engine="emulator", mode="ar", suite="s", concurrency=2)
    measured = [r for r in m.records if not r.warmup]
    assert m.settings.prompt_passes > 1 and len(measured) == 4 * m.settings.prompt_passes
    assert {r.prompt_id for r in measured} >= {"p0", "p0~2"}
    assert s.duration_s >= 2.0
    assert s.energy_valid and s.energy_source == "counter" and s.j_per_token is not None, s.energy_note
