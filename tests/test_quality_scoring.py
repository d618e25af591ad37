"""Scorers on hand-written right and wrong answers, intervals against independent values, and the
accuracy of planted AR / DFlash cells of a sweep folder."""

from __future__ import annotations

import json
import math

import pytest

from dflash_bench.quality import scoring
from dflash_bench.quality.accuracy import score_sweep
from dflash_bench.quality.intervals import paired_difference, wilson
from dflash_bench.quality.sandbox import Limits, run_program
from dflash_bench.store import CellPlan, CellSummary, Manifest, RequestRecord, SweepDir, cell_id
from dflash_bench.suites import load_prompts

FAST = Limits(timeout_s=5, cpu_s=5, memory_mb=512)


# ---------------------------------------------------------------- intervals


def wilson_by_bisection(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson interval from its definition: the p with |k/n - p| = z sqrt(p(1-p)/n), found numerically."""
    phat = k / n
    f = lambda p: abs(phat - p) - z * math.sqrt(p * (1 - p) / n)  # noqa: E731  negative inside the interval

    def root(lo: float, hi: float) -> float:  # f(lo) and f(hi) of opposite signs
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if (f(mid) > 0) == (f(lo) > 0) else (lo, mid)
        return (lo + hi) / 2

    return (0.0 if k == 0 else root(0.0, phat)), (1.0 if k == n else root(phat, 1.0))


@pytest.mark.parametrize("k,n", [(81, 263), (0, 10), (10, 10), (7, 40), (1, 1)])
def test_wilson_matches_its_definition(k, n):
    assert wilson(k, n) == pytest.approx(wilson_by_bisection(k, n), abs=1e-9)


def test_paired_difference_matches_published_example():
    # Fagerland, Lydersen & Laake, Statistical Analysis of Contingency Tables, ch. 8 (table 59/6/16/80):
    # Newcombe square-and-add: estimate -0.0621, 95% CI -0.1186 to -0.0046
    d, lo, hi = paired_difference(59, 6, 16, 80)
    assert (round(d, 4), round(lo, 4), round(hi, 4)) == (-0.0621, -0.1186, -0.0046)
    d, lo, hi = paired_difference(30, 0, 0, 10)  # identical verdicts: zero difference, a narrow interval around it
    assert d == 0 and -0.1 < lo < 0 < hi < 0.1


# ---------------------------------------------------------------- answers


@pytest.mark.parametrize("output,reference,right", [
    ("She earns 9 * 2 = 18 dollars.\nThe final answer is \\boxed{18}.", "Janet ... #### 18", True),
    ("Total: \\boxed{\\$1,000}", "1000", True),
    ("So the answer is 18.00 dollars, since 3 + 15 = 18.", "18", True),
    ("Step 1: 5 apples.\n#### 42", "42", True),
    ("It is 7 + 9 = 16 and then 16 + 2 = 18", "18", True),  # last number when nothing else says
    ("The final answer is \\boxed{17}.", "#### 18", False),
    ("\\boxed{18} is tempting but the answer is \\boxed{20}", "18", False),  # the last boxed answer counts
    ("I cannot tell.", "18", False),
])
def test_gsm8k(output, reference, right):
    assert scoring.score_gsm8k(output, reference) is right


def test_gsm8k_on_real_records(data_dir):
    for p in load_prompts("gsm8k", data_dir=data_dir, num_prompts=5, seed=3):
        assert scoring.score_gsm8k(f"Reasoning...\nSo the answer is \\boxed{{{p.reference}}}.", p.reference)
        assert not scoring.score_gsm8k(f"\\boxed{{{int(p.reference.replace(',', '')) + 1}}}", p.reference)


@pytest.mark.parametrize("output,reference,right", [
    ("Thus $x = \\boxed{\\dfrac{14}{3}}$.", "\\frac{14}{3}", True),
    ("\\boxed{0.5}", "\\frac12", True),
    ("\\boxed{\\begin{pmatrix} -7 \\\\ 16 \\\\ 5 \\end{pmatrix}}", "\\begin{pmatrix} -7 \\\\ 16 \\\\ 5 \\end{pmatrix}", True),
    ("The angle is \\boxed{30^\\circ}.", "30^\\circ", True),
    ("\\boxed{\\frac{13}{3}}", "\\frac{14}{3}", False),
    ("\\boxed{(-7, 16, 4)}", "\\begin{pmatrix} -7 \\\\ 16 \\\\ 5 \\end{pmatrix}", False),
    ("no boxed answer here", "5", False),
])
def test_math500(output, reference, right):
    assert scoring.score_math(output, reference) is right


def test_math500_equivalent_forms_with_math_verify():
    if scoring.MATH_CHECKER != "math-verify":
        pytest.skip("math-verify is not installed (the [quality] extra)")
    assert scoring.score_math("\\boxed{3\\sqrt{2}}", "\\sqrt{18}")
    assert scoring.score_math("\\boxed{\\frac{\\pi}{2}}", "\\dfrac{\\pi}{2}")
    assert not scoring.score_math("\\boxed{2\\sqrt{3}}", "\\sqrt{18}")


def test_math_normaliser_fallback():
    n = scoring.normalise_math
    assert n("\\dfrac{1}{2}") == n("0.5") == n("\\frac12")
    assert n("\\text{(C)}") == n("(C)")
    assert n("10\\%") == n("10") and n("30^\\circ") == n("30")
    assert n("\\frac{1}{3}") != n("0.33")


# ---------------------------------------------------------------- code


def test_code_extraction():
    text = "Sure.\n```python\ndef helper():\n    pass\n```\nand\n```python\ndef add(a, b):\n    return a + b\n\n" \
           "if __name__ == '__main__':\n    print(add(input(), 1))\n```"
    code = scoring.extract_code(text, "add")
    assert "def add" in code and "__main__" not in code and "input()" not in code
    assert scoring.extract_code("def f():\n    return 1\n") == "def f():\n    return 1\n"


def test_humaneval_and_mbpp_programs_pass_and_fail(data_dir):
    he = load_prompts("humaneval", data_dir=data_dir, num_prompts=2, seed=1)
    for p in he:
        meta = p.meta
        right = f"Here is the solution:\n```python\n{meta['prompt']}{p.reference}\n```"
        continuation = p.reference  # a completion-style answer: the body only
        wrong = f"```python\ndef {meta['entry_point']}(*args):\n    return None\n```"
        run = lambda out: run_program(scoring.humaneval_program(out, meta["prompt"], meta["test"], meta["entry_point"]), FAST)  # noqa: E731
        assert run(right).passed and run(continuation).passed
        assert not run(wrong).passed
    mb = load_prompts("mbpp", data_dir=data_dir, num_prompts=2, seed=1)
    for p in mb:
        prog = lambda out: scoring.mbpp_program(out, p.meta["test_list"], p.meta.get("test_imports"))  # noqa: E731
        assert run_program(prog(f"```python\n{p.reference}\n```"), FAST).passed
        assert not run_program(prog("```python\ndef nothing():\n    pass\n```"), FAST).passed


# ---------------------------------------------------------------- a sweep folder


def _sweep(tmp_path, cells: dict[tuple[str, str], list[RequestRecord]]) -> SweepDir:
    plan = [CellPlan(cell_id=cell_id("builtin", m, s, 1), engine="builtin", mode=m, suite=s, concurrency=1)
            for (m, s) in cells]
    sweep = SweepDir.create(tmp_path / "sweep", Manifest(sweep_id="acc", plan=plan))
    for (mode, suite), records in cells.items():
        cid = cell_id("builtin", mode, suite, 1)
        sweep.write_requests(cid, records)
        sweep.write_summary(CellSummary(cell_id=cid, engine="builtin", mode=mode, suite=suite, concurrency=1))
    return sweep


def _req(pid: str, text: str | None, t: float, **kw) -> RequestRecord:
    return RequestRecord(request_id=f"{pid}@{t}", prompt_id=pid, t_send=t, output_text=text, **kw)


def test_score_sweep_accuracy_and_paired_difference(tmp_path, data_dir):
    gsm = load_prompts("gsm8k", data_dir=data_dir, num_prompts=10, seed=0)
    he = load_prompts("humaneval", data_dir=data_dir, num_prompts=2, seed=0)
    ar_right = {p.id for p in gsm[:8]}  # AR: 8/10 right
    df_right = {p.id for p in gsm[:6]} | {gsm[9].id}  # DFlash: 7/10; AR-only 2 (6, 7), DFlash-only 1 (9)
    answer = lambda p, right: f"\\boxed{{{p.reference if right else '-1'}}}"  # noqa: E731
    ar = [_req(p.id, answer(p, p.id in ar_right), i + 1) for i, p in enumerate(gsm)]
    df = [_req(p.id, answer(p, p.id in df_right), i + 1) for i, p in enumerate(gsm)]
    ar.append(_req(gsm[0].id, "\\boxed{-1}", 0, warmup=True))  # warm-up: never scored
    df.append(_req("gsm8k/not-a-record", "\\boxed{1}", 20))
    df.append(_req(gsm[1].id, None, 21, error="HTTP 500"))
    code = [_req(he[0].id, f"```python\n{he[0].meta['prompt']}{he[0].reference}\n```", 1),
            _req(he[1].id, "```python\nimport os\nos.remove('/etc/hostname')\n```", 2),
            _req(he[1].id, f"```python\ndef {he[1].meta['entry_point']}(*a):\n    return None\nexit()\n```", 3)]
    sweep = _sweep(tmp_path, {("ar", "gsm8k"): ar, ("dflash", "gsm8k"): df, ("ar", "humaneval"): code})

    out = score_sweep(sweep.path, data_dir=data_dir)
    a, d = out[cell_id("builtin", "ar", "gsm8k", 1)], out[cell_id("builtin", "dflash", "gsm8k", 1)]
    assert (a.n, a.correct, a.accuracy) == (10, 8, 0.8) and (a.ci_low, a.ci_high) == pytest.approx(wilson_by_bisection(8, 10))
    assert (d.n, d.correct) == (10, 7) and d.not_scored == {"no_reference": 1, "failed": 1}
    v = d.vs_ar
    assert (v.n, v.both, v.only_ar, v.only_dflash, v.neither) == (10, 6, 2, 1, 1)
    assert v.ar_minus_dflash == pytest.approx(0.1) and v.ci_low < 0.1 < v.ci_high
    assert "--score-code" in out[cell_id("builtin", "ar", "humaneval", 1)].status

    on_disk = json.loads((sweep.cell_dir(cell_id("builtin", "dflash", "gsm8k", 1)) / "accuracy.jsonl").read_text().splitlines()[9])
    assert on_disk["prompt_id"] == gsm[9].id and on_disk["correct"] is True
    assert sweep.read_summary(cell_id("builtin", "ar", "gsm8k", 1)).accuracy.correct == 8

    out = score_sweep(sweep.path, data_dir=data_dir, score_code=True, limits=FAST)
    h = out[cell_id("builtin", "ar", "humaneval", 1)]
    assert (h.metric, h.n, h.correct) == ("pass@1", 3, 1) and h.isolation  # exit() before the tests: not a pass
    early = json.loads((sweep.cell_dir(cell_id("builtin", "ar", "humaneval", 1)) / "accuracy.jsonl").read_text().splitlines()[2])
    assert early["correct"] is False and early["detail"] == "exited 0 before its tests ran"
