"""The `launch` and `stop` commands."""

from __future__ import annotations

import re

import typer

from dflash_bench.errors import UserError
from dflash_bench.models import ModelPair
from dflash_bench.profiles.base import EngineProfile


def run_launch(engine: str, model: str, mode: str, *, gpu: str = "generic", runner: str = "docker",
               port: int | None = None, image: str | None = None, gpus: str = "all", drafter: str | None = None,
               engine_args: list[str] | None = None, network: str = "host", dry_run: bool = False,
               ready_timeout: float = 1800.0, log_path: str | None = None) -> None:
    """Start one server and keep it up until Ctrl-C (or print its command with dry_run)."""
    from dflash_bench import models
    from dflash_bench.launch import DockerOptions, launch_server, plan_server
    from dflash_bench.profiles.base import check_preset

    if network not in ("host", "bridge"):
        raise UserError(f"unknown network {network!r}: use host or bridge.")
    if gpus not in ("all", "none") and not all(re.fullmatch(r"\d+|(GPU|MIG)-[\w-]+", g.strip()) for g in gpus.split(",")):
        raise UserError(f"--gpus {gpus!r} is not all, none or a comma-separated list of GPU indices or UUIDs.")
    models.check_local(model)
    models.check_local(drafter, "--drafter")
    pair = models.resolve(model, drafter=drafter)
    profile, pair, argv, env, port = plan_server(engine, pair, mode, port=port, preset=gpu,
                                                 extra_args=engine_args or [], runner=runner, network=network)
    _warn_versions(profile, pair, image)
    if dry_run:
        typer.echo(dry_run_line(profile, argv, env, port, runner, image or profile.image_for(check_preset(gpu)), gpus,
                                network))
        return
    opts = None
    if runner == "docker":
        img = image or profile.image_for(check_preset(gpu))
        if not img:
            raise UserError(f"the {profile.name} engine has no default image: pass --image.")
        opts = DockerOptions(image=img, gpus=None if gpus == "none" else gpus, network=network)
    typer.echo(f"starting {profile.name} ({mode}) for {pair.target} with the {runner} runner ...", err=True)
    with launch_server(profile.name, pair, mode, runner=runner, port=port, preset=gpu, gpus=gpus, extra_args=engine_args or [],
                       log_path=log_path, ready_timeout=ready_timeout, network=network, docker=opts) as server:
        info = server.info
        where = f"container {info.container_id[:12]}, {info.image_digest}" if info.container_id else f"pid {info.pid}"
        typer.echo(f"ready: {server.url}  ({where}; log {server.log_path}); Ctrl-C stops it")
        while not server.died.wait(1.0):
            pass
        server.check()


def dry_run_line(profile: EngineProfile, argv: list[str], env: dict[str, str], port: int, runner: str, image: str | None,
                 gpus: str | None, network: str) -> str:
    """The exact command a launch would run: `docker run ...` or the local process line."""
    if runner == "process":
        from dflash_bench.launch.local_process import shell_line

        if gpus and gpus != "all":
            env = {**env, "CUDA_VISIBLE_DEVICES": "" if gpus == "none" else gpus}
        return shell_line(argv, env)
    from dflash_bench.launch.docker import DockerOptions, docker_run_line

    img = image or profile.image
    if not img:
        raise UserError(f"the {profile.name} engine has no default image: pass --image.")
    opts = DockerOptions(image=img, gpus=None if gpus == "none" else gpus, network=network)
    return docker_run_line(profile.container_command(argv), env, port, opts)



def _warn_versions(profile: EngineProfile, pair: ModelPair, image: str | None) -> None:
    """Pairs whose card needs an unreleased engine build say so when no --image is given."""
    need = profile.version_note(pair)
    if "PR" in need and "build" in need and not image:
        typer.echo(f"warning: {pair.name} on {profile.name} needs a {need}.", err=True)


def run_stop(all_: bool = False, sweep_id: str | None = None) -> None:
    """Remove leftover dflash-bench containers and process servers."""
    from dflash_bench.launch import docker, local_process as process

    stopped = process.stop_leftovers(all_)
    try:
        stopped += docker.stop_leftovers(all_, sweep_id)
    except UserError as err:
        typer.echo(f"docker: skipped ({err})", err=True)
    for line in stopped:
        typer.echo(f"stopped {line}")
    if not stopped:
        typer.echo("nothing to stop" + ("" if all_ else " (servers of running harnesses are kept; --all stops them too)"))
