"""Task accuracy of the AR and DFlash cells of a sweep folder, on the same prompts.

GSM8K and Math500 are scored in-process; HumanEval and MBPP (pass@1) run the dataset's tests on the
model's code in the sandbox, and only when asked (`score_code=True`, the CLI's --score-code). Each
scored cell gets its summary's `accuracy` field (a store.AccuracySummary: accuracy with its Wilson interval); a DFlash
cell with an AR partner also gets `vs_ar`: the AR - DFlash difference over the prompts both answered,
with Newcombe's paired interval. Per-request verdicts go to `cells/<cell>/accuracy.jsonl`.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Callable

from pydantic import BaseModel

from dflash_bench.quality import scoring
from dflash_bench.quality.intervals import paired_difference, wilson
from dflash_bench.quality.sandbox import Limits, RunResult, run_many
from dflash_bench.store import MEASURED, SPECULATIVE, AccuracySummary, PairedDiff, RequestRecord, SweepDir, atomic_write_text
from dflash_bench.suites import Prompt

__all__ = ["AccuracySummary", "PairedDiff", "Verdict", "compare_verdicts", "score_cell", "score_sweep"]

ACCURACY_FILE = "accuracy.jsonl"
LEVEL: float = AccuracySummary.model_fields["level"].default
ANSWER_SUITES = {"gsm8k": scoring.score_gsm8k, "math500": scoring.score_math}
CODE_SUITES = ("humaneval", "mbpp")


class Verdict(BaseModel):
    prompt_id: str
    occurrence: int = 0
    correct: bool
    detail: str = ""  # the sandbox's reason for code suites


def score_sweep(sweep_dir: Path | str, data_dir: Path | str | None = None, score_code: bool = False,
                limits: Limits = Limits(), workers: int = 2) -> dict[str, AccuracySummary]:
    """Score every complete cell of a scorable suite; write verdicts and summaries; rebuild results.csv."""
    from dflash_bench.suites import load_prompts

    sweep = SweepDir.open(Path(sweep_dir))
    done = [s for s in sweep.summaries() if s.status in MEASURED and s.suite in (*ANSWER_SUITES, *CODE_SUITES)]
    prompts: dict[str, dict[str, Prompt]] = {}
    verdicts: dict[str, dict[tuple[str, int], bool]] = {}
    out: dict[str, AccuracySummary] = {}
    for cell in done:
        if cell.suite in CODE_SUITES and not score_code:
            out[cell.cell_id] = AccuracySummary(status="not scored: running model-written code needs --score-code",
                                                metric="pass@1")
            continue
        if cell.suite not in prompts:
            loaded = load_prompts(cell.suite, data_dir=Path(data_dir) if data_dir else None)
            prompts[cell.suite] = {p.id: p for p in loaded}
        rows, summary = score_cell(sweep.read_requests(cell.cell_id), cell.suite, prompts[cell.suite], limits, workers)
        atomic_write_text(sweep.cell_dir(cell.cell_id) / ACCURACY_FILE, "".join(v.model_dump_json() + "\n" for v in rows))
        verdicts[cell.cell_id] = {(v.prompt_id, v.occurrence): v.correct for v in rows}
        out[cell.cell_id] = summary
    by_key = {c.pair_key(): c.cell_id for c in done if c.mode == "ar"}
    for cell in done:
        ar_id = by_key.get(cell.pair_key())
        if cell.mode in SPECULATIVE and ar_id in verdicts and cell.cell_id in verdicts:
            out[cell.cell_id].vs_ar = compare_verdicts(verdicts[ar_id], verdicts[cell.cell_id])
    for cell in done:
        cell.accuracy = out[cell.cell_id]
        sweep.write_summary(cell)
    sweep.write_results_csv()
    return out


def score_cell(records: list[RequestRecord], suite: str, prompts: dict[str, Prompt], limits: Limits = Limits(),
               workers: int = 2) -> tuple[list[Verdict], AccuracySummary]:
    """Verdicts for a cell's measured first-turn requests, and their summary."""
    skipped: dict[str, int] = defaultdict(int)
    todo: list[tuple[str, int, str, Prompt]] = []  # prompt id, occurrence, output, prompt
    seen: dict[str, int] = defaultdict(int)
    for r in sorted((r for r in records if not r.warmup and r.turn == 0), key=lambda r: r.t_send):
        occ = seen[r.prompt_id]
        seen[r.prompt_id] += 1
        prompt = prompts.get(r.prompt_id) or prompts.get(r.prompt_id.split("#")[0])
        if not r.ok:
            skipped["failed"] += 1
        elif r.output_text is None:
            skipped["no_output_text"] += 1
        elif prompt is None or prompt.reference is None and suite in ANSWER_SUITES:
            skipped["no_reference"] += 1
        else:
            todo.append((r.prompt_id, occ, r.output_text, prompt))
    if suite in ANSWER_SUITES:
        check: Callable[[str, str], bool] = ANSWER_SUITES[suite]
        rows = [Verdict(prompt_id=pid, occurrence=occ, correct=p.reference is not None and check(text, p.reference)) for pid, occ, text, p in todo]
        summary = AccuracySummary(metric="exact", checker="math-verify" if suite == "math500" and scoring.MATH_CHECKER == "math-verify"
                                  else "normaliser" if suite == "math500" else "final number")
    else:
        results = run_many([program(suite, text, p.meta) for _, _, text, p in todo], limits, workers)
        rows = [code_verdict(pid, occ, res) for (pid, occ, _, _), res in zip(todo, results)]
        summary = AccuracySummary(metric="pass@1", checker="sandbox",
                                  isolation=results[0].isolation if results else {})
    n, k = len(rows), sum(v.correct for v in rows)
    lo, hi = wilson(k, n, LEVEL) if n else (None, None)
    summary.status = "ok" if n else "nothing to score"
    summary.n, summary.correct, summary.accuracy = n, k, (k / n if n else None)
    summary.ci_low, summary.ci_high, summary.not_scored = lo, hi, dict(skipped)
    return rows, summary


def code_verdict(prompt_id: str, occurrence: int, res: RunResult) -> Verdict:
    """Passed only when the program exited 0 after its last test (an early exit(0) is a failure)."""
    correct = scoring.tests_passed(res.passed, res.stdout)
    detail = "exited 0 before its tests ran" if res.passed and not correct else res.reason
    return Verdict(prompt_id=prompt_id, occurrence=occurrence, correct=correct, detail=detail)


def program(suite: str, output: str, meta: dict) -> str:
    """The program whose exit status is the verdict: the model's code followed by the task's tests."""
    if suite == "humaneval":
        return scoring.humaneval_program(output, meta["prompt"], meta["test"], meta["entry_point"])
    return scoring.mbpp_program(output, list(meta.get("test_list") or []), list(meta.get("test_imports") or []),
                                meta.get("test_setup_code") or "")


def compare_verdicts(ar: dict[tuple[str, int], bool], df: dict[tuple[str, int], bool]) -> PairedDiff:
    """AR - DFlash accuracy over the prompts both cells answered, with its paired interval."""
    keys = sorted(set(ar) & set(df))
    both = sum(ar[k] and df[k] for k in keys)
    only_ar = sum(ar[k] and not df[k] for k in keys)
    only_df = sum(df[k] and not ar[k] for k in keys)
    neither = len(keys) - both - only_ar - only_df
    d, lo, hi = paired_difference(both, only_ar, only_df, neither, LEVEL)
    n = len(keys)
    return PairedDiff(n=n, ar_accuracy=(both + only_ar) / n if n else None, dflash_accuracy=(both + only_df) / n if n else None,
                      ar_minus_dflash=d, ci_low=lo, ci_high=hi, both=both, only_ar=only_ar, only_dflash=only_df, neither=neither)
