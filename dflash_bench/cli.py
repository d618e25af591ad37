"""The `dflash-bench` command line. Thin: parse options, call one function per command.

Imports of heavy modules (pandas, torch, docker, ...) happen inside the commands so that
`dflash-bench --help` stays fast and a missing optional extra only affects the command that needs it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from dflash_bench import __version__
from dflash_bench.errors import UserError

app = typer.Typer(
    name="dflash-bench",
    help="Measure how much DFlash speculative decoding speeds up LLM serving on your GPUs, and what it costs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
suites_app = typer.Typer(help="List and inspect the benchmark suites.", no_args_is_help=True)
app.add_typer(suites_app, name="suites")

DataDirOption = typer.Option(
    None,
    "--data-dir",
    envvar="DFLASH_BENCH_DATA",
    help="Folder with offline copies of the datasets (upstream file formats). Default: load from the Hugging Face hub.",
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"dflash-bench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True, help="Print the version and exit."),
) -> None:
    """Measure how much DFlash speculative decoding speeds up LLM serving on your GPUs, and what it costs."""


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
def models() -> None:
    """List the known target / DFlash drafter pairs, their block sizes and the engine versions they need."""
    from dflash_bench.models import print_table

    print_table()


@app.command()
def launch(
    engine: str = typer.Option("vllm", "--engine", "-e", help="vllm, sglang or builtin."),
    model: str = typer.Option(..., "--model", "-m", help="A known short name (see `dflash-bench models`) or a Hugging Face id / folder."),
    mode: str = typer.Option("dflash", "--mode", help="ar (plain decoding) or dflash (speculative)."),
    gpu: str = typer.Option("generic", "--gpu", help="GPU preset for engine flags: generic, h100 (Hopper), b300 (Blackwell)."),
    runner: str = typer.Option("docker", "--runner", help="docker (engine image) or process (engine installed here)."),
    port: Optional[int] = typer.Option(None, "--port", help="Port to serve on (default: the engine's own)."),
    image: Optional[str] = typer.Option(None, "--image", help="Container image (default: the engine's pinned image)."),
    gpus: str = typer.Option("all", "--gpus", help="GPUs for the container: all, a list like 0,1, or none."),
    drafter: Optional[str] = typer.Option(None, "--drafter", help="DFlash drafter id or folder (overrides the known pair's)."),
    engine_arg: Optional[list[str]] = typer.Option(None, "--engine-arg", help="Extra server flag, passed through as is (repeatable; use --engine-arg=--flag)."),
    network: str = typer.Option("host", "--network", help="host (container shares the host network) or bridge (port mapped on 127.0.0.1)."),
    ready_timeout: float = typer.Option(1800.0, "--ready-timeout", help="Seconds to wait for the server's readiness endpoint."),
    log: Optional[str] = typer.Option(None, "--log", help="Write the server's log here (default: a temporary file)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the exact docker or process command and exit."),
) -> None:
    """Start one AR or DFlash server, print its URL and keep it up until Ctrl-C."""
    from dflash_bench.launch.commands import run_launch

    run_launch(engine, model, mode, gpu=gpu, runner=runner, port=port, image=image, gpus=gpus, drafter=drafter,
               engine_args=engine_arg or [], network=network, dry_run=dry_run, ready_timeout=ready_timeout,
               log_path=log)


@app.command()
def stop(
    all_: bool = typer.Option(False, "--all", help="Also stop servers whose harness is still running."),
    sweep: Optional[str] = typer.Option(None, "--sweep", help="Only this sweep's containers (running harness or not)."),
) -> None:
    """Remove leftover dflash-bench servers (containers by label, local process groups)."""
    from dflash_bench.launch.commands import run_stop

    run_stop(all_, sweep)


@app.command()
def doctor() -> None:
    """Check GPUs and driver, the docker daemon, engine images, HF_TOKEN and disk: one yes/no line each."""
    from dflash_bench.launch.doctor import run_doctor

    run_doctor()


@app.command()
def report(
    sweep_dirs: list[Path] = typer.Argument(..., metavar="SWEEP_DIR...", help="One or more sweep folders; several are shown side by side."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="The HTML file to write (default: report.html in the first sweep folder); figures/ goes beside it."),
) -> None:
    """Write one self-contained offline HTML report (and figures/*.png) from sweep folders."""
    from dflash_bench.report import build_report

    page = build_report(sweep_dirs, out)
    typer.echo(f"report: {page}")


@app.command()
def telemetry(
    gpus: Optional[str] = typer.Option(None, "--gpus", help="GPUs to check, e.g. 0,1 (indices into CUDA_VISIBLE_DEVICES). Default: all."),
    seconds: float = typer.Option(0.0, "--seconds", help="Also sample for this long and print power and energy (0: only list the GPUs)."),
    interval: float = typer.Option(0.1, "--interval", help="Seconds between samples (0.1 = 10 Hz, as in a sweep)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the samples here as CSV (telemetry.csv's format)."),
) -> None:
    """Check GPU telemetry (NVML): list the GPUs, optionally sample them; exit 1 when telemetry is off."""
    from dflash_bench.telemetry.check import run_check

    raise typer.Exit(run_check(gpus, seconds, interval, out))


def main() -> None:
    """Console entry point: user errors become one line on stderr and a non-zero exit, never a traceback."""
    try:
        app()
    except UserError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
