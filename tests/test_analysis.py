import pytest

from dflash_bench import analysis
from dflash_bench.store import CellPlan, CellSummary, Manifest, SweepDir, cell_id


def _sweep(path, rows):
    plan = [CellPlan(cell_id=cell_id(e, m, s, c, r), engine=e, mode=m, suite=s, concurrency=c, repeat=r) for e, m, s, c, r, *_ in rows]
    sweep = SweepDir.create(path, Manifest(sweep_id=path.name, plan=plan))
    for (e, m, s, c, r, tput, tau) in rows:
        sweep.write_summary(CellSummary(cell_id=cell_id(e, m, s, c, r), engine=e, mode=m, suite=s, concurrency=c, repeat=r,
                                        output_throughput=tput, acceptance_length=tau,
                                        status="complete" if tput else "failed"))
    return path


def test_pairs_and_headline(tmp_path):
    path = _sweep(tmp_path / "s", [
        ("vllm", "ar", "gsm8k", 1, 0, 100.0, None),
        ("vllm", "dflash", "gsm8k", 1, 0, 400.0, 6.0),
        ("vllm", "ar", "gsm8k", 1, 1, 110.0, None),
        ("vllm", "dflash", "gsm8k", 1, 1, 385.0, 5.0),
        ("vllm", "ar", "math500", 8, 0, 200.0, None),
        ("vllm", "dflash", "math500", 8, 0, None, None),  # failed: no pair
    ])
    frame = analysis.cells(path)
    assert len(frame) == 6
    p = analysis.pairs(frame)
    assert list(p["speedup"]) == pytest.approx([4.0, 3.5])
    h = analysis.headline(frame)
    assert len(h) == 1
    row = h.iloc[0]
    assert row["mode"] == "dflash" and row["ar_tok_s"] == pytest.approx(105.0) and row["spec_tok_s"] == pytest.approx(392.5)
    assert row["tau"] == pytest.approx(5.5) and row["repeats"] == 2
    # the speedup is the repeats' median ratio (each repeat's pair ran close together), with their spread
    assert row["speedup"] == pytest.approx(3.75) and (row["speedup_min"], row["speedup_max"]) == pytest.approx((3.5, 4.0))


def test_eagle3_is_a_speculative_mode_of_its_own_beside_dflash(tmp_path):
    """--modes ar,dflash,eagle3: each speculative mode is paired with the AR cell of its repeat, a headline row of its
    own (never averaged with DFlash's), and DFlash over EAGLE-3 is the median of the repeats' ratios."""
    path = _sweep(tmp_path / "s", [
        ("vllm", "ar", "gsm8k", 1, 0, 100.0, None), ("vllm", "dflash", "gsm8k", 1, 0, 400.0, 6.0),
        ("vllm", "eagle3", "gsm8k", 1, 0, 250.0, 4.0),
        ("vllm", "ar", "gsm8k", 1, 1, 100.0, None), ("vllm", "dflash", "gsm8k", 1, 1, 360.0, 5.0),
        ("vllm", "eagle3", "gsm8k", 1, 1, 200.0, 3.0),
        ("vllm", "ar", "gsm8k", 8, 0, 300.0, None), ("vllm", "eagle3", "gsm8k", 8, 0, 600.0, 3.5),  # no DFlash
    ])
    frame = analysis.cells(path)
    p = analysis.pairs(frame)
    assert list(zip(p["concurrency"], p["repeat"], p["mode"], p["speedup"])) == [
        (1, 0, "dflash", 4.0), (1, 0, "eagle3", 2.5), (1, 1, "dflash", 3.6), (1, 1, "eagle3", 2.0), (8, 0, "eagle3", 2.0)]
    h = analysis.headline(frame)
    assert [(r["concurrency"], r["mode"], r["spec_tok_s"], r["tau"], r["speedup"]) for r in h.to_dict("records")] == [
        (1, "dflash", 380.0, 5.5, pytest.approx(3.8)), (1, "eagle3", 225.0, 3.5, pytest.approx(2.25)),
        (8, "eagle3", 600.0, 3.5, 2.0)]
    (v,) = analysis.versus(frame).to_dict("records")  # c=8 ran no DFlash: no ratio
    assert (v["concurrency"], v["mode"], v["dflash_tok_s"], v["other_tok_s"]) == (1, "eagle3", 380.0, 225.0)
    assert (v["ratio"], v["ratio_min"], v["ratio_max"]) == pytest.approx((1.7, 1.6, 1.8))
    assert (v["dflash_tau"], v["other_tau"], v["repeats"]) == (5.5, 3.5, 2)


def test_one_disturbed_repeat_does_not_move_the_speedup(tmp_path):
    path = _sweep(tmp_path / "s", [
        ("builtin", "ar", "gsm8k", 1, 0, 100.0, None), ("builtin", "dflash", "gsm8k", 1, 0, 300.0, 6.0),
        ("builtin", "ar", "gsm8k", 1, 1, 30.0, None), ("builtin", "dflash", "gsm8k", 1, 1, 290.0, 6.0),  # AR disturbed
        ("builtin", "ar", "gsm8k", 1, 2, 105.0, None), ("builtin", "dflash", "gsm8k", 1, 2, 330.0, 6.0),
    ])
    row = analysis.headline(analysis.cells(path)).iloc[0]
    assert row["speedup"] == pytest.approx(330 / 105) and row["speedup_max"] == pytest.approx(290 / 30)
    assert row["speedup_min"] == pytest.approx(3.0)


def test_several_sweeps_do_not_pair_across(tmp_path):
    a = _sweep(tmp_path / "h100", [("vllm", "ar", "gsm8k", 1, 0, 100.0, None)])
    b = _sweep(tmp_path / "b300", [("vllm", "dflash", "gsm8k", 1, 0, 500.0, 6.0)])
    assert analysis.pairs(analysis.cells(a, b)).empty
