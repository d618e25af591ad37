"""The HTML report from planted sweep folders: figures, numbers, escaping, failed cells, several sweeps, CLI."""

from __future__ import annotations

import base64
import subprocess
import sys
from html.parser import HTMLParser

import pytest
from benchmarks.fixtures.report_sweeps import XSS, make_sweep
from sweep_helpers import only_sweep, results, sweep_argv

from dflash_bench import analysis
from dflash_bench.errors import UserError
from dflash_bench.report import build_report
from dflash_bench.report.figures import frontier
from dflash_bench.report.views import gpu_count, redact
from dflash_bench.store import (
    CellPlan, CellSettings, CellSummary, Manifest, SteadyPlan, StoreError, SweepDir, atomic_write_text,
)

ALL_FIGURES = {"pareto", "pareto_p90", "acceptance", "acceptance_positions", "verify_width", "latency", "energy",
               "power"}
PNG = b"\x89PNG\r\n\x1a\n"


class Page(HTMLParser):
    """Tags, attributes and visible text of a page, plus the text of elements by class."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.html = html
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self._stack: list[str] = []
        self.by_class: dict[str, list[str]] = {}
        self._open: list[tuple[str, list[str]]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        self.tags.append((tag, a))
        if tag not in ("img", "br", "meta", "input"):
            self._open.append((tag, a.get("class", "").split()))

    def handle_endtag(self, tag):
        while self._open:
            t, _ = self._open.pop()
            if t == tag:
                break

    def handle_data(self, data):
        self.text.append(data)
        for _, classes in self._open:
            for c in classes:
                self.by_class.setdefault(c, []).append(data)

    def all_text(self) -> str:
        return "".join(self.text)

    def imgs(self) -> list[dict[str, str]]:
        return [a for t, a in self.tags if t == "img"]


def _figures_in(page: Page) -> dict[str, bytes]:
    out = {}
    for img in page.imgs():
        assert img["src"].startswith("data:image/png;base64,"), img["src"][:40]
        out[img["data-figure"]] = base64.b64decode(img["src"].split(",", 1)[1])
    return out


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """A complete sweep with telemetry, lossless data, repeats, one failed cell, and hostile text everywhere."""
    path = make_sweep(tmp_path_factory.mktemp("r") / "h100", sweep_id=f"h100 {XSS}", repeats=2, gpus=2, lossless=True,
                      output_text=f"model says {XSS}", model=f"Qwen/Qwen3-8B{XSS}",
                      failed={"vllm-dflash-mt-bench-c32": f"server died: {XSS}", "vllm-dflash-mt-bench-c32-r1": "OOM"})
    page = build_report([path])
    return path, page, Page(page.read_text())


def test_page_is_self_contained_with_every_figure(full):
    path, page, parsed = full
    assert page == path / "report.html"
    figs = _figures_in(parsed)
    assert set(figs) == ALL_FIGURES
    for name, data in figs.items():
        assert data.startswith(PNG)
        assert (path / "figures" / f"{name}.png").read_bytes() == data  # the file beside the page is the same figure
    for tag, attrs in parsed.tags:
        assert tag not in ("script", "iframe", "object", "embed", "link"), tag
        for key in ("src", "href"):
            assert not attrs.get(key, "").startswith(("http:", "https:", "//")), attrs


def test_hostile_text_shows_as_text(full):
    _, page, parsed = full
    # No element came out of the planted strings: the only images are the figures, there is no script.
    assert [t for t, _ in parsed.tags if t == "script"] == []
    assert all(img["src"].startswith("data:image/png") for img in parsed.imgs())
    assert not any("onerror" in attrs for _, attrs in parsed.tags)
    text = parsed.all_text()
    assert f"model says {XSS}" in text  # sample output
    assert f"server died: {XSS}" in text  # failure reason
    assert f"h100 {XSS}" in text  # sweep id
    assert "Qwen/Qwen3-8B<script>document.title='pwned'</script>" in text  # manifest (JSON-quoted after that)
    assert text.count(XSS) >= 5
    assert "<script>" not in page.read_text()


def test_headline_numbers_and_callouts(full):
    _, _, parsed = full
    # Planted: AR tok/s = 70 c^0.8; DFlash = AR x max(0.8, 3.6 - 0.06 c). Best is c=1, worst c=32 (gsm8k; mt-bench c32 failed).
    best, worst = " ".join(parsed.by_class["good"]), " ".join(parsed.by_class["bad"])
    assert "c1" in best and f"{3.6 - 0.06:.2f}×" in best
    assert "gsm8k c32" in worst and f"{3.6 - 0.06 * 32:.2f}×" in worst
    speedups = [s.strip() for s in parsed.by_class["sp"]]
    assert f"{3.6 - 0.06 * 8:.2f}×" in speedups
    details = " ".join(parsed.by_class["det"])
    assert f"{70 * 8 ** 0.8:,.0f}" in details  # AR tok/s at c8 per server
    assert "no pair" in parsed.all_text()  # mt-bench c32 has no DFlash partner


def test_acceptance_matrix(full):
    _, _, parsed = full
    # Planted: tau = 6.5 - 0.02 c (mt-bench one less), request-weighted tau - 0.2, token-weighted tau + 0.1.
    tau = 6.5 - 0.02 * 8
    assert f"{tau:.2f}" in parsed.by_class["tau"]
    assert f"req {tau - 0.2:.2f} · tok {tau + 0.1:.2f}" in [t.strip() for t in parsed.by_class["det"]]
    assert f"{tau - 1:.2f}" in parsed.by_class["tau"]  # mt-bench


def test_quality_table_one_row_per_pair(full):
    _, _, parsed = full
    text = parsed.all_text()
    assert "Quality: lossless check and accuracy" in text
    # one row per DFlash cell of the plan, its 2 repeats folded: the counts pooled, the Wilson interval of the pool
    from dflash_bench.quality.intervals import wilson

    assert f"{62 / 64:.1%} of 64" in text and "near_tie 2" in text
    for correct in (56, 54):  # AR 28 of 32 and DFlash 27 of 32 in each repeat
        lo, hi = wilson(correct, 64)
        assert f"{correct / 64:.1%} [{lo:.1%}, {hi:.1%}] n=64" in text
    assert f"{1 / 32:+.1%} in each of 2 repeats" in text
    # 2 suites x 3 concurrencies, less mt-bench c32 (its repeats failed)
    assert text.count(f"{62 / 64:.1%} of 64") == 5 and f"{31 / 32:.1%} of 32" not in text


def test_throughput_is_per_gpu_when_the_manifest_lists_gpus(full):
    _, _, parsed = full
    text = parsed.all_text()
    assert "tok/s per GPU" in text and "2 GPU(s) per server" in text
    assert f"{70 * 32 ** 0.8 / 2:,.1f}" in text  # AR c32 throughput in the Pareto numbers, divided by 2 GPUs
    # tail interactivity = 1000 / TPOT p90; planted TPOT = 1000 c / throughput, p90 = 1.3 x p50
    assert f"{70 * 8 ** 0.8 / (8 * 1.3):,.1f}" in text


def test_gpu_count_prefers_the_tensor_parallel_size():
    eight = {"gpus": [{"name": "H100"}] * 8}
    assert gpu_count(eight) == 8
    assert gpu_count(eight, {"engine_args": ["--tensor-parallel-size", "2"]}) == 2
    assert gpu_count(eight, {"engine_args": ["--max-model-len=8192", "--tp-size=4"]}) == 4
    assert gpu_count({}, {"engine_args": []}) is None
    # Servers the sweep launched on an 8-GPU host: one GPU each unless their command shards the model.
    launched = {"vllm-ar": {"command": ["vllm", "serve", "Qwen/Qwen3-8B", "--port", "8000"]}}
    assert gpu_count(eight, {"engine_args": []}, launched) == 1
    launched["vllm-dflash"] = {"command": ["vllm", "serve", "Qwen/Qwen3.5-122B-A10B", "--tensor-parallel-size", "4"]}
    assert gpu_count(eight, {"engine_args": []}, launched) == 4  # the card's TP flag, not an engine arg


def test_energy_table(full):
    _, _, parsed = full
    # Planted: power = 350 + 8c (+40 for DFlash), J/token = power / throughput.
    ar_tput = 70 * 8 ** 0.8
    df_tput = ar_tput * (3.6 - 0.06 * 8)
    ar_j, df_j = (350 + 64) / ar_tput, (390 + 64) / df_tput
    text = parsed.all_text()
    assert f"{ar_j:,.3f}" in text and f"{df_j:,.3f}" in text and f"{df_j / ar_j:.2f}×" in text


def test_failed_cells_and_no_telemetry_still_render(tmp_path):
    path = make_sweep(tmp_path / "cpu", telemetry=False, gpus=None, failed={
        "vllm-ar-gsm8k-c8": "client: connection refused", "vllm-dflash-gsm8k-c8": "server exited with code 137"})
    sweep = SweepDir.open(path)  # a killed sweep: one more cell planned, never run
    manifest = sweep.read_manifest()
    manifest.plan.append(CellPlan(cell_id="vllm-ar-gsm8k-c64", engine="vllm", mode="ar", suite="gsm8k", concurrency=64))
    sweep.write_manifest(manifest)
    parsed = Page(build_report([path]).read_text())
    assert set(_figures_in(parsed)) == ALL_FIGURES - {"energy", "power"}
    text = parsed.all_text()
    assert "No energy measured: GPU telemetry off: NVML found no GPU" in text
    assert "No GPU power timeline" in text
    assert "tok/s per server" in text
    reasons = parsed.by_class["reason"]
    assert "client: connection refused" in reasons and "server exited with code 137" in reasons
    assert not (path / "figures" / "power.png").exists()
    (path / "figures" / "power.png").write_bytes(PNG)  # left by an earlier report, before telemetry was lost
    keep = path / "figures" / "notes.txt"
    keep.write_text("mine")
    build_report([path])
    assert not (path / "figures" / "power.png").exists() and keep.read_text() == "mine"
    assert "13 planned (10 complete, 2 failed, 1 pending), 12 with a summary" in text
    assert "vllm-ar-gsm8k-c64" in "".join(parsed.by_class["fail"])  # unfinished cells are listed too


def test_sparse_summaries_render(tmp_path):
    """Summaries with little more than throughput and tau (an engine without per-request timings)."""
    plan, rows = [], [("ar", 1, 100.0, None), ("dflash", 1, 300.0, 4.0), ("ar", 4, 300.0, None), ("dflash", 4, 600.0, 3.5)]
    for mode, c, *_ in rows:
        plan.append(CellPlan(cell_id=f"x-{mode}-gsm8k-c{c}", engine="x", mode=mode, suite="gsm8k", concurrency=c))
    sweep = SweepDir.create(tmp_path / "sparse", Manifest(sweep_id="sparse", plan=plan))
    for (mode, c, tput, tau), cell in zip(rows, plan):
        sweep.write_summary(CellSummary(cell_id=cell.cell_id, engine="x", mode=mode, suite="gsm8k", concurrency=c,
                                        output_throughput=tput, acceptance_length=tau))
    parsed = Page(build_report([tmp_path / "sparse"]).read_text())
    assert set(_figures_in(parsed)) == {"acceptance"}
    assert "3.00×" in parsed.by_class["sp"] and "2.00×" in parsed.by_class["sp"]
    assert "No complete cell with throughput and TPOT." in parsed.all_text()


def test_dflash_cells_that_did_not_speculate_are_called_out_at_the_top(tmp_path):
    plan = [CellPlan(cell_id=f"x-{m}-gsm8k-c1", engine="x", mode=m, suite="gsm8k", concurrency=1) for m in ("ar", "dflash")]
    sweep = SweepDir.create(tmp_path / "fallback", Manifest(sweep_id="fallback", plan=plan))
    warning = f"no acceptance source: /metrics answered HTTP 404 {XSS}"
    for cell, tput in zip(plan, (100.0, 98.0)):
        sweep.write_summary(CellSummary(cell_id=cell.cell_id, engine="x", mode=cell.mode, suite="gsm8k", concurrency=1,
                                        output_throughput=tput, dflash_warning=warning if cell.mode == "dflash" else None))
    page = build_report([tmp_path / "fallback"])
    parsed = Page(page.read_text())
    called = "".join(parsed.by_class["call"])
    assert "A speculative server (DFlash, EAGLE-3) did not speculate in 1 cell(s)" in called and f"x-dflash-gsm8k-c1: {warning}" in called
    assert "<script>" not in page.read_text()
    quiet = make_sweep(tmp_path / "fine", suites=("gsm8k",), concurrency=(1,))
    assert "did not speculate" not in Page(build_report([quiet]).read_text()).all_text()


def test_cells_whose_prompts_the_server_had_cached_are_called_out(tmp_path):
    """A cell at 1% or more of its prompt tokens from the server's prefix cache is named with its share, and with
    what the sweep did to the cache before it where the cell says; one under that, or whose server does not say,
    is not."""
    emptied = "emptied (POST /reset_prefix_cache)"
    shares = {1: (0.0, "usage", emptied), 4: (0.243, "vllm-metrics", None), 8: (0.004, "usage", None),
              16: (None, None, None), 32: (0.5, "usage", emptied)}
    plan = [CellPlan(cell_id=f"vllm-ar-mt-bench-c{c}", engine="vllm", mode="ar", suite="mt-bench", concurrency=c)
            for c in shares]
    sweep = SweepDir.create(tmp_path / "cached", Manifest(sweep_id="cached", plan=plan))
    for cell in plan:
        rate, source, reset = shares[cell.concurrency]
        sweep.write_summary(CellSummary(cell_id=cell.cell_id, engine="vllm", mode="ar", suite="mt-bench",
                                        concurrency=cell.concurrency, output_throughput=100.0,
                                        prefix_cache_hit_rate=rate, prefix_cache_source=source,
                                        prefix_cache_reset=reset))
    called = "".join(Page(build_report([tmp_path / "cached"]).read_text()).by_class["call"])
    assert "prefix cache in 2 cell(s)" in called
    assert "vllm-ar-mt-bench-c4: 24.3% of its prompt tokens (vllm-metrics)" in called
    assert f"vllm-ar-mt-bench-c32: 50.0% of its prompt tokens (usage; before the cell: {emptied})" in called
    assert "c1:" not in called and "c8:" not in called and "c16:" not in called


def test_cells_measured_as_a_steady_stream_are_marked_with_their_window(tmp_path):
    """A steady-stream cell's numbers are its window's: the page says so above the headline and marks its matrix
    cell with the window; a closed-batch cell beside it is not marked."""
    plan = [CellPlan(cell_id=f"vllm-{m}-gsm8k-c{c}", engine="vllm", mode=m, suite="gsm8k", concurrency=c)
            for m in ("ar", "dflash") for c in (1, 4)]
    sweep = SweepDir.create(tmp_path / "steady", Manifest(sweep_id="steady", plan=plan))
    for cell in plan:
        settings = CellSettings(steady=SteadyPlan(ramp=4, requests=16) if cell.concurrency == 4 else None)
        sweep.write_summary(CellSummary(cell_id=cell.cell_id, engine="vllm", mode=cell.mode, suite="gsm8k",
                                        concurrency=cell.concurrency, settings=settings, acceptance_length=3.0,
                                        output_throughput=100.0 if cell.mode == "ar" else 180.0))
    parsed = Page(build_report([tmp_path / "steady"]).read_text())
    called = "".join(parsed.by_class["call"])
    label = "steady stream: a window of 16 completions after a ramp-up of 4"
    assert "Steady stream in 2 cell(s)" in called
    assert f"vllm-ar-gsm8k-c4, vllm-dflash-gsm8k-c4: {label}" in called  # one window: one line for both cells
    assert "c1" not in called.split("Steady stream")[1].split("best:")[0]
    assert sum(label in t for t in parsed.by_class["steady"]) == 2  # the cells' line above, their matrix cell
    assert parsed.by_class["det"].count(label) == 1  # the c4 column of the headline matrix, the c1 one unmarked
    closed = make_sweep(tmp_path / "closed", suites=("gsm8k",), concurrency=(1,))
    assert "steady" not in Page(build_report([closed]).read_text()).by_class


def test_sweep_with_nothing_complete_renders(tmp_path):
    ids = [f"vllm-{m}-gsm8k-c1" for m in ("ar", "dflash")]
    path = make_sweep(tmp_path / "dead", suites=("gsm8k",), concurrency=(1,), failed={i: "image pull failed" for i in ids})
    parsed = Page(build_report([path]).read_text())
    assert parsed.imgs() == []
    assert "No complete AR/DFlash pair in this sweep (2 cell(s) failed" in parsed.all_text()


def test_several_sweeps_side_by_side(tmp_path):
    a = make_sweep(tmp_path / "h100", suites=("gsm8k",), concurrency=(1, 8))
    b = make_sweep(tmp_path / "b300", engine="sglang", suites=("gsm8k",), concurrency=(1, 8), boost=4.5, telemetry=False)
    out = tmp_path / "out" / "compare.html"
    assert build_report([a, b], out) == out
    parsed = Page(out.read_text())
    figs = sorted(p.name for p in (out.parent / "figures").glob("*.png"))
    assert "h100-pareto.png" in figs and "b300-pareto.png" in figs and "b300-power.png" not in figs
    assert len(parsed.imgs()) == len(figs)
    text = parsed.all_text()
    assert "Sweeps side by side" in text
    assert f"{4.5 - 0.06:.2f}×" in text and f"{3.6 - 0.06:.2f}×" in text


def test_suites_keep_the_plan_order(tmp_path):
    path = make_sweep(tmp_path / "s", suites=("mt-bench", "gsm8k"), concurrency=(1,), telemetry=False)
    parsed = Page(build_report([path]).read_text())
    hl = "".join(parsed.by_class["hl"])
    assert hl.index("mt-bench") < hl.index("gsm8k")
    summaries = "".join(parsed.by_class["sample-head"])
    assert summaries.index("mt-bench") < summaries.index("gsm8k")


def test_redact_hides_secrets_not_token_counts():
    shown = redact({"max_tokens": 512, "hf_token": "hf_abcdefghijklmnopqrstuvwxyz", "env": {"HF_TOKEN": "x", "API_KEY": "y"},
                    "command": ["--hf-token-file", "f", "hf_abcdefghijklmnopqrstuvwxyz0123"]})
    assert shown == {"max_tokens": 512, "hf_token": "***", "env": {"HF_TOKEN": "***", "API_KEY": "***"},
                     "command": ["--hf-token-file", "f", "hf_***"]}


def test_frontier_drops_dominated_points():
    pts = [(1.0, 5.0), (2.0, 4.0), (1.5, 3.0), (3.0, 1.0), (0.5, 4.5)]
    assert frontier(pts) == [(1.0, 5.0), (2.0, 4.0), (3.0, 1.0)]


def test_power_timeline_sums_gpus_and_names_a_damaged_file(tmp_path):
    path = make_sweep(tmp_path / "s", suites=("gsm8k",), concurrency=(1,), gpus=2)
    cid = "vllm-ar-gsm8k-c1"
    raw = (path / "cells" / cid / "telemetry.csv").read_text().splitlines()
    first = [float(r.split(",")[3]) for r in raw[1:3]]  # both GPUs' first sample
    tl = analysis.power_timeline(path, cid)
    assert len(tl) == 40 and tl["power_w"].iloc[0] == pytest.approx(sum(first))
    atomic_write_text(path / "cells" / cid / "telemetry.csv", "")
    assert analysis.power_timeline(path, cid) is None
    atomic_write_text(path / "cells" / cid / "telemetry.csv", "t_s,gpu,time_unix\n0.1,0,1.7e9\n")
    assert analysis.power_timeline(path, cid) is None  # samples, none of power
    atomic_write_text(path / "cells" / cid / "telemetry.csv", "t_s,gpu\n0.1,0\n")  # no time: not the sampler's
    with pytest.raises(StoreError, match=r"telemetry.csv line 2 is not a telemetry sample.*--resume"):
        analysis.power_timeline(path, cid)
    assert analysis.power_timeline(path, "vllm-dflash-gsm8k-c1") is not None


def test_power_timeline_reads_the_samplers_csv(tmp_path):
    from dflash_bench.store.telemetry_csv import Sample, samples_to_csv

    cell = tmp_path / "cells" / "c"
    samples = [Sample(t_s=0.1 * k + 0.001 * g, gpu=g, time_unix=1.7e9, power_w=300.0 + g, power_instant_w=400.0 + 10 * k + g)
               for k in range(5) for g in (0, 3)]
    atomic_write_text(cell / "telemetry.csv", samples_to_csv(samples))
    tl = analysis.power_timeline(tmp_path, "c")
    assert list(tl["t_s"]) == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    # Instantaneous power preferred. GPU 3 (sampled 3 ms later, rising 100 W/s) is interpolated onto GPU 0's
    # times: 0.3 W below its own reading, and held at its first reading before it starts.
    gpu3 = [403.0] + [400 + 10 * k + 3 - 0.3 for k in range(1, 5)]
    assert list(tl["power_w"]) == pytest.approx([400 + 10 * k + gpu3[k] for k in range(5)])
    atomic_write_text(cell / "telemetry.csv", samples_to_csv([]))  # telemetry off: header only
    assert analysis.power_timeline(tmp_path, "c") is None


def test_bad_input_is_one_sentence(tmp_path):
    with pytest.raises(UserError, match="not a folder"):
        build_report([tmp_path / "missing"])
    with pytest.raises(UserError, match="no manifest.json"):
        build_report([tmp_path])
    make_sweep(tmp_path / "out" / "s1", suites=("gsm8k",), concurrency=(1,))
    with pytest.raises(UserError, match="holds sweep folders"):
        build_report([tmp_path / "out"])
    with pytest.raises(UserError, match=r"\.html"):
        build_report([tmp_path / "out" / "s1"], tmp_path / "report.txt")


def test_cli_report(tmp_path):
    path = make_sweep(tmp_path / "s", suites=("gsm8k",), concurrency=(1,), telemetry=False)
    out = tmp_path / "site"
    out.mkdir()
    run = subprocess.run([sys.executable, "-m", "dflash_bench", "report", str(path), "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert (out / "report.html").exists() and (out / "figures" / "pareto.png").exists()
    bad = subprocess.run([sys.executable, "-m", "dflash_bench", "report", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stderr.strip().count("\n") == 0


def test_verify_width_by_concurrency_is_drawn_only_where_measured(tmp_path):
    """The builtin fast path narrows its verify under load: the figure and the numbers table show the width per
    concurrency. A sweep whose cells never reported it (an older sweep) gets no such figure."""
    from dflash_bench.store import CellSummary

    path = make_sweep(tmp_path / "builtin", engine="builtin", suites=("gsm8k",), telemetry=False)
    parsed = Page(build_report([path]).read_text())
    assert "verify_width" in _figures_in(parsed)
    text = parsed.all_text()
    assert "verified per step" in text
    for width in (15.8, 14.0, 8.0):  # c = 1, 8, 32: 1 + num_draft_tokens / num_drafts, as report_sweeps writes
        assert f"{width:.1f}" in text
    for f in path.glob("cells/*/summary.json"):
        s = CellSummary.model_validate_json(f.read_text())
        s.verify_width = None
        f.write_text(s.model_dump_json())
    assert "verify_width" not in _figures_in(Page(build_report([path]).read_text()))


def test_partial_cells_are_called_out_with_how_many_failed_and_why(tmp_path):
    plan = [CellPlan(cell_id=f"x-{m}-gsm8k-c1", engine="x", mode=m, suite="gsm8k", concurrency=1) for m in ("ar", "dflash")]
    sweep = SweepDir.create(tmp_path / "partial", Manifest(sweep_id="partial", plan=plan))
    why = "3 of 9 measured requests failed: HTTP 500 (3); throughput and latencies cover the 6 that succeeded"
    for cell in plan:
        partial = cell.mode == "dflash"
        sweep.write_summary(CellSummary(cell_id=cell.cell_id, engine="x", mode=cell.mode, suite="gsm8k", concurrency=1,
                                        output_throughput=100.0, num_requests=9, num_ok=6 if partial else 9,
                                        num_failed=3 if partial else 0, status="partial" if partial else "complete",
                                        failure_reason=why if partial else None))
    parsed = Page(build_report([tmp_path / "partial"]).read_text())
    called = "".join(parsed.by_class["call"])
    assert "1 partial cell(s)" in called and f"x-dflash-gsm8k-c1: {why}" in called
    assert "x-ar-gsm8k-c1" not in called


def test_eagle3_is_a_third_series_of_a_real_emulator_sweep(tmp_path, data_dir):
    """A sweep of the emulator with --modes ar,dflash,eagle3 (its EAGLE-3 stand-in: a speculative server of the head's
    draft length): the headline shows EAGLE-3's speedup over AR on rows of its own, labelled; its tau is a row of the
    acceptance table; DFlash / EAGLE-3 per cell is its own table; and EAGLE-3 has its own colour in the figures."""
    proc = subprocess.run(sweep_argv(tmp_path / "out", "--data-dir", str(data_dir), "--modes", "ar,dflash,eagle3",
                                     "--eagle3", "org/emulated-eagle3", "--engine-arg=--acceptance-length=3",
                                     suites="gsm8k", conc="1,4"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = only_sweep(tmp_path / "out")
    tok = {(r["mode"], int(r["concurrency"])): float(r["output_throughput"]) for r in results(folder).values()}
    parsed = Page(build_report([folder]).read_text())
    rows = _rows(parsed, "hl")
    assert [r[:3] for r in rows] == [["emulator", "DFlash", "gsm8k"], ["emulator", "EAGLE-3", "gsm8k"]]
    for row, mode in zip(rows, ("dflash", "eagle3")):  # each mode's speedup over the AR cell of its own repeat
        assert [float(x.split("×")[0]) for x in row[3:]] == pytest.approx(
            [tok[mode, c] / tok["ar", c] for c in (1, 4)], abs=0.006)
    assert [r[:3] for r in _rows(parsed, "tau")] == [["emulator", "DFlash", "gsm8k"], ["emulator", "EAGLE-3", "gsm8k"]]
    versus = _rows(parsed, "versus")
    assert [(r[2], r[4]) for r in versus] == [("1", "EAGLE-3"), ("4", "EAGLE-3")]
    assert [float(r[6].rstrip("×")) for r in versus] == pytest.approx([tok["dflash", c] / tok["eagle3", c] for c in (1, 4)],
                                                                     abs=0.006)
    assert sum("best" in t for t in parsed.by_class["good"]) == 2  # a best cell per speculative mode, not one of both
    green = _share_of(_figures_in(parsed)["pareto"], (0x2C, 0xA0, 0x2C))
    assert green > 0.0005, green  # EAGLE-3's points and frontier, in its own colour
    # the engines side by side and the card's table: EAGLE-3's rows named in their own column, each its own ratio
    side = _rows(parsed, "engines")
    assert [(r[0], r[2]) for r in side] == [("1", "DFlash"), ("1", "EAGLE-3"), ("4", "DFlash"), ("4", "EAGLE-3")]
    for r in side:
        mode = "dflash" if r[2] == "DFlash" else "eagle3"
        assert float(r[6].split("×")[0]) == pytest.approx(tok[mode, int(r[0])] / tok["ar", int(r[0])], abs=0.006)
    crossings = "".join(parsed.by_class["crossings"])  # where each mode stops paying, on a line of its own
    assert crossings.count(", EAGLE-3, emulated (no model ran): ") == 1
    assert crossings.count(", DFlash, emulated (no model ran): ") == 1
    card_rows = _rows(parsed, "card")
    assert sorted(r[1] for r in card_rows) == ["DFlash", "DFlash", "EAGLE-3", "EAGLE-3"]
    assert all("EAGLE-3, not DFlash" in r[-1] for r in card_rows if r[1] == "EAGLE-3")
    # the sweep's pareto and latency numbers carry EAGLE-3's columns beside DFlash's
    assert parsed.html.count("<th>EAGLE-3 tok/s/user p50</th>") == 1
    assert parsed.html.count('<th colspan="3">TPOT EAGLE-3</th>') == 1


def _rows(parsed: Page, table_class: str) -> list[list[str]]:
    """The text of each body row of the page's table of this class, a string per cell."""
    from html.parser import HTMLParser

    class Rows(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.inside, self.rows, self.cell = 0, [], None

        def handle_starttag(self, tag, attrs):
            if tag == "table" and table_class in (dict(attrs).get("class") or "").split():
                self.inside = 1
            elif self.inside and tag == "tr":
                self.rows.append([])
            elif self.inside and tag == "td":
                self.cell = ""

        def handle_endtag(self, tag):
            if tag == "table":
                self.inside = 0
            elif self.inside and tag == "td" and self.cell is not None:
                self.rows[-1].append(" ".join(self.cell.split()))
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell += data

    p = Rows()
    p.feed(parsed.html)
    return [r for r in p.rows if r]


def _share_of(png: bytes, rgb: tuple[int, int, int]) -> float:
    """The share of a PNG's pixels within a few levels of this colour."""
    import io

    import matplotlib.image
    import numpy as np

    pixels = (matplotlib.image.imread(io.BytesIO(png))[..., :3] * 255).astype(int)
    return float((np.abs(pixels - np.array(rgb)).max(axis=-1) <= 6).mean())


def test_the_latency_section_splits_the_first_token_where_the_server_says(tmp_path):
    """Where the server exports vLLM's request histograms, the latency section gives each cell's mean queue,
    prefill and decode ms per mode beside its TTFT; a sweep whose server says nothing has no such table."""
    plan = [CellPlan(cell_id=f"vllm-{m}-gsm8k-c32", engine="vllm", mode=m, suite="gsm8k", concurrency=32)
            for m in ("ar", "dflash")]
    sweep = SweepDir.create(tmp_path / "split", Manifest(sweep_id="split", plan=plan))
    for cell, (queue, prefill, decode) in zip(plan, ((0.4, 227.2, 11200.0), (12.5, 302.2, 3100.0))):
        sweep.write_summary(CellSummary(cell_id=cell.cell_id, engine="vllm", mode=cell.mode, suite="gsm8k",
                                        concurrency=32, output_throughput=100.0, server_queue_ms=queue,
                                        server_prefill_ms=prefill, server_decode_ms=decode))
    sweep.write_results_csv()
    page = Page(build_report([tmp_path / "split"]).read_text())
    assert "where a request's time went on the server" in page.all_text()
    words = " ".join(" ".join(page.text).split())
    assert "vllm gsm8k 32 0.4 227.2 11,200.0 12.5 302.2 3,100.0" in words
    quiet = make_sweep(tmp_path / "quiet", suites=("gsm8k",), concurrency=(1,))
    assert "where a request's time went on the server" not in Page(build_report([quiet]).read_text()).all_text()
