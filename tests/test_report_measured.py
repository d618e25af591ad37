"""The report says what was measured: engine, device, model sizes, max tokens and thinking above the numbers;
a toy target's outputs labelled as such; empty quality cells naming the command that fills them; Pareto
labels that do not overlap; speedups with their spread over repeats."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from benchmarks.fixtures.report_sweeps import make_sweep

from dflash_bench.report import build_report, figures, plotting
from dflash_bench.report.views import load
from dflash_bench.store import SweepDir
from dflash_bench.store.manifest import ServerRecord


def _text(page: Path) -> str:
    html = re.sub(r"<img[^>]*>", "", page.read_text())
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def _toy_model(folder: Path) -> Path:
    """A model folder whose safetensors hold 1000 x 64 + 64 = 64,064 parameters."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    save_file({"embed.weight": np.zeros((1000, 64), np.float32), "norm.weight": np.zeros(64, np.float32)},
              str(folder / "model.safetensors"))
    (folder / "config.json").write_text("{}")
    return folder


def test_a_toy_targets_report_says_what_was_measured_and_labels_its_outputs(tmp_path):
    target = _toy_model(tmp_path / "toy-target")
    path = make_sweep(tmp_path / "cpu", engine="builtin", gpus=None, telemetry=False, concurrency=(1, 4),
                      model=str(target))
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["models"]["drafter"]["parameters"] = 2_500_000  # as the sweep records it (provenance.model_revision)
    manifest["settings"]["thinking"] = False
    (path / "manifest.json").write_text(json.dumps(manifest))
    text = _text(build_report([path]))
    line = re.search(r"Measured: (.*?)\.(?: |$)", text).group(1)
    assert line.split(" · ") == ["engine builtin", "CPU (no GPU recorded)", f"target {tmp_path.name}/toy-target (64.1K parameters)",
                                 "drafter z-lab/Qwen3-8B-DFlash-b16 (2.5M parameters)", "max tokens 512",
                                 "thinking off (asked)"]
    manifest["settings"]["interleave"] = True  # as the demo measures (sweep --paired --interleave)
    (path / "manifest.json").write_text(json.dumps(manifest))
    line = re.search(r"Measured: (.*?)\.(?: |$)", _text(build_report([path]))).group(1)
    assert line.endswith(" · concurrency 1: AR and DFlash requests interleaved one by one")
    assert str(tmp_path) not in line  # a local model by its last two parts, not this machine's path
    assert "A toy target (64.1K parameters)" in text
    assert "Outputs of a toy model (64.1K parameters), not meant to read as sensible text" in text


def test_a_real_models_report_gives_its_gpu_and_no_toy_label(tmp_path):
    path = make_sweep(tmp_path / "h100", gpus=2, model="Qwen/Qwen3-8B")  # not on this machine: size unknown
    text = _text(build_report([path]))
    line = re.search(r"Measured: (.*?)\.(?: |$)", text).group(1)
    assert line.startswith("engine vllm · 2× NVIDIA H100 80GB HBM3 · target Qwen/Qwen3-8B (size not recorded)")
    assert "toy" not in text.lower()


def test_the_report_says_how_long_each_server_took_to_start(tmp_path):
    """A launched server's time to ready (loading, compiling, capturing graphs) is part of what DFlash costs: the
    measured line gives each server's, in the manifest's order; a URL server (not started here) has none."""
    path = make_sweep(tmp_path / "h100", gpus=1)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["servers"] = {"vllm-ar": {"runner": "process", "url": "http://127.0.0.1:1", "ready_s": 118.4},
                           "vllm-dflash": {"runner": "process", "url": "http://127.0.0.1:2", "ready_s": 201.6},
                           "vllm-ar #2": {"runner": "external", "url": "http://127.0.0.1:3"}}
    (path / "manifest.json").write_text(json.dumps(manifest))
    line = re.search(r"Measured: (.*?)\.(?: |$)", _text(build_report([path]))).group(1)
    assert line.split(" · ")[-1] == "servers ready after vllm-ar 118 s, vllm-dflash 202 s"


def test_empty_quality_cells_name_the_command_that_fills_them(tmp_path, monkeypatch):
    path = make_sweep(tmp_path / "q", lossless=True)
    sweep = SweepDir.open(path)
    for s in sweep.summaries():  # the lossless check ran (the sweep saved token ids); accuracy was never scored
        s.accuracy = None
        sweep.write_summary(s)
    monkeypatch.chdir(tmp_path)
    text = _text(build_report([path]))
    # what is still to run is said once above the table, with the folder as seen from where the report was built
    assert text.count("Accuracy not scored yet") == 1 and "Accuracy not scored yet (gsm8k): dflash-bench quality q ." in text
    assert "No reference answers to score (mt-bench)" in text and "not scored: run" not in text
    row = re.search(r"vllm dflash gsm8k 1 1 (.*?) vllm", text).group(1)
    assert row.endswith("– – –"), row


def test_speedups_with_repeats_show_their_spread(tmp_path):
    path = make_sweep(tmp_path / "rep", repeats=3, suites=("gsm8k",), concurrency=(1,))
    sweep = SweepDir.open(path)
    for s in sweep.summaries():  # DFlash repeats 2.0x, 3.0x and 2.5x the AR cells' 100 tok/s
        s.output_throughput = 100.0 if s.mode == "ar" else 100.0 * (2.0, 3.0, 2.5)[s.repeat]
        sweep.write_summary(s)
    text = _text(build_report([path]))
    assert "2.50× 2.00–3.00× over 3 repeats" in text


def test_pareto_labels_do_not_overlap_where_points_coincide(tmp_path):
    path = make_sweep(tmp_path / "p", suites=("gsm8k",), concurrency=(1, 8, 32))
    (view,) = load([path])
    ar = view.done[view.done["mode"] == "ar"]
    for col in ("output_throughput", "tok_s_user_p50"):  # every DFlash point on top of its AR point
        view.done.loc[view.done["mode"] == "dflash", col] = ar.set_index("concurrency").loc[
            view.done.loc[view.done["mode"] == "dflash", "concurrency"], col].to_numpy()
    fig = figures.pareto(view)
    renderer = fig.canvas.get_renderer()
    (ax,) = [a for a in fig.axes if a.get_visible()]
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert sorted(t.get_text() for t in ax.texts) == sorted(["c1", "c8", "c32"] * 2)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)
    frame = ax.get_window_extent(renderer)  # none runs off the plot (the right-most point's label goes left)
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in boxes)


@pytest.mark.parametrize("offsets", [[(4, 4, "left")] * 10])
def test_the_overlap_check_can_fail(tmp_path, offsets, monkeypatch):
    """With one place for every label, coinciding points' labels do overlap: the check above can see it."""
    monkeypatch.setattr(plotting, "_OFFSETS", offsets)
    path = make_sweep(tmp_path / "p", suites=("gsm8k",), concurrency=(8,))
    (view,) = load([path])
    for col in ("output_throughput", "tok_s_user_p50"):
        view.done[col] = float(view.done[col].iloc[0])
    fig = figures.pareto(view)
    (ax,) = [a for a in fig.axes if a.get_visible()]
    a, b = (t.get_window_extent(fig.canvas.get_renderer()) for t in ax.texts)
    assert a.overlaps(b)


def test_the_per_position_figure_draws_only_positions_that_were_verified(tmp_path):
    """An adaptive verify width checks fewer positions under load: past them nothing was verified, so nothing is
    drawn (not an acceptance rate of 0)."""
    path = make_sweep(tmp_path / "pos", suites=("gsm8k",), concurrency=(1, 8))
    sweep = SweepDir.open(path)
    for s in sweep.summaries():
        if s.mode == "dflash":  # c1 verified all 15 draft positions, c8 only the first 4
            reach = 15 if s.concurrency == 1 else 4
            s.acceptance_profile = [(100 if i < reach else 0, 60 - 3 * i if i < reach else 0) for i in range(15)]
            s.acceptance_per_position = [round((60 - 3 * i) / 100, 4) if i < reach else 0.0 for i in range(15)]
            sweep.write_summary(s)
    sweep.write_results_csv()
    (view,) = load([path])
    fig = figures.positions(view)
    lines = {line.get_label(): list(line.get_xdata()) for ax in fig.axes for line in ax.get_lines()}
    assert lines == {"c1": list(range(1, 16)), "c8": [1, 2, 3, 4]}


def test_a_cpu_run_says_per_server_not_per_gpu(tmp_path):
    """A run whose host listed no GPU (the demo on a CPU) gives throughput per server, whatever its servers say."""
    path = make_sweep(tmp_path / "cpu", suites=("gsm8k",), concurrency=(1,))
    sweep = SweepDir.open(path)
    manifest = sweep.read_manifest()
    manifest.hardware = {"host": {"hostname": "box", "cpu": "AMD EPYC", "cpus": 2}, "gpus": []}
    for name in ("vllm-ar", "vllm-dflash"):
        manifest.servers[name] = ServerRecord(runner="process", url="http://127.0.0.1:8000", gpus=1,
                                              command=["dflash-bench", "serve", "--device", "cpu"])
    sweep.write_manifest(manifest)
    text = _text(build_report([path]))
    assert "per GPU" not in text and "GPU(s) per server" not in text
    assert "tok/s per server" in text and "per server (" in text
    (view,) = load([path])  # the Pareto figure's axis too
    assert [ax.get_ylabel() for ax in figures.pareto(view).axes if ax.get_visible()] == ["output throughput, tok/s per server"]
