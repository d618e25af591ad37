"""Start servers, wait until they are ready, watch them, and always tear them down.

    from dflash_bench.launch import launch_server
    with launch_server("vllm", "Qwen3-8B", "dflash", runner="docker", port=8000, sweep_id=sid,
                       log_path=folder / "logs/vllm-dflash.log") as server:
        ...  # requests to server.url; server.check() raises ServerDied (with the log tail) if it died
    # the container or process group is gone here: on success, error, Ctrl-C and SIGTERM alike

`launch_command` runs any command the same way (the emulator, `dflash-bench serve`, a test server).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

from dflash_bench.errors import UserError
from dflash_bench.launch.common import ServerDied, ServerInfo, ServerNotReady, Server, Terminated, free_port, sigterm_unwinds
from dflash_bench.launch.docker import DockerOptions
from dflash_bench.launch.identity import check_port_free, verify_launched
from dflash_bench.models import ModelPair
from dflash_bench.profiles.base import EngineProfile, check_mode as profile_mode, check_preset, random_weights

if TYPE_CHECKING:
    from dflash_bench.synthetic import SyntheticProfile

__all__ = ["DockerOptions", "Server", "ServerDied", "ServerInfo", "ServerNotReady", "Terminated", "free_port",
           "launch_command", "launch_server", "plan_server"]

RUNNERS = ("docker", "process")
DEFAULT_READY_TIMEOUT_S = 1800.0  # large models load and compile for many minutes


@contextlib.contextmanager
def launch_command(
    argv: Sequence[str], *, port: int, runner: str = "process", ready_path: str = "/health",
    env: dict[str, str] | None = None, log_path: str | Path | None = None,
    ready_timeout: float = DEFAULT_READY_TIMEOUT_S, name: str = "launched", docker: DockerOptions | None = None,
    engine: str | None = None, mode: str | None = None, sweep_id: str | None = None, watchdog: bool = True,
) -> Iterator[Server]:
    """Run `argv` (in docker: the part after the image), wait for 200 on `ready_path`, yield the Server.

    The server is stopped when the block ends, however it ends. Start-up failures raise ServerDied or
    ServerNotReady with the last 40 lines of the server's log.
    """
    if runner not in RUNNERS:
        raise UserError(f"unknown runner {runner!r}: use docker or process.")
    env = dict(env or {})
    own_log = log_path is None
    if log_path is None:
        fd, log_path = tempfile.mkstemp(prefix=f"dflash-bench-{name}-", suffix=".log")
        os.close(fd)
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    info = ServerInfo(runner=runner, command=list(argv), url=f"http://127.0.0.1:{port}", port=port, engine=engine,
                      mode=mode, log_path=str(log_path), env_names=sorted(env))
    server: Server | None = None
    with sigterm_unwinds():
        try:
            check_port_free(port)  # a server already there would answer as ours
            server = _make(runner, list(argv), env, info, name, port, docker, sweep_id, engine, mode)
            t0 = time.monotonic()
            server.start()
            server.wait_ready(ready_path, ready_timeout)
            server.info.ready_s = round(time.monotonic() - t0, 1)  # what a start costs, kept with the server
            server.info.identity = verify_launched(server, port)  # the one answering is the one started
            if watchdog:
                server.start_watchdog()
            yield server
        finally:
            if server is not None:
                server.stop()
            if own_log:  # errors already carry the tail; a kept log needs log_path
                Path(log_path).unlink(missing_ok=True)


def _make(runner: str, argv: list[str], env: dict[str, str], info: ServerInfo, name: str, port: int,
          docker: DockerOptions | None, sweep_id: str | None, engine: str | None, mode: str | None) -> Server:
    if runner == "process":
        from dflash_bench.launch.local_process import ProcessServer, resolve_argv

        return ProcessServer(resolve_argv(argv), env, info, name)
    from dflash_bench.launch.docker import DockerServer

    if docker is None:
        raise UserError("the docker runner needs an image: pass --image.")
    labels = {k: v for k, v in {"dflash-bench.sweep": sweep_id, "dflash-bench.engine": engine,
                                "dflash-bench.mode": mode}.items() if v}
    docker.labels = {**labels, **docker.labels}
    return DockerServer(argv, env, info, name, port, docker)


def plan_server(engine: str, model: str | ModelPair, mode: str, *, port: int | None = None, preset: str = "generic",
                extra_args: Sequence[str] = (), runner: str = "docker", network: str = "host", prepare: bool = False,
                slots: tuple[int, int] | None = None, synthetic: SyntheticProfile | None = None,
                cache_reset: bool = False) -> tuple[EngineProfile, ModelPair, list[str], dict[str, str], int]:
    """(profile, pair, argv, env, port): what `launch_server` would run, for --dry-run and manifests.

    `prepare` makes the model files the engine needs (llama.cpp converts to GGUF); without it their
    paths are only planned. `synthetic`: the acceptance profile a DFlash server draws (dflash_bench/synthetic.py).
    `cache_reset`: a sweep's server, whose prefix cache the sweep empties before each cell (the environment
    `EngineProfile.cache_reset_env` and the flags `cache_reset_flags` that the route needs)."""
    from dflash_bench import models, profiles

    if runner not in RUNNERS:
        raise UserError(f"unknown runner {runner!r}: use docker or process.")
    profile = profiles.get(engine)
    pair = model if isinstance(model, ModelPair) else models.resolve(model)
    pair = profile.serve_pair(pair, profile_mode(mode), convert=prepare, preset=check_preset(preset))
    port = port or profile.default_port
    # The harness talks to 127.0.0.1, so servers listen there only (vLLM would take every interface);
    # a port-mapped container must listen on all of its own interfaces for the mapping to reach it.
    host = "0.0.0.0" if runner == "docker" and network != "host" else "127.0.0.1"
    extra_args = [*(profile.cache_reset_flags if cache_reset else ()), *extra_args]
    argv = profile.command(pair, mode, port, preset, extra_args, host=host, slots=slots, synthetic=synthetic)
    env = (profile.env(pair, mode) | (profile.random_weights_env(pair) if random_weights(extra_args) else {})
           | (dict(profile.cache_reset_env) if cache_reset else {}))
    return profile, pair, argv, env, port


@contextlib.contextmanager
def launch_server(
    engine: str, model: str | ModelPair, mode: str, *, runner: str = "docker", port: int | None = None,
    preset: str = "generic", gpus: str | None = "all", image: str | None = None, extra_args: Sequence[str] = (),
    sweep_id: str | None = None, log_path: str | Path | None = None,
    ready_timeout: float = DEFAULT_READY_TIMEOUT_S, network: str = "host", docker: DockerOptions | None = None,
    slots: tuple[int, int] | None = None, synthetic: SyntheticProfile | None = None, cache_reset: bool = False,
) -> Iterator[Server]:
    """Launch `engine` serving `model` in `mode` ("ar" | "dflash"); see the module docstring. `slots`: (slots,
    per-slot context) for an engine whose slots follow the cell's concurrency (`EngineProfile.slots_per_cell`);
    `synthetic`: the acceptance profile a DFlash server draws instead of verifying; `cache_reset`: see plan_server."""
    profile, pair, argv, env, port = plan_server(engine, model, mode, port=port, preset=preset,
                                                 extra_args=extra_args, runner=runner, network=network, prepare=True,
                                                 slots=slots, synthetic=synthetic, cache_reset=cache_reset)
    opts = docker
    if runner == "process":
        argv = profile.process_argv(argv)
        if gpus and gpus != "all":
            env["CUDA_VISIBLE_DEVICES"] = "" if gpus == "none" else gpus  # what --gpus means for a local process
    if runner == "docker":
        image = image or (opts.image if opts else None) or profile.image_for(check_preset(preset))
        if not image:
            raise UserError(f"the {profile.name} engine has no default image: pass --image.")
        opts = opts or DockerOptions(image=image, gpus=gpus, network=network)
        opts.image = image
        argv = profile.container_command(argv)
    with launch_command(argv, port=port, runner=runner, ready_path=profile.ready_path, env=env, log_path=log_path,
                        ready_timeout=ready_timeout, name=f"{profile.name}-{mode}", docker=opts, engine=profile.name,
                        mode=mode, sweep_id=sweep_id) as server:
        server.info.weights = profile.weights(check_preset(preset))
        yield server
