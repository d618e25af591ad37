"""Token-level lossless check on sweep folders with planted AR/DFlash outputs of known divergences."""

from __future__ import annotations

import csv

import pytest

from dflash_bench.quality.lossless import (
    annotate_sweep, compare, first_divergence, in_accepted_draft, read_comparisons, top2_margin,
)
from dflash_bench.store import CellPlan, CellSummary, Manifest, RequestRecord, SweepDir, cell_id


def top(chosen: int, runner_up: int, margin: float) -> list[tuple[int, float]]:
    return [(chosen, -0.01), (runner_up, -0.01 - margin)]


def rec(pid: str, ids: list[int], *, turn: int = 0, t: float = 0.0, margins: dict[int, tuple[int, float]] | None = None,
        chunks: list[int] | None = None, text: str | None = None, warmup: bool = False, save_ids: bool = True,
        error: str | None = None) -> RequestRecord:
    """A request whose position p has runner-up/margin from `margins` (default: runner-up 999, margin 5)."""
    margins = margins or {}
    tops = [top(tok, *margins.get(p, (999, 5.0))) for p, tok in enumerate(ids)]
    return RequestRecord(
        request_id=f"{pid}-{turn}-{t}", prompt_id=pid, turn=turn, t_send=t, warmup=warmup, error=error,
        token_ids=ids if save_ids else None, top_logprobs=tops if save_ids else None,
        chunk_tokens=chunks or list(range(1, len(ids) + 1)), output_text=text, output_tokens=len(ids),
    )


def make_sweep(tmp_path, ar: list[RequestRecord], df: list[RequestRecord], temperature: float = 0.0) -> SweepDir:
    ids = {m: cell_id("builtin", m, "gsm8k", 1) for m in ("ar", "dflash")}
    plan = [CellPlan(cell_id=c, engine="builtin", mode=m, suite="gsm8k", concurrency=1, status="complete") for m, c in ids.items()]
    sweep = SweepDir.create(tmp_path / "sweep", Manifest(sweep_id="s1", plan=plan))
    for mode, records in (("ar", ar), ("dflash", df)):
        sweep.write_requests(ids[mode], records)
        sweep.write_summary(CellSummary(cell_id=ids[mode], engine="builtin", mode=mode, suite="gsm8k", concurrency=1,
                                        settings={"temperature": temperature}))
    return sweep


def test_first_divergence_and_margin_helpers():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 7]) == 2
    margin, runner = top2_margin([(4, -2.5), (7, -0.25)])  # unsorted on purpose
    assert runner == 4 and margin == pytest.approx(2.25)
    assert top2_margin([(4, -0.1)]) == (None, None)


def test_chunk_boundaries_tell_draft_from_bonus():
    chunks = [1, 5, 6, 10]  # prefill token; verify step of 4 (3 drafts + bonus); step of 1; step of 4
    assert in_accepted_draft(chunks, 0) is False  # prefill token, a chunk of its own
    assert [in_accepted_draft(chunks, p) for p in (1, 2, 3, 4)] == [True, True, True, False]
    assert in_accepted_draft(chunks, 5) is False
    assert in_accepted_draft(chunks, 9) is False and in_accepted_draft(chunks, 8) is True
    assert in_accepted_draft(chunks, 10) is None
    assert in_accepted_draft([3, 4], 1) is None  # first chunk carries several tokens: cannot tell
    assert in_accepted_draft([], 0) is None


def test_compare_classifies_near_tie_mismatch_length():
    ar = rec("p", [10, 11, 12, 13], margins={2: (42, 0.03)})
    near = compare(ar, rec("p", [10, 11, 42, 50], chunks=[1, 4]))
    assert (near.kind, near.position, near.ar_token, near.dflash_token) == ("near_tie", 2, 12, 42)
    assert near.margin == pytest.approx(0.03) and near.dflash_is_ar_runner_up is True
    assert near.in_accepted_draft is True
    real = compare(rec("p", [10, 11, 12, 13], margins={1: (42, 3.0)}), rec("p", [10, 77, 12, 13]))
    assert real.kind == "mismatch" and real.position == 1 and real.margin == pytest.approx(3.0)
    assert real.dflash_is_ar_runner_up is False
    assert compare(rec("p", [10, 11, 12, 13]), rec("p", [10, 11, 12, 13, 14])).kind == "length"
    assert compare(rec("p", [1, 2]), rec("p", [1, 2])).kind == "identical"
    ar_no_lp = rec("p", [1, 2])
    ar_no_lp.top_logprobs = None
    assert compare(ar_no_lp, rec("p", [1, 3])).kind == "unknown"


def test_annotate_sweep_writes_positions_margins_and_results_csv(tmp_path):
    ar = [
        rec("warm", [1, 2], warmup=True),
        rec("a", [5, 6, 7, 8, 9], t=1, text="The answer is 12."),
        rec("b", [5, 6, 7, 8, 9, 10, 11], t=2, margins={4: (99, 0.02)}, text="x = 3 so y = 4"),
        rec("c", [1, 2, 3, 4, 5, 6, 7, 8, 9], t=3, margins={7: (55, 2.5)}),
        rec("d", [1, 2], t=4, save_ids=False),
        rec("e", [1, 2], t=5),  # no DFlash partner
        rec("f", [1, 2, 3], t=6, error="timeout"),
    ]
    df = [
        rec("warm", [1, 9], warmup=True),  # warm-up differs: must be ignored
        rec("a", [5, 6, 7, 8, 9], t=1, text="The answer is 12."),
        rec("b", [5, 6, 7, 8, 99, 10, 11], t=2, chunks=[1, 6, 7], text="x = 3 so y = 5"),
        rec("c", [1, 2, 3, 4, 5, 6, 7, 55, 9], t=3, chunks=[1, 4, 8, 9]),
        rec("d", [1, 2], t=4, save_ids=False),
        rec("f", [1, 2, 3], t=6),
    ]
    sweep = make_sweep(tmp_path, ar, df)
    result = annotate_sweep(sweep.path)
    dcell = cell_id("builtin", "dflash", "gsm8k", 1)
    s = result[dcell]
    assert (s.n, s.identical) == (3, 1) and s.exact_match_rate == pytest.approx(1 / 3)
    assert s.divergences == {"near_tie": 1, "mismatch": 1}
    assert s.in_accepted_draft == 1 and s.at_target_token == 1  # b at 4: draft (chunk 1..5); c at 7: bonus
    assert s.first_divergence["min"] == 4 and s.first_divergence["max"] == 7
    assert s.first_divergence["p50"] == 5.5  # the median of 4 and 7 (it read 7: an off-by-one rank)
    assert s.divergence_histogram == {"lower_edges": [0, 1, 2, 4], "counts": [0, 0, 0, 2]}
    assert s.not_compared == {"unpaired": 1, "no_token_ids": 1, "failed": 1}
    assert s.examples[0]["prompt_id"] == "b" and s.examples[0]["ar_text"].endswith("y = 4")
    assert s.examples[0]["dflash_text"].endswith("y = 5") and s.examples[0]["char_offset"] == 13

    rows = {r.prompt_id: r for r in read_comparisons(sweep.path, dcell)}
    assert rows["b"].margin == pytest.approx(0.02) and rows["b"].dflash_token == 99
    assert rows["c"].kind == "mismatch" and rows["c"].margin == pytest.approx(2.5)

    on_disk = sweep.read_summary(dcell).lossless
    assert on_disk is not None and on_disk.exact_match_rate == pytest.approx(1 / 3)
    assert sweep.read_summary(cell_id("builtin", "ar", "gsm8k", 1)).lossless is None
    with open(sweep.path / "results.csv") as f:
        by_mode = {row["mode"]: row for row in csv.DictReader(f)}
    assert by_mode["dflash"]["lossless_n"] == "3" and by_mode["ar"]["lossless_n"] == ""
    assert annotate_sweep(sweep.path)[dcell] == s  # idempotent


def test_later_turns_of_a_diverged_conversation_are_not_compared(tmp_path):
    ar = [rec("m", [1, 2, 3], turn=0, t=1), rec("m", [4, 5], turn=1, t=2), rec("m", [1], t=3), rec("m", [7], turn=1, t=4)]
    df = [rec("m", [1, 2, 9], turn=0, t=1), rec("m", [4, 6], turn=1, t=2), rec("m", [1], t=3), rec("m", [7], turn=1, t=4)]
    s = annotate_sweep(make_sweep(tmp_path, ar, df).path)[cell_id("builtin", "dflash", "gsm8k", 1)]
    # first occurrence: turn 0 diverges, turn 1 skipped; second occurrence (sent again): both turns identical
    assert (s.n, s.identical) == (3, 2) and s.not_compared == {"earlier_turn_diverged": 1}


def test_no_token_ids_or_temperature_says_why(tmp_path):
    s = annotate_sweep(make_sweep(tmp_path, [rec("a", [1], save_ids=False)], [rec("a", [1], save_ids=False)]).path)
    assert s[cell_id("builtin", "dflash", "gsm8k", 1)].status.endswith("(run the sweep with --save-token-ids)")
    hot = annotate_sweep(make_sweep(tmp_path / "hot", [rec("a", [1])], [rec("a", [2])], temperature=0.7).path)
    only = next(iter(hot.values()))
    assert only.n == 0 and "temperature 0.7" in only.status and only.exact_match_rate is None
