"""The reference tau: another engine's DFlash tau against the builtin engine's in the same sweep folder, shown by
`report` and failed by `gate` (gate/reference.py).

The folders are written by the harness's own measurement path (`dflash-bench run`, `run_one`) against emulator
servers set to known acceptance levels, one folder per engine pairing, as a sweep over two engines writes them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_bench import gate
from dflash_bench.client.loadgen import LoadSettings
from dflash_bench.client.protocol import RequestSettings
from dflash_bench.client.run_command import run_one
from dflash_bench.emulator import EmulatorProcess
from dflash_bench.gate.reference import REFERENCE_TAU, compare_folders, compare_sweeps
from dflash_bench.report import build_report
from dflash_bench.store import ModelRevision, SweepSettings


def measure(url: str, engine: str, out: Path, name: str, data_dir: Path) -> None:
    run_one(url, "gsm8k", RequestSettings(max_tokens=64), LoadSettings(concurrency=4, timeout=30.0, transport="aiohttp"),
            label="dflash", engine=engine, out=out, name=name, data_dir=data_dir, num_prompts=8, quiet=True)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> dict[str, Path]:
    """alike: builtin and vLLM at the same tau, the emulator engine above both; low: vLLM's tau far below builtin's."""
    out = tmp_path_factory.mktemp("reference")
    emu = dict(mode="dflash", ttft_ms=5, itl_ms=3, output_len=32, seed=1)
    with EmulatorProcess(acceptance_length=6.5, **emu) as ref, EmulatorProcess(acceptance_length=6.5, **emu) as same, \
            EmulatorProcess(acceptance_length=2.5, **emu) as low, EmulatorProcess(acceptance_length=9.0, **emu) as high:
        for engine, server in (("builtin", ref), ("vllm", same), ("emulator", high)):
            measure(server.url, engine, out, "alike", data_dir)
        for engine, server in (("builtin", ref), ("vllm", low)):
            measure(server.url, engine, out, "low", data_dir)
    return {"alike": out / "alike", "low": out / "low"}


def test_engines_that_accept_alike_pass_and_a_higher_one_names_the_builtin(folders: dict[str, Path]):
    result = compare_folders([folders["alike"]])
    by = {c.engine: c for c in result.comparisons}
    assert set(by) == {"vllm", "emulator"} and not result.not_compared
    vllm, high = by["vllm"], by["emulator"]
    assert vllm.key.suite == "gsm8k" and vllm.key.concurrency == 4
    assert vllm.under is None and vllm.tau == pytest.approx(vllm.reference_tau)
    assert 4 < vllm.reference_tau < 7  # the emulated 6.5, cut by short outputs
    assert high.tau > high.reference_tau * 1.1 and high.under == "builtin"  # reported, not an under-accepting engine
    assert result.under_accepting == []

    res = gate.gate(folders["alike"], folders["alike"])
    ref = [c for c in res.checks if c.metric is REFERENCE_TAU]
    assert [c.verdict for c in ref] == ["improved", "pass"]  # emulator, vllm: sorted by engine
    assert res.exit_code == 0

    page = build_report([folders["alike"]]).read_text()
    assert "Acceptance against the reference engine" in page and 'id="reference-warning"' not in page
    assert "builtin under-accepts" in page and "alike" in page


def test_an_engine_under_accepting_is_named_by_the_report_and_fails_the_gate(folders: dict[str, Path], tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]):
    result = compare_folders([folders["low"]])
    [low] = result.under_accepting
    assert low.engine == "vllm" and low.under == "vllm" and low.tau < 0.6 * low.reference_tau
    sentence = low.check.note
    assert sentence.startswith("vllm under-accepts on gsm8k at concurrency 4: τ ")
    assert f"{low.tau:.3f} against the builtin engine's {low.reference_tau:.3f}" in sentence

    code = gate.main(folders["low"], baseline=folders["low"])
    printed = capsys.readouterr().out
    assert code == 1 and "FAIL" in printed and "vllm under-accepts on gsm8k at concurrency 4" in printed.replace("\n", " ")

    md = tmp_path / "gate.md"
    assert gate.main(folders["low"], baseline=folders["low"], markdown=md) == 1
    assert "vllm under-accepts on gsm8k at concurrency 4" in md.read_text() and "2% below it allowed" in md.read_text()

    off = tmp_path / "off.toml"
    off.write_text("[reference]\ncheck = false\n")
    assert gate.main(folders["low"], baseline=folders["low"], thresholds=off) == 0
    loose = tmp_path / "loose.toml"
    loose.write_text("[reference]\ntolerance = 0.9\n")
    assert gate.main(folders["low"], baseline=folders["low"], thresholds=loose) == 0
    capsys.readouterr()

    page = build_report([folders["alike"], folders["low"]], out=tmp_path / "both.html").read_text()
    assert 'id="reference-warning"' in page
    warning = page[page.index('id="reference-warning"'):]
    warning = warning[:warning.index("</div>")]
    assert "vllm under-accepts on gsm8k at concurrency 4" in warning
    assert warning.count("<li>") == 1  # the alike folder's cells are not flagged, and folders of no named pair stay apart
    table = page[page.index('<table class="reference">'):]
    table = table[:table.index("</table>")]
    for row in ("<td>low</td><td>vllm</td>", "<td>alike</td><td>vllm</td>", "<td>alike</td><td>emulator</td>"):
        assert table.count(row) == 1  # each comparison once, named by its folder


def test_repeats_are_judged_by_their_bootstrap_and_only_comparable_tau_is_compared(folders: dict[str, Path]):
    sweep = gate.collect(folders["low"])
    for side in (sweep, twin := sweep.model_copy(deep=True)):
        side.provenance.models.target = ModelRevision(id="t")
        side.provenance.models.drafter = ModelRevision(id="d")
    [pooled] = compare_sweeps([sweep, twin]).comparisons  # the same pair in two folders: two repeats a side
    assert pooled.check.method == "bootstrap" and len(pooled.check.current) == 2 and pooled.under == "vllm"
    twin.provenance.settings = SweepSettings(model="t", suites=["gsm8k"], temperature=0.7)  # other requests: apart
    assert [c.check.method for c in compare_sweeps([sweep, twin]).comparisons] == ["plain", "plain"]

    vllm = next(c for c in sweep.cells if c.engine == "vllm")
    vllm.metrics["acceptance_definition"] = [1.0]  # counted by an older definition of tau: not comparable
    result = compare_sweeps([sweep])
    assert result.comparisons == [] and "different definitions" in result.not_compared[0]
