"""The `sweep` and `demo` commands: the options given in, a SweepSettings, a run, an exit code out."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from dflash_bench.console import new_console
from dflash_bench.errors import UserError
from dflash_bench.options import check_fields, flags, listed, starts
from dflash_bench.settings import SlurmOptions
from dflash_bench.store import SweepDir
from dflash_bench.sweep.dry_run import print_plan
from dflash_bench.sweep.plan import SweepSettings, plan_cells, resolve_pair

DEMO_CONCURRENCY = [1, 8]
DEMO_ENGINE_ARGS = ["--fast", "--cut-draft", "--device", "cpu"]


def sweep_command(given: dict[str, Any], slurm_given: dict[str, Any], *, out: Path, resume: Path | None,
                  dry_run: bool, data_dir: Path | None, executor: str = "local") -> int:
    """The settings and Slurm options given on the command line (by field name, only those given) -> run or print
    the sweep; the exit code."""
    if resume is not None and executor == "local" and not dry_run:
        from dflash_bench.sweep.slurm_run import refuse_local_resume

        refuse_local_resume(Path(resume))
    settings = _settings(given, resume)
    settings = _sized(settings, data_dir, dry_run)
    if executor not in ("local", "slurm"):
        raise UserError(f"--executor is local or slurm, not {executor!r}")
    if executor == "local" and slurm_given:
        shown = listed([flag.names[0] for _, flag in flags(SlurmOptions) if not flag.hidden])
        raise UserError(f"{shown} need --executor slurm")
    if executor == "slurm":
        from dflash_bench.sweep.slurm_run import slurm_command

        return slurm_command(settings, SlurmOptions(**slurm_given), preset_given="gpu" in given, out=out,
                             resume=resume, dry_run=dry_run, data_dir=data_dir, argv=sys.argv, image=settings.image)
    if dry_run:
        print_plan(settings, settings.image)
        return 0
    from dflash_bench.sweep.run import run_sweep

    result = run_sweep(settings, out=out, resume=resume, data_dir=data_dir, argv=sys.argv, image=settings.image)
    return result.exit_code


def _sized(settings: SweepSettings, data_dir: Path | None, dry_run: bool = False) -> SweepSettings:
    """The plan sized for its GPU (sweep/fit.py): a context limit derived, a plan that cannot fit refused. A dry
    run whose prompts cannot be read says so and prints the plan unsized."""
    from dflash_bench.sweep.fit import PromptsUnavailable, server_args, size

    try:
        sized = size(settings, resolve_pair(settings), data_dir)
    except PromptsUnavailable as err:
        if not dry_run:
            raise
        typer.echo(f"context limit not derived (it needs the plan's prompts): {err}")
        sized = settings
    if not sized.url_ar:  # what an engine cannot take (--tensor-parallel-size on a one-GPU engine): before any folder
        for engine in sized.engines:
            server_args(sized, engine)
    return sized


def _settings(given: dict[str, Any], resume: Path | None) -> SweepSettings:
    """The given options over the resumed sweep's own settings (every option not given again is the sweep's), or
    over the declared defaults for a new sweep."""
    if resume is not None:
        from dflash_bench.sweep.folder import check_has_plan

        saved = check_has_plan(SweepDir.open(resume).read_manifest(), resume)
        return _validated({**saved.model_dump(), **given})
    if "model" not in given:
        raise UserError("pass --model (a short name from `dflash-bench models`, a Hugging Face id or a folder)")
    return _validated({**starts(SweepSettings), **given})


def _validated(values: dict[str, Any]) -> SweepSettings:
    from pydantic import ValidationError

    from dflash_bench import profiles

    check_fields(SweepSettings, values)  # each option's declared range and rule (settings.py)
    profiles.check_preset(values.get("gpu"))  # a bad --gpu stops the sweep before any folder or server
    if values.get("runner") is None:
        engines = values.get("engines") or ["builtin"]
        values["runner"] = "process" if all(profiles.get(e).runner == "process" for e in engines) else "docker"
    if values.get("slo") is not None:
        from dflash_bench.slo import parse_slo

        parse_slo(values["slo"])  # a bad target stops the sweep before any server starts
    try:
        settings = SweepSettings(**values)
    except ValidationError as err:
        e = err.errors()[0]
        raise UserError(f"bad sweep setting {'.'.join(map(str, e['loc']))}: {e['msg']}") from None
    settings = settings.model_copy(update={"suites": resolve_suites(settings.suites)})
    plan_cells(settings)  # the plan's own checks (--concurrency, --repeats, ...), before any prompt set loads
    if settings.interleave and not settings.paired:
        raise UserError("--interleave alternates the requests of a cell's AR and DFlash servers, so both must be up "
                        "together: add --paired")
    if settings.interleave:  # the options it cannot take: the client's own check, on a concurrency-1 cell
        from dflash_bench.client.interleave import check_interleave
        from dflash_bench.client.loadgen import LoadSettings

        check_interleave(LoadSettings(concurrency=1, steady_requests=settings.steady_requests,
                                      min_seconds=settings.min_cell_seconds or 0.0))
    if settings.steady_requests is not None or settings.steady_ramp is not None:
        from dflash_bench.client.cell import check_steady
        from dflash_bench.client.loadgen import LoadSettings

        # the largest concurrency of the plan: a window shorter than it is refused before any folder or server
        check_steady(LoadSettings(concurrency=max(settings.concurrency, default=1),
                                  steady_requests=settings.steady_requests, steady_ramp=settings.steady_ramp,
                                  min_seconds=settings.min_cell_seconds or 0.0))
    return settings


def resolve_suites(suites: list[str]) -> list[str]:
    """["all"] -> every suite but speed-bench (which needs a prepared copy: asked for by name); other names checked."""
    from dflash_bench.suites import get_suite, list_suites

    if suites == ["all"]:
        return [s.name for s in list_suites() if s.name != "speed-bench"]
    for name in suites:
        get_suite(name)
    return suites


# ------------------------------------------------------------------ demo


def demo_command(*, out: Path, data_dir: Path | None, max_tokens: int, num_prompts: int,
                 concurrency: list[int] | None, repeats: int = 1) -> int:
    """The builtin engine on the embedded default pair, every suite, concurrency 1 and 8, each cell `repeats`
    times; then the report.

    The fast path (`serve --fast`: the C kernels on a CPU, greedy as the demo asks), drafting only the
    positions a step verifies (`--cut-draft`: the embedded drafter was trained on cut blocks). Paired: both
    servers up together and each cell measured AR then DFlash, since a small machine's speed moves within a
    minute (a 2-core box: the same AR cell 172-193 tok/s, then 246-265 a minute later); interleaved at
    concurrency 1, since it also moves within seconds (client/interleave.py; the spread left:
    benchmarks/results/demo_cpu_repeats.json)."""
    from dflash_bench.launch import free_port
    from dflash_bench.report import build_report
    from dflash_bench.sweep.run import run_sweep

    from dflash_bench.suites import list_suites

    target, drafter, note = default_pair(out)
    # the options are checked (the sweep's own checks, over every suite) before any prompt set loads
    settings = _validated(dict(model=str(target), engines=["builtin"], suites=[s.name for s in list_suites()],
                               concurrency=DEMO_CONCURRENCY if concurrency is None else concurrency,
                               num_prompts=num_prompts, max_tokens=max_tokens, runner="process", port=free_port(),
                               engine_args=DEMO_ENGINE_ARGS, engine_options={"drafter": str(drafter)},
                               save_token_ids=True, paired=True, interleave=True, repeats=repeats))
    console = new_console(stderr=True)
    console.print(f"demo pair: {note}")
    settings = settings.model_copy(update={"suites": _demo_suites(data_dir, console)})
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
    from dflash_bench.suites import check_hub, list_suites, load_prompts

    if data_dir is None:
        check_hub()  # offline: one sentence in seconds, not one per suite after the hub's retries
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

