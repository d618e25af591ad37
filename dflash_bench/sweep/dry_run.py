"""`sweep --dry-run`: the cells in run order and the exact command of every server launch, nothing run."""

from __future__ import annotations

import typer
from rich.markup import escape

from dflash_bench.console import new_console
from dflash_bench.models import ModelPair
from dflash_bench.sweep.plan import SweepSettings, launches, plan_cells, resolve_pair


def print_plan(settings: SweepSettings) -> None:
    """--dry-run: the cells in run order and the exact command of every server launch."""
    from dflash_bench.launch import plan_server
    from dflash_bench.launch.launch_commands import dry_run_line
    from dflash_bench.sweep.fit import server_args
    from dflash_bench.sweep.launch import launch_notes

    pair = resolve_pair(settings)
    plan = plan_cells(settings)
    console = new_console()
    typer.echo(f"{len(plan)} cells, in run order:")
    for i, c in enumerate(plan, 1):
        typer.echo(f"{i:4d}. {c.cell_id}")
    if settings.context_len:
        typer.echo(f"context limit {settings.context_len} tokens (the plan's longest conversation plus the block, "
                   f"rounded up), sized for {settings.gpu}")
    typer.echo(weights_line(pair))
    if not settings.url_ar and settings.port is None:
        typer.echo("ports: each server takes a free port at launch (the commands show the engine's default; --port "
                   "fixes one)")
    if settings.paired:
        typer.echo("paired: each engine's AR and DFlash servers run together (DFlash on a free port)")
    if settings.interleave:
        typer.echo("interleaved: each concurrency-1 cell's AR and DFlash requests alternate, one by one")
    for launch in launches(plan, paired=settings.paired):
        if settings.url_ar:
            url = settings.url_ar if launch.mode == "ar" else settings.url_dflash
            console.print(f"[bold]{launch.engine} {launch.mode}[/] ({len(launch.cells)} cells): measure {escape(url or '')}")
            continue
        profile, _, argv, env, port = plan_server(launch.engine, pair, launch.mode, port=settings.port, preset=settings.gpu,
                                                  extra_args=server_args(settings, launch.engine, pair, launch.mode),
                                                  runner=settings.runner,
                                                  synthetic=launch.synthetic, cache_reset=True)
        line = dry_run_line(profile, argv, env, port, settings.runner, settings.image or profile.image_for(settings.gpu), "all", "host")
        drawn = f", {launch.synthetic.label()}" if launch.synthetic is not None and launch.mode != "ar" else ""
        console.print(f"[bold]{launch.engine} {launch.mode}[/] ({len(launch.cells)} cells{escape(drawn)}):")
        typer.echo(line)
        version = profile.version(settings.runner, settings.image)
        why = profile.refusal(pair, launch.mode, version)
        if why:
            typer.echo(f"  refused before launch: {why}")
        else:
            for note in launch_notes(settings, pair, launch.engine, launch.mode, version):
                typer.echo(f"  note: {note}")


def weights_line(pair: ModelPair) -> str:
    """The target's (and the drafter's) weights as the configs give them, a mixture's share a token reads."""
    from dflash_bench.model_shapes import pair_configs
    from dflash_bench.geometry import describe, geometry

    target_cfg, drafter_cfg = pair_configs(pair)
    target = geometry(target_cfg)
    if target is None:
        return "weights: not known from the configs here (no config.json, or a model the formulas do not cover)"
    line = f"target: {describe(target)}"
    drafter = geometry(drafter_cfg, drafter=True) if drafter_cfg else None
    if drafter is not None:
        line += f"; drafter: {describe(drafter)}"
    return line
