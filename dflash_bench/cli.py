"""The `dflash-bench` command line. Thin: parse options, call one function per command.

Imports of heavy modules (pandas, torch, docker, ...) happen inside the commands so that
`dflash-bench --help` stays fast and a missing optional extra only affects the command that needs it. The one
import up front beyond typer is settings.py (and pydantic with it): `sweep`'s options are made from its fields.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from dflash_bench.cli_app import DataDirOption, app, suites_app
from dflash_bench.cli_options import Given, Options, declared_options
from dflash_bench.errors import UserError
from dflash_bench.settings import RAMP_HELP, STEADY_HELP, SlurmOptions, SweepSettings


@suites_app.command("list")
def suites_list(data_dir: Optional[Path] = DataDirOption) -> None:
    """List the benchmark suites: source, records (counted offline when --data-dir holds them), categories."""
    from dflash_bench.suites import print_suites

    print_suites(data_dir)


@suites_app.command("show")
def suites_show(
    name: str = typer.Argument(..., help="Suite name (see `dflash-bench suites list`)."),
    num: int = typer.Option(3, "-n", "--num", help="How many prompts to show, from the start of the suite."),
    category: Optional[list[str]] = typer.Option(None, "--category", help="Only this category (repeatable)."),
    config: Optional[str] = typer.Option(None, "--config", help="Hub config, e.g. speed-bench throughput_8k."),
    data_dir: Optional[Path] = DataDirOption,
) -> None:
    """Show the first prompts of a suite, rendered exactly as they are sent."""
    from dflash_bench.suites import print_prompts

    print_prompts(name, num, data_dir, config=config, categories=category)


@app.command()
def run(
    url: str = typer.Option(..., "--url", help="Base URL of the running OpenAI-compatible server, e.g. http://127.0.0.1:8000."),
    suite: str = typer.Option(..., "--suite", help="Benchmark suite (see `dflash-bench suites list`)."),
    concurrency: int = typer.Option(1, "--concurrency", "-c", min=1, help="Requests in flight (closed loop)."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", "-n", min=1, help="Prompts to send (default: the whole suite)."),
    max_tokens: int = typer.Option(2048, "--max-tokens", min=1, help="Output cap per request."),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="Sampling temperature (always sent explicitly)."),
    label: str = typer.Option("ar", "--label", help="What the server runs: ar or dflash."),
    engine: str = typer.Option("vllm", "--engine", help="vllm | sglang | builtin | emulator | llamacpp: how acceptance is read."),
    api: str = typer.Option("chat", "--api", help="chat | completions | generate (SGLang native)."),
    save_token_ids: bool = typer.Option(False, "--save-token-ids", help="Record output token ids and top-2 logprobs (for the lossless check)."),
    thinking: Optional[bool] = typer.Option(None, "--thinking/--no-thinking", help="Send chat_template_kwargs.enable_thinking (default: not sent)."),
    out: Path = typer.Option(Path("reports"), "--out", help="Folder that holds sweep folders."),
    name: Optional[str] = typer.Option(None, "--name", help="Sweep folder name under --out (default run-<time>); reuse it to add cells."),
    data_dir: Optional[Path] = DataDirOption,
    seed: int = typer.Option(0, "--seed", help="Seed for prompt sampling and Poisson arrivals."),
    request_rate: Optional[float] = typer.Option(None, "--request-rate", min=0.001, help="Poisson arrivals at this many requests/s (capped by --concurrency)."),
    timeout: float = typer.Option(600.0, "--timeout", min=0.1, help="Timeout in seconds of every request the harness makes (/v1/models, /metrics, each generation)."),
    warmup: bool = typer.Option(True, "--warmup/--no-warmup", help="Send --concurrency warm-up requests first (excluded from statistics)."),
    model: Optional[str] = typer.Option(None, "--model", help="Served model name (default: the first one in /v1/models)."),
    transport: str = typer.Option("auto", "--transport", help="HTTP client of the streaming loop: auto (raw for http://, aiohttp for https://), raw, aiohttp or httpx."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="With --api generate: render this model's chat template (Hugging Face id or folder) before sending."),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="Send ignore_eos: every request generates --max-tokens tokens (compare engines on equal output lengths)."),
    expect_model: Optional[str] = typer.Option(None, "--expect-model", help="Model id the server must list on /v1/models (refused otherwise)."),
    steady_requests: Optional[int] = typer.Option(None, "--steady-requests", min=1, help=STEADY_HELP),
    steady_ramp: Optional[int] = typer.Option(None, "--steady-ramp", min=0, help=RAMP_HELP),
) -> None:
    """Measure one running server on one suite at one concurrency and write it as a cell of a sweep folder."""
    from dflash_bench.client.loadgen import LoadSettings
    from dflash_bench.client.protocol import RequestSettings
    from dflash_bench.client.run_command import run_one

    request = RequestSettings(api=api, model=model or "", max_tokens=max_tokens, temperature=temperature,
                              save_token_ids=save_token_ids, enable_thinking=thinking, ignore_eos=ignore_eos,
                              tokenizer=tokenizer)
    load = LoadSettings(concurrency=concurrency, request_rate=request_rate, warmup=warmup, timeout=timeout, seed=seed,
                        transport=transport, steady_requests=steady_requests, steady_ramp=steady_ramp)
    _, summary = run_one(url, suite, request, load, label=label, engine=engine, out=out, name=name, data_dir=data_dir,
                         num_prompts=num_prompts, expect_model=expect_model)
    if summary.status != "complete":  # a failed cell is a failed run, as in `sweep`; so is any failed request
        raise typer.Exit(1)


@app.command()
def report(
    sweep_dirs: list[Path] = typer.Argument(..., metavar="SWEEP_DIR...", help="One or more sweep folders; several are shown side by side."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="The HTML file to write (default: report.html in the first sweep folder); figures/ goes beside it."),
    slo: Optional[str] = typer.Option(None, "--slo", help="Interactivity target to read off at the top, e.g. 'tok_s_user=30,tpot_p90_ms=40' (default: the sweep's --slo)."),
) -> None:
    """Write one self-contained offline HTML report (and figures/*.png) from sweep folders."""
    from dflash_bench.report import build_report

    page = build_report(sweep_dirs, out, slo=slo)
    typer.echo(f"report: {page}")


@app.command()
def migrate(
    sweep_dir: Path = typer.Argument(..., metavar="SWEEP_DIR", help="A sweep folder written by an older dflash-bench."),
) -> None:
    """Rewrite a sweep folder of an older schema version as this version's (report and gate read old folders without it)."""
    from dflash_bench.store import SCHEMA_VERSION
    from dflash_bench.store.lock import writing

    with writing(sweep_dir) as sweep:
        done = sweep.migrate()
    typer.echo(f"{sweep_dir}: " + (f"rewritten as schema version {SCHEMA_VERSION}" if done
                                   else f"already at schema version {SCHEMA_VERSION}, nothing to do"))


@app.command()
def models() -> None:
    """List the known target / DFlash drafter pairs, their block sizes and the engine versions they need."""
    from dflash_bench.models import print_table

    print_table()


@app.command()
def gate(
    sweep_dir: Path = typer.Argument(..., metavar="SWEEP_DIR", help="The sweep folder to gate (or to export with --export-baseline)."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", "-b", help="A sweep folder or a baseline file written by --export-baseline."),
    thresholds: Optional[Path] = typer.Option(None, "--thresholds", help="TOML file of thresholds and bootstrap settings (see examples/gate.toml)."),
    junit: Optional[Path] = typer.Option(None, "--junit", help="Write JUnit XML here: one test case per gated metric and cell."),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="Write a markdown summary here, for a PR comment or $GITHUB_STEP_SUMMARY."),
    export_baseline: bool = typer.Option(False, "--export-baseline", help="Write SWEEP_DIR's cells as a small baseline file (-o) instead of gating."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="With --export-baseline: the baseline file to write."),
    slo: Optional[str] = typer.Option(None, "--slo", help="Also gate DFlash's tok/s and speedup at this interactivity target, e.g. 'tok_s_user=30,tpot_p90_ms=40' (default: the sweep's --slo)."),
    noise_from: Optional[list[Path]] = typer.Option(None, "--noise-from", help="With --export-baseline: other runs of the same plan (sweep folders; give it twice or more); the baseline carries the run-to-run noise measured over them and SWEEP_DIR, which widens the noisy metrics' thresholds."),
) -> None:
    """Gate a sweep against a baseline: exit 0 pass, 1 regression, 2 unusable input."""
    from dflash_bench.gate import main as gate_main

    code = gate_main(sweep_dir, baseline=baseline, export=export_baseline, output=output, thresholds=thresholds,
                     junit=junit, markdown=markdown, slo=slo, noise_from=noise_from or [])
    raise typer.Exit(code)


@app.command()
@declared_options
def sweep(
    settings: Given = Options(SweepSettings),
    out: Path = typer.Option(Path("reports"), "--out", help="Folder that receives the sweep folder."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Sweep folder to finish: complete cells are kept, the rest run."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and the exact server commands; run nothing."),
    data_dir: Optional[Path] = DataDirOption,
    executor: str = typer.Option("local", "--executor", help="local (this machine) or slurm (one job per server group, see README)."),
    slurm: Given = Options(SlurmOptions),
) -> None:
    """Launch paired AR and DFlash servers and measure every suite at every concurrency into one sweep folder."""
    from dflash_bench.sweep.commands import sweep_command

    raise typer.Exit(sweep_command(settings, slurm, out=out, resume=resume, dry_run=dry_run, data_dir=data_dir,
                                   executor=executor))


@app.command("sweep-job", hidden=True)
def sweep_job(
    sweep_dir: Path = typer.Argument(..., help="The shared sweep folder."),
    key: str = typer.Argument(..., help="The job's key (slurm/<key>.json)."),
) -> None:
    """Inside a Slurm job of `sweep --executor slurm`: measure this job's cells on this node."""
    from dflash_bench.sweep.slurm_job import run_job

    raise typer.Exit(run_job(sweep_dir, key))


# Most of the embedded pair's answers to the demo's prompts end by 64 tokens (51-64 a request on average per cell); cut
# at 32, a cell from 8 rows up was mostly its prompts' prefill, the same for both modes (README, "Set up")
DEMO_MAX_TOKENS = 64
# The headline (DFlash / AR at concurrency 1) must repeat on a busy 2-core box: each cell measured 3 times,
# modes alternating, the speedup the median of the repeats' ratios, and c=1 cells of 8 prompts rather than
# 4; concurrency 32 left out to pay for it within 3 minutes (benchmarks/harness/demo_repeats.py measures the spread)
DEMO_REPEATS = 3
DEMO_PROMPTS = 8


@app.command()
def demo(
    out: Path = typer.Option(Path("reports"), "--out", help="Folder that receives the sweep folder and its report."),
    max_tokens: int = typer.Option(DEMO_MAX_TOKENS, "--max-tokens", min=1, help="Output cap per request."),
    num_prompts: int = typer.Option(DEMO_PROMPTS, "--num-prompts", "-n", min=1, help="Prompts per cell (raised to the concurrency where it is higher)."),
    concurrency: Optional[str] = typer.Option(None, "--concurrency", "-c", help="Comma-separated concurrencies (default 1,8)."),
    repeats: int = typer.Option(DEMO_REPEATS, "--repeats", min=1, help="Measure every cell this many times; the speedup is the median, shown with its lowest-highest."),
    data_dir: Optional[Path] = DataDirOption,
) -> None:
    """The main job on the embedded default (the tiny target and DFlash drafter that ship inside the package,
    dflash_bench/assets/default_pair: no download): the builtin engine, AR vs DFlash, every suite, on this machine."""
    from dflash_bench.options import parse_list
    from dflash_bench.sweep.commands import demo_command

    raise typer.Exit(demo_command(out=out, data_dir=data_dir, max_tokens=max_tokens, num_prompts=num_prompts,
                                  concurrency=parse_list(concurrency, int), repeats=repeats))


@app.command()
def quality(
    sweep_dir: Path = typer.Argument(..., help="A sweep folder (from `dflash-bench sweep`)."),
    data_dir: Optional[Path] = DataDirOption,
    score_code: bool = typer.Option(False, "--score-code", help="Run model-written code (HumanEval, MBPP) in the sandbox to score pass@1. Off by default."),
    near_tie: float = typer.Option(0.1, "--near-tie", min=0.0, help="AR top-1 minus top-2 logprob (nats) at or below which a divergence is labelled a near-tie numerical flip."),
    timeout: float = typer.Option(20.0, "--timeout", min=0.1, help="Seconds (wall clock, and CPU) each sandboxed program may run."),
) -> None:
    """Check DFlash against AR in a sweep folder: token-level lossless check at temperature 0 and task accuracy
    (GSM8K, Math500; HumanEval and MBPP with --score-code), with confidence intervals; writes them into the folder."""
    from dflash_bench.quality.check import check_sweep

    check_sweep(sweep_dir, data_dir=data_dir, score_code=score_code, near_tie=near_tie, timeout_s=timeout)


# serve, emulate, launch, stop, doctor, telemetry, engines build, then train-drafter: registered after the
# harness's commands so that `--help` lists those first
from dflash_bench import cli_servers  # noqa: E402, F401
from dflash_bench import cli_train  # noqa: E402, F401


def check_argv(argv: list[str]) -> None:
    """Every argument UTF-8 text, before anything runs: the command line and the folder names are written into
    UTF-8 files (a byte that is not UTF-8 reaches Python as a lone surrogate, which no such file can hold)."""
    from dflash_bench.store.reading import check_text

    for i, arg in enumerate(argv):
        try:
            check_text(arg)
        except ValueError:
            shown = os.fsencode(arg).decode("utf-8", "backslashreplace")
            option = arg.split("=", 1)[0] if arg.startswith("-") and "=" in arg else (
                argv[i - 1] if i and argv[i - 1].startswith("-") else "the argument")
            raise UserError(f"{option} '{shown}' is not UTF-8 text: dflash-bench writes its command line and folder "
                            "names into UTF-8 files; give it in UTF-8 (rename the file or folder)") from None


def main() -> None:
    """Console entry point: user errors become one line on stderr and a non-zero exit, never a traceback."""
    try:
        check_argv(sys.argv[1:])
        app()
    except UserError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
    except OSError as err:  # a path the user gave that cannot be written or read (exit 2: not a gate verdict)
        why = err.strerror or str(err)
        typer.echo(f"error: cannot use {err.filename}: {why}." if err.filename else f"error: {why}.", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
