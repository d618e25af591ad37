"""The `sweep` and `demo` commands: options in, a SweepSettings, a run, an exit code out."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from dflash_bench.errors import UserError
from dflash_bench.store import SweepDir
from dflash_bench.sweep.plan import SweepSettings, launches, plan_cells

DEMO_CONCURRENCY = [1, 8, 32]


def sweep_command(options: dict[str, Any], *, out: Path, resume: Path | None, dry_run: bool,
                  data_dir: Path | None, image: str | None) -> int:
    """Options given on the command line (None = not given) -> run or print the sweep; the exit code."""
    settings = _settings(options, resume)
    if dry_run:
        print_plan(settings, image)
        return 0
    from dflash_bench.sweep.run import run_sweep

    result = run_sweep(settings, out=out, resume=resume, data_dir=data_dir, argv=sys.argv, image=image)
    return result.exit_code


def _settings(options: dict[str, Any], resume: Path | None) -> SweepSettings:
    given = {k: v for k, v in options.items() if v is not None and v != []}
    if resume is not None:
        saved = SweepDir.open(resume).read_manifest().settings
        merged = {**saved, **given}
        return _validated(merged)
    if "model" not in given:
        raise UserError("pass --model (a short name from `dflash-bench models`, a Hugging Face id or a folder)")
    return _validated(given)


def _validated(values: dict[str, Any]) -> SweepSettings:
    from pydantic import ValidationError

    from dflash_bench import profiles

    if values.get("runner") is None:
        engines = values.get("engines") or ["builtin"]
        values["runner"] = "process" if all(profiles.get(e).runner == "process" for e in engines) else "docker"
    try:
        return SweepSettings(**values)
    except ValidationError as err:
        e = err.errors()[0]
        raise UserError(f"bad sweep setting {'.'.join(map(str, e['loc']))}: {e['msg']}") from None


def parse_list(value: str | None, kind=str) -> list | None:
    """'1,8,32' -> [1, 8, 32]; None stays None; a bad item is a UserError."""
    if value is None:
        return None
    try:
        return [kind(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"cannot read {value!r} as a comma-separated list of {kind.__name__}s") from None


def resolve_suites(value: str | None) -> list[str] | None:
    from dflash_bench.suites import get_suite, list_suites

    if value is None:
        return None
    if value.strip() == "all":
        return [s.name for s in list_suites() if s.name != "speed-bench"]  # needs a prepared copy: ask for it by name
    names = parse_list(value)
    for name in names:
        get_suite(name)
    return names


def print_plan(settings: SweepSettings, image: str | None) -> None:
    """--dry-run: the cells in run order and the exact command of every server launch."""
    from dflash_bench import models
    from dflash_bench.launch import plan_server
    from dflash_bench.launch.commands import dry_run_line

    pair = models.resolve(settings.model, drafter=settings.engine_options.get("drafter"))
    plan = plan_cells(settings)
    console = Console()
    typer.echo(f"{len(plan)} cells, in run order:")
    for i, c in enumerate(plan, 1):
        typer.echo(f"{i:4d}. {c.cell_id}")
    for launch in launches(plan):
        if settings.url_ar:
            url = settings.url_ar if launch.mode == "ar" else settings.url_dflash
            console.print(f"[bold]{launch.engine} {launch.mode}[/] ({len(launch.cells)} cells): measure {escape(url)}")
            continue
        profile, _, argv, env, port = plan_server(launch.engine, pair, launch.mode, port=settings.port, preset=settings.gpu,
                                                  extra_args=settings.engine_args, runner=settings.runner)
        line = dry_run_line(profile, argv, env, port, settings.runner, image or profile.image_for(settings.gpu), "all", "host")
        console.print(f"[bold]{launch.engine} {launch.mode}[/] ({len(launch.cells)} cells):")
        typer.echo(line)


# ------------------------------------------------------------------ demo


def demo_command(*, out: Path, data_dir: Path | None, max_tokens: int, num_prompts: int,
                 concurrency: list[int] | None) -> int:
    """The builtin engine on the embedded default pair, every suite, concurrency 1, 8, 32; then the report."""
    from dflash_bench.launch import free_port
    from dflash_bench.report import build_report
    from dflash_bench.sweep.run import run_sweep

    target, drafter, note = default_pair(out)
    console = Console(stderr=True)
    console.print(f"demo pair: {note}")
    suites = _demo_suites(data_dir, console)
    settings = SweepSettings(model=str(target), engines=["builtin"], suites=suites,
                             concurrency=concurrency or DEMO_CONCURRENCY, num_prompts=num_prompts,
                             max_tokens=max_tokens, runner="process", port=free_port(), engine_args=["--device", "cpu"],
                             engine_options={"drafter": str(drafter)}, save_token_ids=True)
    result = run_sweep(settings, out=out, data_dir=data_dir, argv=sys.argv)
    typer.echo(f"report: {build_report([result.path])}")
    return result.exit_code


def default_pair(out: Path) -> tuple[Path, Path, str]:
    """The embedded default pair shipped with the package, else a tiny random pair made on the spot."""
    assets = Path(__file__).resolve().parents[1] / "assets" / "default_pair"
    if (assets / "target" / "config.json").exists() and (assets / "drafter" / "config.json").exists():
        return assets / "target", assets / "drafter", f"the embedded default ({assets})"
    from dflash_bench.engine.tiny import make_tiny_pair

    where = Path(out) / ".demo-pair"
    if not (where / "target" / "config.json").exists():
        make_tiny_pair(where)
    return where / "target", where / "drafter", f"tiny random weights in {where} (no trained pair shipped): expect tau near 1"


def _demo_suites(data_dir: Path | None, console: Console) -> list[str]:
    from dflash_bench.suites import list_suites, load_prompts

    names = []
    for suite in list_suites():
        try:
            load_prompts(suite.name, data_dir=data_dir, num_prompts=1)
        except UserError as err:
            console.print(f"skipping {suite.name}: {escape(str(err))}")
            continue
        names.append(suite.name)
    if not names:
        raise UserError("no suite could be loaded: pass --data-dir with the offline datasets, or allow hub access")
    return names

