"""Sweep folders with planted values for the report tests (the report is the thing under test, not the numbers)."""

from __future__ import annotations

import math
from pathlib import Path

from dflash_bench.store import (
    AccuracySummary, CellPlan, CellSummary, LosslessSummary, Manifest, PairedDiff, RequestRecord, Stat, SweepDir,
    atomic_write_text, cell_id,
)

XSS = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"


def _stat(p50: float, spread: float = 1.3) -> Stat:
    return Stat(n=32, mean=p50 * 1.05, p50=p50, p90=p50 * spread, p99=p50 * spread * 1.3, min=p50 * 0.7, max=p50 * spread * 1.5)


def _summary(engine: str, mode: str, suite: str, c: int, repeat: int, *, energy: bool, boost: float) -> CellSummary:
    ar_tput = 70.0 * c ** 0.8
    speed = max(0.8, boost - 0.06 * c) if mode == "dflash" else 1.0
    tput = ar_tput * speed
    tpot = 1000.0 * c / tput
    s = CellSummary(
        cell_id=cell_id(engine, mode, suite, c, repeat), engine=engine, mode=mode, suite=suite, concurrency=c, repeat=repeat,
        num_requests=32, num_ok=32, total_output_tokens=32 * 512, duration_s=32 * 512 / tput, output_throughput=tput,
        ttft_ms=_stat(40.0 + 3 * c), tpot_ms=_stat(tpot), tok_s_user=_stat(1000.0 / tpot, 1.15),
        settings={"max_tokens": 512, "temperature": 0.0}, telemetry="on" if energy else "off: no NVML",
    )
    if mode == "dflash":
        tau = 6.5 - 0.02 * c - (1.0 if suite == "mt-bench" else 0.0)
        s.acceptance_length = tau
        s.acceptance_length_req_weighted = tau - 0.2
        s.acceptance_length_token_weighted = tau + 0.1
        s.acceptance_rate = (tau - 1) / 15
        s.acceptance_per_position = [round(0.95 * math.exp(-0.18 * i) - 0.01 * math.log2(c), 4) for i in range(15)]
        s.acceptance_source = "vllm-metrics"
        s.num_drafts = 1000
        s.num_draft_tokens = 15000 if engine != "builtin" else round(1000 * (15 - min(c, 48) / 4))
        s.verify_width = 1 + s.num_draft_tokens / s.num_drafts  # the builtin engine narrows its verify under load
    if energy:
        s.avg_power_w = 350.0 + 8 * c + (40 if mode == "dflash" else 0)
        s.j_per_token = s.avg_power_w / tput
        s.energy_j = s.j_per_token * s.total_output_tokens
    return s


def make_sweep(path: Path, *, sweep_id: str | None = None, engine: str = "vllm", suites=("gsm8k", "mt-bench"),
               concurrency=(1, 8, 32), repeats: int = 1, gpus: int | None = 1, telemetry: bool = True,
               failed: dict[str, str] | None = None, output_text: str = "The answer is \\boxed{42}.",
               lossless: bool = False, boost: float = 3.6, model: str = "Qwen/Qwen3-8B") -> Path:
    """A complete sweep folder: every (mode, suite, concurrency, repeat) cell, with `failed` cell ids failed for the given reason."""
    failed = failed or {}
    plan = [CellPlan(cell_id=cell_id(engine, m, s, c, r), engine=engine, mode=m, suite=s, concurrency=c, repeat=r)
            for s in suites for c in concurrency for r in range(repeats) for m in ("ar", "dflash")]
    hardware = {"gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{i}"} for i in range(gpus)]} if gpus else {}
    manifest = Manifest(sweep_id=sweep_id or path.name, status="complete", plan=plan, command_line=["dflash-bench", "sweep", "--model", model],
                        settings={"model": model, "engines": [engine], "suites": list(suites), "max_tokens": 512},
                        hardware=hardware, models={"target": {"id": model}, "drafter": {"id": "z-lab/Qwen3-8B-DFlash-b16"}},
                        versions={"dflash_bench": "0.1.0", "vllm": "0.20.1"},
                        telemetry="GPU telemetry on" if telemetry else "GPU telemetry off: NVML found no GPU")
    sweep = SweepDir.create(path, manifest)
    for cell in plan:
        if cell.cell_id in failed:
            cell.status, cell.reason = "failed", failed[cell.cell_id]
            sweep.write_summary(CellSummary(cell_id=cell.cell_id, engine=engine, mode=cell.mode, suite=cell.suite,
                                            concurrency=cell.concurrency, repeat=cell.repeat, status="failed",
                                            failure_reason=failed[cell.cell_id]))
            continue
        cell.status = "complete"
        s = _summary(engine, cell.mode, cell.suite, cell.concurrency, cell.repeat, energy=telemetry, boost=boost)
        if lossless and cell.mode == "dflash":
            s.lossless = LosslessSummary(**{"status": "ok", "ar_cell": cell.cell_id.replace("-dflash-", "-ar-"), "n": 32, "identical": 31,
                                   "exact_match_rate": 31 / 32, "divergences": {"near_tie": 1}, "first_divergence": {"n": 1, "p50": 117},
                                   "examples": [{"ar_text": XSS, "dflash_text": XSS}]})
        if lossless:
            s.accuracy = AccuracySummary(**{"status": "ok", "metric": "exact", "n": 32, "correct": 28 if cell.mode == "ar" else 27,
                                   "accuracy": 28 / 32 if cell.mode == "ar" else 27 / 32, "ci_low": 0.719, "ci_high": 0.950,
                                   "checker": f"boxed {XSS}"})
            if cell.mode == "dflash":
                s.accuracy.vs_ar = PairedDiff(**{"n": 32, "ar_accuracy": 28 / 32, "dflash_accuracy": 27 / 32, "ar_minus_dflash": 1 / 32,
                                                "ci_low": -0.05, "ci_high": 0.11, "both": 27, "only_ar": 1, "only_dflash": 0, "neither": 4})
        sweep.write_requests(cell.cell_id, [
            RequestRecord(request_id=f"{cell.cell_id}-{i}", prompt_id=f"{cell.suite}-{i}", t_send=0.1 * i, t_first_token=0.1 * i + 0.05,
                          t_end=0.1 * i + 2.0, output_tokens=512, output_text=f"{output_text} ({cell.mode} #{i})")
            for i in range(2)])
        if telemetry:
            rows = ["t_s,gpu,time_unix,power_w,energy_mj"]
            for k in range(40):
                for g in range(gpus or 1):
                    rows.append(f"{k * 0.1 + g * 1e-4:.4f},{g},{1.7e9 + k * 0.1},{s.avg_power_w + 30 * math.sin(k / 4):.1f},{1000 * k}")
            atomic_write_text(sweep.cell_dir(cell.cell_id) / "telemetry.csv", "\n".join(rows) + "\n")
        sweep.write_summary(s)
    sweep.write_manifest(manifest)
    sweep.write_results_csv()
    return path
