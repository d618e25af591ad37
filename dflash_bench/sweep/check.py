"""The one check of a sweep before anything launches (no folder, job or server exists yet): what `sweep`, `demo`, a
resume and `--executor slurm` all pass through, in this order:

1. each option's declared range and rule (settings.py, options.check_fields), and the Slurm options' with them;
2. the names an option gives, against who knows them: the engines (profiles), the GPU preset, the suites, the
   `--slo` grammar (slo.py), a model or drafter folder that must be on this machine (models.check_local);
3. the rules between options (both URLs or neither, --interleave with --paired, ...), the client's own rules for
   the load the plan sends (client/cell.py check_steady, client/interleave.py check_interleave: the ones `run`
   applies to one cell), and what the executor cannot run;
4. the plan against its GPUs (fit.py: the context limit derived, a plan that cannot fit refused, each engine's
   flags for it).

What comes out is the settings every later phase takes as they are: plan.py plans them without checking again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dflash_bench.errors import UserError
from dflash_bench.options import check_fields, flags, listed
from dflash_bench.settings import SlurmOptions, SweepSettings, gpu_types

EXECUTORS = ("local", "slurm")


def check_plan(values: dict[str, Any], *, data_dir: Path | None, dry_run: bool = False, executor: str = "local",
               slurm: dict[str, Any] | None = None, resume: Path | None = None) -> SweepSettings:
    """`values` (the options given over a resumed sweep's settings or a new one's starts) checked, completed and
    sized; `slurm`: the Slurm options given. A UserError in one sentence for the first thing that cannot run."""
    settings = checked(values, executor=executor, slurm=slurm or {}, resume=resume)
    return sized(settings, data_dir, dry_run)


def checked(values: dict[str, Any], *, executor: str = "local", slurm: dict[str, Any] | None = None,
            resume: Path | None = None) -> SweepSettings:
    """Steps 1-3: the settings, complete (the runner, the suites by name), or the sentence refusing them."""
    from pydantic import ValidationError

    from dflash_bench import profiles

    _check_executor_options(executor, slurm or {}, resume)
    check_fields(SweepSettings, values)
    profiles.check_preset(values.get("gpu"))  # a bad --gpu stops the sweep before any folder or server
    values = dict(values)
    if values.get("runner") is None:  # not given: process where every engine runs as one, else docker
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
    _check_between(settings)
    _check_secrets(settings, executor)
    _check_load(settings)
    if executor == "slurm":
        _check_slurm(settings)
    return settings


def resolve_suites(suites: list[str]) -> list[str]:
    """["all"] -> every suite but speed-bench (which needs a prepared copy: asked for by name); other names checked."""
    from dflash_bench.suites import get_suite, list_suites

    if suites == ["all"]:
        return [s.name for s in list_suites() if s.name != "speed-bench"]
    for name in suites:
        get_suite(name)
    return suites


def _check_executor_options(executor: str, slurm: dict[str, Any], resume: Path | None) -> None:
    if executor not in EXECUTORS:
        raise UserError(f"--executor is local or slurm, not {executor!r}")
    if executor == "local" and slurm:
        shown = listed([flag.names[0] for _, flag in flags(SlurmOptions) if not flag.hidden])
        raise UserError(f"{shown} need --executor slurm")
    check_fields(SlurmOptions, slurm)
    if resume is not None and len(gpu_types(slurm.get("gpu_type"))) > 1:
        raise UserError("--resume takes one sweep folder: resume each GPU type's folder with its own --gpu-type")


def _check_between(settings: SweepSettings) -> None:
    """The rules between options, and the local paths the launched servers need."""
    if not settings.suites and not settings.input_lens:
        raise UserError("no suites to run; pass --suites all or a comma-separated list")
    if bool(settings.url_ar) != bool(settings.url_dflash):
        raise UserError("give both --url-ar and --url-dflash to measure servers you already run, or neither")
    if settings.url_ar and len(settings.engines) != 1:
        raise UserError("with --url-ar/--url-dflash, name the one engine those servers run with --engine")
    _check_modes(settings)
    if not settings.url_ar:  # the servers are launched here: a local model path must be here (else: the servers')
        from dflash_bench.models import check_local

        check_local(settings.model)
        check_local(settings.engine_options.get("drafter"), "--drafter")
    if settings.interleave and not settings.paired:
        raise UserError("--interleave alternates the requests of a cell's AR and DFlash servers, so both must be up "
                        "together: add --paired")
    if settings.synthetic_acceptance is not None:
        _check_synthetic(settings)
    if settings.api is not None:
        _check_api(settings)


def _check_api(settings: SweepSettings) -> None:
    """--api: refused for an engine whose requests use an API of its own (SGLang's /generate)."""
    from dflash_bench import profiles

    for engine in settings.engines:
        if why := profiles.get(engine).api_refusal(settings.api):
            raise UserError(why)


def _check_synthetic(settings: SweepSettings) -> None:
    """--synthetic-acceptance: refused for servers the sweep does not launch and for an engine that cannot draw it;
    `card` for a pair whose card publishes no tau (synthetic.py, through the plan's profiles)."""
    from dflash_bench import profiles
    from dflash_bench.sweep.plan import long_suite, synthetic_profiles

    if settings.url_ar or settings.url_dflash:
        raise UserError("--synthetic-acceptance is given to the DFlash servers the sweep launches; servers given by "
                        "--url-ar/--url-dflash run with their own flags: drop one or the other")
    for engine in settings.engines:
        if why := profiles.get(engine).synthetic_refusal(settings.engine_args):
            raise UserError(why)
    synthetic_profiles(settings, [*settings.suites, *map(long_suite, settings.input_lens)])


def _check_modes(settings: SweepSettings) -> None:
    from dflash_bench.profiles.base import MODES

    modes = settings.modes
    if not modes or len(set(modes)) != len(modes) or any(m not in MODES for m in modes):
        raise UserError(f"--modes takes distinct modes of {', '.join(MODES)}, comma-separated, e.g. ar,dflash,eagle3; "
                        f"not {','.join(modes) or 'nothing'}")
    if list(modes) != ["ar", "dflash"] and (settings.paired or settings.url_ar):
        raise UserError("--paired, --interleave and --url-ar/--url-dflash compare an AR and a DFlash server: "
                        "leave --modes at ar,dflash with them")


def _check_secrets(settings: SweepSettings, executor: str) -> None:
    """An --engine-arg that carries a secret would be written into the sweep folder (the manifest, a job's file)."""
    from dflash_bench.store.provenance import redact

    if redact(settings.engine_args) == settings.engine_args:
        return
    if executor == "slurm":
        raise UserError("an --engine-arg carries a secret (a token, key or password); pass it through the "
                        "environment instead (HF_TOKEN, VLLM_API_KEY, ...): jobs inherit it, the sweep folder never sees it")
    raise UserError("an --engine-arg carries a secret (a token, key or password); pass it through the "
                    "environment instead (HF_TOKEN, VLLM_API_KEY, ...) so it is never written to the sweep folder")


def _check_load(settings: SweepSettings) -> None:
    """The client's own rules (those `run` applies to its one cell) for the load of the plan's cells."""
    from dflash_bench.client.loadgen import LoadSettings

    if settings.interleave:  # the options it cannot take: on a concurrency-1 cell
        from dflash_bench.client.interleave import check_interleave

        check_interleave(LoadSettings(concurrency=1, steady_requests=settings.steady_requests,
                                      min_seconds=settings.min_cell_seconds))
    if settings.steady_requests is not None or settings.steady_ramp is not None:
        from dflash_bench.client.cell import check_steady

        # the largest concurrency of the plan: a window shorter than it is refused before any folder or server
        check_steady(LoadSettings(concurrency=max(settings.concurrency, default=1),
                                  steady_requests=settings.steady_requests, steady_ramp=settings.steady_ramp,
                                  min_seconds=settings.min_cell_seconds))


def _check_slurm(settings: SweepSettings) -> None:
    """What one job per server on the cluster's nodes cannot run."""
    if settings.url_ar:
        raise UserError("--executor slurm launches its servers on the cluster's nodes; drop --url-ar/--url-dflash")
    if settings.paired:
        raise UserError("--paired runs both servers of an engine on one machine at once; --executor slurm runs one "
                        "job per server: drop --paired")


def sized(settings: SweepSettings, data_dir: Path | None, dry_run: bool = False) -> SweepSettings:
    """Step 4: the plan sized for its GPU (fit.py): a context limit derived, a plan that cannot fit refused, and a
    DFlash server whose token budget its drafting slots use up refused. A dry run whose prompts cannot be read says
    so and prints the plan unsized."""
    import typer

    from dflash_bench.sweep.fit import PromptsUnavailable, runs_dflash, server_args, size, verify_budget
    from dflash_bench.sweep.plan import resolve_pair

    pair = resolve_pair(settings)
    try:
        out = size(settings, pair, data_dir)
    except PromptsUnavailable as err:
        if not dry_run:
            raise
        typer.echo(f"context limit not derived (it needs the plan's prompts): {err}")
        out = settings
    if not out.url_ar:  # what an engine cannot take (--tensor-parallel-size on a one-GPU engine): before any folder
        for engine in out.engines:
            server_args(out, engine)
            if "dflash" in out.modes and runs_dflash(engine, pair, out):
                refusal, _ = verify_budget(out, pair, engine, "dflash")
                if refusal:
                    raise UserError(refusal)
    return out
