"""--interleave: a concurrency-1 cell's AR and DFlash requests alternate one by one (client/interleave.py), each
cell keeps its own records and counters, and its throughput is over the time its own requests ran. Real
emulator servers over HTTP (known truth); the sweep through the CLI."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest

from dflash_bench.client.interleave import measure_pair
from dflash_bench.client.loadgen import LoadSettings
from dflash_bench.client.protocol import RequestSettings
from dflash_bench.client.summary import summarize_cell
from dflash_bench.emulator import EmulatorProcess
from dflash_bench.errors import UserError
from dflash_bench.metrics.definitions import busy_seconds
from dflash_bench.store import RequestRecord
from sweep_helpers import only_sweep, results, sweep_argv


def _rec(t_send: float, t_end: float | None) -> RequestRecord:
    return RequestRecord(request_id="r", prompt_id="p", turn=0, warmup=False, t_send=t_send, t_end=t_end)


def test_busy_seconds_is_the_union_of_the_requests_intervals():
    assert busy_seconds([_rec(0.0, 1.0), _rec(2.0, 2.5)]) == pytest.approx(1.5)  # a gap is not counted
    assert busy_seconds([_rec(0.0, 1.0), _rec(0.5, 2.0), _rec(3.0, 4.0)]) == pytest.approx(3.0)  # overlap once
    assert busy_seconds([_rec(1.0, 3.0), _rec(0.0, 2.0)]) == pytest.approx(3.0)  # any order
    assert busy_seconds([_rec(0.0, 5.0), _rec(1.0, 2.0)]) == pytest.approx(5.0)  # one inside another
    assert busy_seconds([_rec(0.0, None)]) is None


def _absolute(m) -> list[tuple[float, float]]:
    return [(m.t0 + r.t_send, m.t0 + r.t_end) for r in m.records if not r.warmup]


def test_the_two_servers_requests_alternate_and_each_cell_counts_only_its_own():
    prompts = [SimpleNamespace(id=f"p{i}", turns=[f"prompt {i}"]) for i in range(4)]
    seen = []
    with EmulatorProcess(mode="ar", ttft_ms=2, itl_ms=2, output_len=8) as ar, \
            EmulatorProcess(mode="dflash", ttft_ms=2, itl_ms=2, output_len=8, acceptance_length=4) as df:
        a, d = measure_pair((ar.url, df.url), prompts, (RequestSettings(max_tokens=8), RequestSettings(max_tokens=8)),
                            LoadSettings(concurrency=1), lambda done, total, tokens, s: seen.append((done, total)))
    for m, url in ((a, ar.url), (d, df.url)):
        measured = [r for r in m.records if not r.warmup]
        assert m.url == url and m.settings.interleaved and len(measured) == 4 and sum(r.warmup for r in m.records) == 1
        assert [r.prompt_id for r in measured] == ["p0", "p1", "p2", "p3"] and all(r.ok for r in measured)
        # the counters were scraped after the warm-up: each server served its own four measured requests
        assert sum(v for k, v in m.snaps.delta.items() if k.startswith("vllm:request_success")) == 4
    assert seen[-1] == (8, 8)
    # one timeline: A B, B A, A B, B A, never two in flight at once
    spans = sorted([(s, e, "ar") for s, e in _absolute(a)] + [(s, e, "df") for s, e in _absolute(d)])
    assert [who for _, _, who in spans] == ["ar", "df", "df", "ar", "ar", "df", "df", "ar"]
    assert all(e <= nxt for (_, e, _), (nxt, _, _) in zip(spans, spans[1:]))
    # each cell's duration is its own requests' time, not the shared window
    for m in (a, d):
        s = summarize_cell(m, cell_id="c", engine="emulator", mode="ar", suite="s", concurrency=1)
        measured = [r for r in m.records if not r.warmup]
        assert s.duration_s == pytest.approx(sum(r.t_end - r.t_send for r in measured))
        assert s.duration_s < spans[-1][1] - spans[0][0]
        assert s.output_throughput == pytest.approx(sum(r.output_tokens for r in measured) / s.duration_s)


def test_interleaving_measures_concurrency_one_only():
    prompts = [SimpleNamespace(id="p", turns=["x"])]
    with pytest.raises(UserError, match="concurrency 1 only"):
        measure_pair(("http://127.0.0.1:1", "http://127.0.0.1:2"), prompts, (RequestSettings(), RequestSettings()),
                     LoadSettings(concurrency=2))
    with pytest.raises(UserError, match="cannot be combined"):
        measure_pair(("http://127.0.0.1:1", "http://127.0.0.1:2"), prompts, (RequestSettings(), RequestSettings()),
                     LoadSettings(concurrency=1, min_seconds=1.0))


def test_an_interleaved_sweep_alternates_its_concurrency_one_cells_only(tmp_path, data_dir):
    out = tmp_path / "reports"
    proc = subprocess.run(sweep_argv(out, "--data-dir", str(data_dir), "--paired", "--interleave", "--repeats", "2",
                                     suites="gsm8k", conc="1,2"), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = only_sweep(out)
    rows = results(folder)
    assert len(rows) == 8 and {r["status"] for r in rows.values()} == {"complete"}
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["settings"]["interleave"] is True

    def timeline(cell: str) -> list[tuple[float, float]]:
        summary = json.loads((folder / "cells" / cell / "summary.json").read_text())
        t0 = summary["clock_origin_monotonic_s"]
        recs = [json.loads(line) for line in (folder / "cells" / cell / "requests.jsonl").read_text().splitlines()]
        assert summary["settings"].get("interleaved") is (True if "-c1" in cell else None), cell
        return [(t0 + r["t_send"], t0 + r["t_end"]) for r in recs if not r["warmup"]]

    for suffix in ("", "-r1"):
        ar, df = timeline(f"emulator-ar-gsm8k-c1{suffix}"), timeline(f"emulator-dflash-gsm8k-c1{suffix}")
        assert len(ar) == len(df) == 6
        assert min(s for s, _ in df) < max(e for _, e in ar) and min(s for s, _ in ar) < max(e for _, e in df)
        ar2, df2 = timeline(f"emulator-ar-gsm8k-c2{suffix}"), timeline(f"emulator-dflash-gsm8k-c2{suffix}")
        # concurrency 2 is measured cell after cell, as without --interleave
        assert max(e for _, e in ar2) < min(s for s, _ in df2) or max(e for _, e in df2) < min(s for s, _ in ar2)
    # repeat 1 swaps the modes' order (sweep/plan.py): its first request went to the DFlash server
    first = lambda cell: min(s for s, _ in timeline(cell))  # noqa: E731
    assert first("emulator-ar-gsm8k-c1") < first("emulator-dflash-gsm8k-c1")
    assert first("emulator-dflash-gsm8k-c1-r1") < first("emulator-ar-gsm8k-c1-r1")


def test_interleave_without_paired_is_one_sentence_and_writes_nothing(tmp_path):
    out = tmp_path / "reports"
    proc = subprocess.run(sweep_argv(out, "--interleave"), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "add --paired" in " ".join(proc.stderr.split())
    assert not out.exists() or not any(out.iterdir())
