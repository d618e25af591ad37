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
