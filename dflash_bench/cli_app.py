"""The Typer app every command registers on, its sub-apps, and the options several commands share.

Kept apart from the commands so that `cli.py` (the harness: sweep, run, report, gate, ...) and
`cli_servers.py` (what starts or builds servers: serve, emulate, launch, ...) and `cli_train.py` (train-drafter) register on it without
importing each other.
"""

from __future__ import annotations

from typing import Any, Optional

import typer
import typer.core

from dflash_bench import __version__

# Typer's rich help names each option's type through TyperOption.display_type_rich, which only some Typer
# releases have (a GPU host's engine bundle can bring an older one): patch it where it exists, else keep
# that Typer's own help.
_display_type = getattr(typer.core.TyperOption, "display_type_rich", None)


def _display_type_unless_flag(option: typer.core.TyperOption, ctx: Any) -> Optional[str]:
    """A flag (--help, --version, --dry-run) takes no value, so `--help` shows no type beside it (Typer's
    rich help would print `<bool>`); every other option keeps its type."""
    assert _display_type is not None
    return None if option.is_flag else _display_type(option, ctx)


if _display_type is not None:
    typer.core.TyperOption.display_type_rich = _display_type_unless_flag  # type: ignore[method-assign,assignment]

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
