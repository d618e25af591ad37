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
from dflash_bench.options import starts
from dflash_bench.settings import SlurmOptions, SweepSettings
from dflash_bench.store import SweepDir
from dflash_bench.sweep.check import check_plan
from dflash_bench.sweep.dry_run import print_plan

DEMO_CONCURRENCY = [1, 8]
# one fixed verify width, so that the demo's tau is a property of the code (the same every run at temperature 0) and
# a baseline gates it (docs/acceptance.md); 8 of the block's 16 led at both concurrencies (docs/results/demo.md)
DEMO_VERIFY_WIDTH = 8
DEMO_ENGINE_ARGS = ["--fast", "--cut-draft", "--verify-width", str(DEMO_VERIFY_WIDTH), "--device", "cpu"]


def sweep_command(given: dict[str, Any], slurm_given: dict[str, Any], *, out: Path, resume: Path | None,
                  dry_run: bool, data_dir: Path | None, executor: str = "local") -> int:
    """The settings and Slurm options given on the command line (by field name, only those given) -> checked
    (sweep/check.py), then run or printed; the exit code."""
    if resume is not None and executor == "local" and not dry_run:
        from dflash_bench.sweep.slurm_run import refuse_local_resume

        refuse_local_resume(Path(resume))
    settings = check_plan(_values(given, resume), data_dir=data_dir, dry_run=dry_run, executor=executor,
                          slurm=slurm_given, resume=resume)
    if executor == "slurm":
        from dflash_bench.sweep.slurm_run import slurm_command

        return slurm_command(settings, SlurmOptions(**slurm_given), preset_given="gpu" in given, out=out,
                             resume=resume, dry_run=dry_run, data_dir=data_dir, argv=sys.argv)
    if dry_run:
        print_plan(settings)
        return 0
    from dflash_bench.sweep.run import run_sweep

    result = run_sweep(settings, out=out, resume=resume, data_dir=data_dir, argv=sys.argv)
    return result.exit_code


def _values(given: dict[str, Any], resume: Path | None) -> dict[str, Any]:
    """The given options over the resumed sweep's own settings (every option not given again is the sweep's), or
    over what a new sweep starts from (settings.py: the declared defaults, Flag.start)."""
    if resume is not None:
        from dflash_bench.sweep.folder import check_has_plan

        saved = check_has_plan(SweepDir.open(resume).read_manifest(), resume)
        return {**saved.model_dump(), **given}
    if "model" not in given:
        raise UserError("pass --model (a short name from `dflash-bench models`, a Hugging Face id or a folder)")
    return {**starts(SweepSettings), **given}


# ------------------------------------------------------------------ demo


def demo_command(*, out: Path, data_dir: Path | None, max_tokens: int, num_prompts: int,
                 concurrency: list[int] | None, repeats: int = 1) -> int:
    """The builtin engine on the embedded default pair, every suite, concurrency 1 and 8, each cell `repeats`
    times; then the report.

    The fast path (`serve --fast`: the C kernels on a CPU, greedy as the demo asks), verifying a fixed width
    (DEMO_VERIFY_WIDTH: under widths chosen by load tau would follow the machine's load) and drafting only the
    positions a step verifies (`--cut-draft`: the embedded drafter was trained on cut blocks). Paired: both
    servers up together and each cell measured AR then DFlash, since a small machine's speed moves within a
    minute (a 2-core box: the same AR cell 172-193 tok/s, then 246-265 a minute later); interleaved at
    concurrency 1, since it also moves within seconds (client/interleave.py; the spread left:
    benchmarks/results/demo_cpu_repeats.json)."""
    from dflash_bench.report import build_report
    from dflash_bench.sweep.run import run_sweep

    from dflash_bench.suites import list_suites

    target, drafter, note = default_pair(out)
    # the options are checked (the sweep's own checks, over every suite) before any prompt set loads
    settings = check_plan(dict(model=str(target), engines=["builtin"], suites=[s.name for s in list_suites()],
                               concurrency=DEMO_CONCURRENCY if concurrency is None else concurrency,
                               num_prompts=num_prompts, max_tokens=max_tokens, runner="process",
                               engine_args=DEMO_ENGINE_ARGS, engine_options={"drafter": str(drafter)},
                               save_token_ids=True, paired=True, interleave=True, repeats=repeats), data_dir=data_dir)
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
    from dflash_bench.testing.tiny import make_tiny_pair

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

