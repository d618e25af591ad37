"""The adaptive verify width's chooser (engine/fast/scheduling/width.py): what it picks from measured acceptance and times."""

from __future__ import annotations

import pytest

from dflash_bench.engine.fast.scheduling.width import CPU_DECAY, CPU_WIDTHS, DECAY, WidthChooser

B = 16


def _feed(ch: WidthChooser, bucket: int, rows: int, accepted, cost, steps: int) -> list[int]:
    """`steps` choose/observe rounds: each row accepts `accepted(w)` drafts; a step of width w takes cost(w) s."""
    picked = []
    for _ in range(steps):
        w = ch.choose(bucket, rows)
        picked.append(w)
        ch.observe(bucket, w, [min(accepted(w), w - 1)] * rows, cost(w))
    return picked


def test_every_width_is_timed_before_the_table_is_trusted():
    ch = WidthChooser(B)
    assert ch.widths == [2, 4, 6, 8, 10, 16]
    first = _feed(ch, 8, 8, lambda w: 0, lambda w: 1.0, 6)
    assert sorted(first) == [2, 4, 6, 8, 10, 16]  # the whole block first: the far positions get measured


def test_a_flat_cost_and_high_acceptance_verify_the_whole_block():
    ch = WidthChooser(B)
    picked = _feed(ch, 1, 1, lambda w: w - 1, lambda w: 1.0 + (0.05 if w == 16 else 0.0), 200)
    assert picked[-100:].count(16) > 90  # memory-bound (c=1): checking more costs almost nothing
    assert ch.expected(16) == pytest.approx(16)


def test_a_compute_bound_step_with_low_acceptance_narrows():
    ch = WidthChooser(B)
    cost = lambda w: 0.8 + 0.15 * w  # noqa: E731  (grows with tokens per row: a big batch)
    picked = _feed(ch, 32, 32, lambda w: 2, cost, 300)  # two drafts accepted: positions past 3 never pay
    tail = picked[-100:]
    assert max(set(tail), key=tail.count) == 4
    assert ch.survival(2) == pytest.approx(1.0) and ch.survival(3) < 0.05


def test_the_choice_follows_a_change_of_workload():
    ch = WidthChooser(B)
    cost = lambda w: 0.8 + 0.1 * w  # noqa: E731
    _feed(ch, 16, 16, lambda w: 1, cost, 400)
    assert ch.choose(16, 16) == 2  # one draft accepted: the narrowest verify that holds it
    picked = _feed(ch, 16, 16, lambda w: w - 1, cost, 3000)  # the drafter now gets everything right
    assert picked[-100:].count(16) > 90


def test_widths_stay_within_the_block_and_batches_keep_their_own_times():
    assert WidthChooser(6).widths == [2, 4, 6]
    assert WidthChooser(2).widths == [2]
    ch = WidthChooser(B)
    _feed(ch, 1, 1, lambda w: w - 1, lambda w: 1.0, 8)
    assert {b for b, _ in ch.times} == {1}
    assert ch.choose(64, 64) == 16  # a new batch bucket is timed afresh, the whole block first


def test_small_batches_on_a_gpu_verify_the_whole_block():
    ch = WidthChooser(B, narrow_from=8)
    assert ch.candidates(4) == [16] and ch.candidates(8) == ch.widths
    picked = _feed(ch, 4, 4, lambda w: 0, lambda w: 0.5 + 0.1 * w, 50)  # narrowing would pay, but is not a graph
    assert set(picked) == {16} and (4, 2) not in ch.times


def test_a_cpu_stops_drafting_where_no_draft_pays_and_does_not_retime_the_whole_block():
    """CPU widths: 1 verifies the anchor alone (no draft, cost of an AR step). Where every verified draft costs
    about what it earns (a compute-bound step), the choice settles on 1; without `explore_block` the periodic
    re-timing visits only the best width's neighbours, never the costly whole block again."""
    from dflash_bench.engine.fast.scheduling.width import CPU_WIDTHS

    ch = WidthChooser(B, CPU_WIDTHS, explore_block=False)
    assert ch.widths == [1, 2, 3, 4, 6, 8, 10, 16] and ch.expected(1) == 1.0
    cost = lambda w: 1.0 + 0.6 * (w - 1)  # noqa: E731  (each token verified ~0.6 of an AR step)
    picked = _feed(ch, 32, 32, lambda w: 0 if w < 3 else 1, cost, 300)
    assert sorted(picked[:8]) == ch.widths  # each timed once first
    assert picked[-100:].count(1) > 80 and 16 not in picked[8:]
    ch = WidthChooser(B, CPU_WIDTHS)  # the GPU's schedule does go back to the whole block
    assert 16 in _feed(ch, 32, 32, lambda w: 0 if w < 3 else 1, cost, 300)[8:]


@pytest.mark.parametrize("decay", [CPU_DECAY, DECAY])
def test_on_a_cpu_a_short_cell_after_other_workloads_gets_its_own_widths(decay):
    """A demo on a CPU runs short cells one after another on one server: a suite whose drafts are all accepted at
    one row, the same at 32 rows (compute-bound there: the anchor alone), then 44 steps of a suite that accepts 2
    drafts. With the CPU's decay the last cell's steps verify the 3-4 tokens that hold them within a few steps;
    with the GPU's (0.999 per row-step) the first suite's far acceptance still decides, and every step verifies
    the whole block. Costs: DFlash step / AR step at one row on this box (cpu_step_cpu_real_pair.json)."""
    ratio = {1: 1.05, 2: 1.38, 3: 1.42, 4: 1.43, 6: 1.49, 8: 1.63, 10: 1.8, 16: 2.18}
    ch = WidthChooser(B, CPU_WIDTHS, explore_block=False, decay=decay)
    _feed(ch, 1, 1, lambda w: w - 1, lambda w: ratio[w], 100)
    assert _feed(ch, 32, 32, lambda w: w - 1, lambda w: 1.0 * w, 40)[-1] == 1
    picked = _feed(ch, 1, 1, lambda w: 2, lambda w: ratio[w], 44)
    if decay == CPU_DECAY:
        assert all(3 <= w <= 4 for w in picked[-20:]), picked
    else:
        assert picked[-20:].count(16) >= 15, picked
