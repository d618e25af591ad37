"""The Typer app every command registers on, its sub-apps, and the options several commands share.

Kept apart from the commands so that `cli.py` (the harness: sweep, run, report, gate, ...) and
`cli_servers.py` (what starts or builds servers: serve, emulate, launch, ...) both register on it without
importing each other.
"""

from __future__ import annotations

import typer

from dflash_bench import __version__

app = typer.Typer(
    name="dflash-bench",
    help="Measure how much DFlash speculative decoding speeds up LLM serving on your GPUs, and what it costs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
suites_app = typer.Typer(help="List and inspect the benchmark suites.", no_args_is_help=True)
app.add_typer(suites_app, name="suites")
engines_app = typer.Typer(help="Get third-party engines onto this machine.", no_args_is_help=True)
app.add_typer(engines_app, name="engines")

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
