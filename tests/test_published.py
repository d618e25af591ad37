"""Published model-card tables: copied exactly, attached to known pairs, and the settings that differ."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dflash_bench.models import KNOWN, resolve
from dflash_bench.published import (PUBLISHED, MeasuredRow, PublishedSettings, RunSettings, gpu_model,
                                    published_for, setting_gaps, side_by_side)

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "dflash.md"
_SUITES = {"Math500": "math500", "GSM8K": "gsm8k", "HumanEval": "humaneval", "MBPP": "mbpp", "MT-Bench": "mt-bench"}


def _gemma_card_rows() -> list[tuple]:
    text = REFERENCE.read_text(encoding="utf-8")
    block = text.split("**gemma-4-31B-it-DFlash**", 1)[1].split("SGLang per the card", 1)[0]
    cell = r"\s*([\d.]+)×?\s*\|"
    rows = re.findall(r"\|\s*([\w-]+)\s*\|" + cell * 5, block)
    return [(_SUITES[s], int(c), float(a), float(d), float(x), float(t)) for s, c, a, d, x, t in rows]


@pytest.mark.skipif(not REFERENCE.exists(), reason="shared/reference/dflash.md is not beside the repository")
def test_gemma_table_is_the_reference_copy_of_the_card_row_for_row():
    expected = _gemma_card_rows()
    assert len(expected) == 15
    got = [(r.suite, r.concurrency, r.ar_tok_s, r.dflash_tok_s, r.speedup, r.tau)
           for r in published_for("gemma-4-31B-it").rows]
    assert sorted(got) == sorted(expected)


def test_card_speedups_agree_with_their_own_throughputs_to_the_printed_rounding():
    # the cards print tok/s to the unit and speedups to 0.1, from unrounded figures: 408/78 = 5.23 is
    # printed 5.3; a typo in a copied figure moves the ratio far past this bound
    for table in PUBLISHED.values():
        for r in (r for r in table.rows if r.ar_tok_s and r.dflash_tok_s):  # the paper prints speedups alone
            ratio = r.dflash_tok_s / r.ar_tok_s
            slack = 0.05 + ratio * (0.5 / r.ar_tok_s + 0.5 / r.dflash_tok_s)
            assert abs(ratio - r.speedup) <= slack, (table.pair, r)


def test_every_table_belongs_to_a_known_pair_and_cites_its_card_or_the_paper():
    for name, table in PUBLISHED.items():
        assert name in KNOWN
        assert table.card in (f"https://huggingface.co/{KNOWN[name].drafter}", "https://arxiv.org/abs/2602.06036")
    assert resolve("z-lab/gemma-4-31B-it-DFlash").published().settings.gpu == "B300"
    paper = resolve("Qwen3-8B").published()  # its card quotes no table here: the paper's, greedy on one B200
    assert {(r.suite, r.tau, r.speedup) for r in paper.rows} == {("gsm8k", 6.54, 5.15), ("math500", 5.82, 4.64)}
    assert resolve("Qwen3-4B").published() is None


def test_gemma_settings_are_the_cards():
    s = published_for("gemma-4-31B-it").settings
    assert (s.gpu, s.engine, s.thinking, s.max_tokens, s.temperature, s.block_size) == (
        "B300", "vllm", True, 4096, 0.0, 16)


@pytest.mark.parametrize("name, model", [
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA B300", "B300"), ("NVIDIA GB200", "GB200"),
    ("NVIDIA L40S", "L40S"), ("NVIDIA H200", "H200"), ("some accelerator", "some accelerator"),
])
def test_gpu_model_reads_the_model_out_of_the_driver_name(name, model):
    assert gpu_model(name) == model


def test_setting_gaps_lists_each_difference_and_each_unknown():
    card = published_for("gemma-4-31B-it").settings
    run = RunSettings(gpu="NVIDIA H100 80GB HBM3", engine="vLLM", thinking=False, max_tokens=2048,
                      temperature=0.0, block_size=16, template_hash="sha256:ab12")
    gaps = {g.setting: g for g in setting_gaps(card, run)}
    assert set(gaps) == {"GPU", "thinking", "max tokens", "template hash"}  # engine differs only in case
    gpu = gaps["GPU"]
    assert (gpu.published, gpu.measured, gpu.status) == ("B300", "NVIDIA H100 80GB HBM3", "differs")
    assert (gaps["thinking"].published, gaps["thinking"].measured) == ("on", "off")
    assert gaps["template hash"].status == "unknown" and gaps["template hash"].published == "not stated"


def test_setting_gaps_are_empty_when_the_run_matches_the_card():
    card = PublishedSettings(gpu="B300", engine="vllm", thinking=True, max_tokens=4096, temperature=0.0,
                             block_size=16, template_hash="sha256:ab12")
    run = RunSettings(gpu="NVIDIA B300 SXM6", engine="vllm", thinking=True, max_tokens=4096, temperature=0.0,
                      block_size=16, template_hash="sha256:ab12")
    assert setting_gaps(card, run) == []
    # a setting the run did not record is no match: it is listed as unknown
    assert [g.setting for g in setting_gaps(card, run.model_copy(update={"thinking": None}))] == ["thinking"]


def test_side_by_side_pairs_cells_and_compares_speedups():
    table = published_for("gemma-4-31B-it")
    measured = [MeasuredRow(suite="gsm8k", concurrency=8, ar_tok_s=100, dflash_tok_s=270, tau=6.0),
                MeasuredRow(suite="gsm8k", concurrency=2, ar_tok_s=50, dflash_tok_s=100)]
    rows = side_by_side(table, measured)
    assert len(rows) == 15
    hit = [r for r in rows if r.measured is not None]
    assert [(r.suite, r.concurrency) for r in hit] == [("gsm8k", 8)]
    assert hit[0].measured_speedup == pytest.approx(2.7)
    assert hit[0].speedup_ratio == pytest.approx(2.7 / 4.5)
    assert all(r.measured_speedup is None for r in rows if r.measured is None)
