"""The SLO read-off: hand-computed frontiers, interpolation, out-of-range targets, caps and parsing."""

from __future__ import annotations

import math

import pytest

from dflash_bench.errors import UserError
from dflash_bench.slo import SloPoint, SloTarget, compare, frontier, parse_slo, points_from_rows, read_off
from dflash_bench.store import CellSummary, Stat, results_row


def P(c, tput, user, ttft=None, tpot=None):
    return SloPoint(concurrency=c, tok_s_gpu=tput, tok_s_user=user, ttft_p90_ms=ttft, tpot_p90_ms=tpot)


AR = [P(1, 100, 100), P(4, 300, 75), P(8, 250, 60), P(16, 800, 50), P(64, 1200, 20)]  # c=8 is dominated by c=4
DF = [P(1, 400, 250), P(4, 1000, 180), P(16, 2000, 90), P(64, 2600, 40)]


# ---------------------------------------------------------------- frontier


def test_frontier_drops_dominated_points_and_orders_fastest_user_first():
    assert [p.concurrency for p in frontier(AR)] == [1, 4, 16, 64]


def test_frontier_of_exact_ties_keeps_the_lowest_concurrency():
    assert [p.concurrency for p in frontier([P(8, 500, 40), P(4, 500, 40)])] == [4]


def test_frontier_keeps_a_point_better_on_one_axis_only():
    # more throughput AND more tok/s/user at higher concurrency (a warm-up artefact) leaves only that one
    assert [p.concurrency for p in frontier([P(1, 100, 50), P(2, 150, 60)])] == [2]
    assert [p.concurrency for p in frontier([P(1, 100, 60), P(2, 150, 50)])] == [1, 2]


# ---------------------------------------------------------------- one side


def test_interpolates_linearly_in_log_concurrency_between_bracketing_frontier_points():
    r = read_off(AR, SloTarget(tok_s_user=60))
    # bracket c=4 (75) and c=16 (50), not the dominated c=8 (60): t = 15/25 = 0.6
    assert r.status == "interpolated"
    assert r.between == (4, 16)
    assert r.tok_s_gpu == pytest.approx(300 + 0.6 * 500)  # 600
    assert r.concurrency == pytest.approx(4 * 4 ** 0.6)  # exp(log 4 + 0.6 log 4) = 9.19


def test_a_target_on_a_measured_point_is_that_point():
    r = read_off(AR, SloTarget(tok_s_user=75))
    assert (r.status, r.tok_s_gpu, r.concurrency, r.between) == ("measured", 300, 4, None)


def test_a_target_faster_than_every_point_is_not_reached_and_says_how_far():
    r = read_off(AR, SloTarget(tok_s_user=120))
    assert r.status == "not_reached" and r.tok_s_gpu is None
    assert r.best_tok_s_user == 100


def test_a_target_met_at_every_point_is_a_lower_bound_at_the_highest_throughput():
    r = read_off(AR, SloTarget(tok_s_user=15))
    assert (r.status, r.tok_s_gpu, r.concurrency) == ("lower_bound", 1200, 64)


def test_a_ttft_cap_drops_the_points_over_it_before_the_frontier():
    pts = [P(1, 100, 100, ttft=200), P(16, 800, 50, ttft=900), P(64, 1200, 20, ttft=3000)]
    r = read_off(pts, SloTarget(tok_s_user=15, ttft_p90_ms=2000))
    assert (r.status, r.tok_s_gpu, r.concurrency) == ("lower_bound", 800, 16)
    assert r.dropped == ["c=64: TTFT p90 3,000 ms > 2,000 ms"]
    # the same target without the cap reaches c=64
    assert read_off(pts, SloTarget(tok_s_user=15)).tok_s_gpu == 1200


def test_a_tpot_cap_with_no_figure_drops_the_point_rather_than_trusting_it():
    pts = [P(1, 100, 100, tpot=10), P(16, 800, 50)]
    r = read_off(pts, SloTarget(tok_s_user=15, tpot_p90_ms=40))
    assert r.tok_s_gpu == 100 and r.dropped == ["c=16: no TPOT p90 measured"]


def test_every_point_over_a_cap_is_not_reached():
    r = read_off([P(1, 100, 100, tpot=60)], SloTarget(tok_s_user=10, tpot_p90_ms=40))
    assert r.status == "not_reached" and r.best_tok_s_user is None and len(r.dropped) == 1


# ---------------------------------------------------------------- both sides and the headline


def test_headline_with_both_sides_interpolated():
    res = compare(AR, DF, SloTarget(tok_s_user=60))
    # DFlash brackets c=16 (90) and c=64 (40): t = 30/50 = 0.6 -> 2000 + 0.6 * 600 = 2360
    assert res.dflash.tok_s_gpu == pytest.approx(2360)
    assert res.speedup == pytest.approx(2360 / 600)
    assert res.speedup_bound == "exact"
    assert res.headline == "at >= 60 tok/s/user, AR serves 600 tok/s per GPU and DFlash 2,360 (3.93x)"


def test_headline_when_ar_cannot_reach_the_target():
    res = compare(AR, DF, SloTarget(tok_s_user=120))
    # DFlash: c=4 (180) and c=16 (90), t = 60/90 -> 1000 + 2/3 * 1000
    assert res.dflash.tok_s_gpu == pytest.approx(1000 + 1000 * 2 / 3)
    assert res.speedup is None
    assert res.headline == ("at >= 120 tok/s/user, AR cannot (best 100 tok/s/user) "
                            "and DFlash serves 1,667 tok/s per GPU")


def test_a_dflash_lower_bound_makes_the_ratio_a_floor():
    res = compare(AR, DF, SloTarget(tok_s_user=30))
    # AR: c=16 (50) and c=64 (20), t = 20/30 -> 800 + 2/3 * 400; DFlash meets 30 even at c=64
    assert res.ar.tok_s_gpu == pytest.approx(800 + 400 * 2 / 3)
    assert res.dflash.status == "lower_bound"
    assert res.speedup_bound == "at_least"
    assert res.headline.endswith("DFlash >= 2,600 (>= 2.44x)")


def test_an_ar_lower_bound_makes_the_ratio_a_ceiling():
    res = compare([P(1, 100, 50), P(8, 700, 35)], [P(1, 300, 90), P(8, 1500, 20)], SloTarget(tok_s_user=30))
    # DFlash: t = 60/70 -> 300 + 6/7 * 1200 = 1328.6; AR meets 30 at c=8 (700 is a floor)
    assert res.speedup == pytest.approx((300 + 1200 * 6 / 7) / 700)
    assert res.speedup_bound == "at_most"
    assert res.headline.endswith("(<= 1.90x)")


def test_both_lower_bounds_give_no_ratio():
    res = compare(AR, DF, SloTarget(tok_s_user=15))
    assert res.speedup is None
    assert "ratio unknown" in res.headline


def test_neither_side_reaching_says_so_with_the_caps_in_the_headline():
    res = compare(AR, DF, SloTarget(tok_s_user=500, ttft_p90_ms=2000))
    assert res.headline.startswith("at >= 500 tok/s/user (TTFT p90 <= 2,000 ms), neither side reaches")


def test_result_round_trips_through_json():
    res = compare(AR, DF, SloTarget(tok_s_user=60, tpot_p90_ms=40))
    assert type(res).model_validate_json(res.model_dump_json()) == res


# ---------------------------------------------------------------- parsing


def test_parse_full_and_bare_forms():
    assert parse_slo("tok_s_user=30,ttft_p90_ms=2000,tpot_p90_ms=40") == SloTarget(
        tok_s_user=30, ttft_p90_ms=2000, tpot_p90_ms=40)
    assert parse_slo(" 30 ") == SloTarget(tok_s_user=30)
    assert parse_slo("tpot_p90_ms=40, tok_s_user=12.5") == SloTarget(tok_s_user=12.5, tpot_p90_ms=40)
    assert parse_slo("30,tpot_p90_ms=40,") == SloTarget(tok_s_user=30, tpot_p90_ms=40)


@pytest.mark.parametrize("text, words", [
    ("", "empty"),
    ("tok_s_user=30,ttft_ms=5", "unknown key 'ttft_ms'"),
    ("tok_s_user=30,tok_s_user=40", "twice"),
    ("tok_s_user=fast", "not a number"),
    ("tok_s_user=-3", "positive"),
    ("tok_s_user=nan", "positive"),
    ("ttft_p90_ms=2000", "needs a tok/s/user target"),
    ("30,40", "unknown key '40'"),
    ("30,tok_s_user=40", "twice"),
    ("tpot_p90_ms=40,30", "unknown key '30'"),
])
def test_parse_refuses_bad_input_in_one_sentence(text, words):
    with pytest.raises(UserError) as err:
        parse_slo(text)
    msg = str(err.value)
    assert words in msg and "\n" not in msg and msg.endswith(".")


# ---------------------------------------------------------------- from the sweep's rows


def _row(conc, tput, user_p50, ttft_p90=None, status="complete", repeat=0):
    s = CellSummary(cell_id=f"x-ar-gsm8k-c{conc}", engine="x", mode="ar", suite="gsm8k", concurrency=conc,
                    repeat=repeat, status=status, output_throughput=tput,
                    tok_s_user=Stat(n=4, p50=user_p50) if user_p50 is not None else None,
                    ttft_ms=Stat(n=4, p90=ttft_p90) if ttft_p90 is not None else None)
    return results_row(s)


def test_points_from_results_rows_average_repeats_skip_failures_and_divide_by_gpus():
    rows = [_row(1, 100, 50, 200), _row(1, 120, 40, 400, repeat=1), _row(4, 400, 30),
            _row(8, None, None, status="failed")]
    pts = points_from_rows(rows, gpus=2)
    assert [p.concurrency for p in pts] == [1, 4]
    assert pts[0].tok_s_gpu == pytest.approx(55) and pts[0].tok_s_user == pytest.approx(45)
    assert pts[0].ttft_p90_ms == pytest.approx(300) and pts[1].ttft_p90_ms is None
    assert math.isclose(pts[1].tok_s_gpu, 200)
