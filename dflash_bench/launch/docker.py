"""Docker launcher, through the Docker SDK for Python.

Containers carry labels (`dflash-bench=1`, the sweep id, engine, mode, owner host:pid) so that
`dflash-bench stop` finds leftovers. HF_TOKEN is passed from the environment, never printed or recorded.
"""

from __future__ import annotations

import os
import shlex
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash_bench.errors import UserError
from dflash_bench.launch.common import Server, ServerInfo

LABEL = "dflash-bench"
PASSED_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")  # passed through by name when set
CONTAINER_HF_CACHE = "/root/.cache/huggingface"
STOP_TIMEOUT_S = 10


@dataclass
class DockerOptions:
    """How to run the container. Defaults suit GPU serving; tests turn GPUs and the HF cache off."""

    image: str
    gpus: str | None = "all"  # "all", "0,1" (device ids), or None for no GPU
    network: str = "host"  # "host", or "bridge" to map the port on 127.0.0.1
    ipc_host: bool = True
    shm_size: str | None = "32g"
    hf_cache: bool = True  # mount the host's Hugging Face cache
    mounts: list[tuple[str, str, str]] = field(default_factory=list)  # (host path, container path, "ro"|"rw")
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # extra container environment (not secrets)
    init: bool = True  # docker-init as PID 1: forwards SIGTERM to the server and reaps its children
    ulimits: bool = True  # memlock=-1, stack=64 MiB as SGLang's compose file (needs CAP_SYS_RESOURCE)
    entrypoint: list[str] | None = None  # None: the image's own
    workdir: str | None = None
    pull: bool = True  # pull the image when it is not present locally


def client() -> Any:
    """A Docker client, or a UserError saying why there is none."""
    import docker

    try:
        cli = docker.from_env(timeout=30)  # type: ignore[attr-defined]  # mypy takes this module for the SDK of its name
        cli.ping()
        return cli
    except Exception as err:  # docker.errors.DockerException and socket errors alike
        raise UserError(f"cannot reach the Docker daemon ({type(err).__name__}): start dockerd or use --runner process.") from None


def hf_cache_dir() -> Path:
    """The host's Hugging Face cache (HF_HOME, else ~/.cache/huggingface)."""
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")


def owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _volumes(opts: DockerOptions, create: bool = True) -> dict[str, dict[str, str]]:
    vols = {str(host): {"bind": cont, "mode": mode} for host, cont, mode in opts.mounts}
    if opts.hf_cache:
        cache = hf_cache_dir()
        if create:
            cache.mkdir(parents=True, exist_ok=True)
        vols.setdefault(str(cache), {"bind": CONTAINER_HF_CACHE, "mode": "rw"})
    return vols


def _device_requests(gpus: str | None) -> list:
    import docker.types

    if not gpus or gpus == "none":
        return []
    if gpus == "all":
        return [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return [docker.types.DeviceRequest(device_ids=[g.strip() for g in gpus.split(",")], capabilities=[["gpu"]])]


def _secret_env() -> dict[str, str]:
    return {k: os.environ[k] for k in PASSED_ENV if os.environ.get(k)}


def docker_run_line(argv: list[str], env: dict[str, str], port: int, opts: DockerOptions) -> str:
    """The equivalent `docker run` command line (for --dry-run); secrets appear by name only."""
    parts = ["docker", "run", "--rm", "-d"] + (["--init"] if opts.init else [])
    if opts.gpus and opts.gpus != "none":
        parts += ["--gpus", "all" if opts.gpus == "all" else f'"device={opts.gpus}"']
    if opts.ipc_host:
        parts.append("--ipc=host")
    if opts.shm_size:
        parts += ["--shm-size", opts.shm_size]
    if opts.ulimits:
        parts += ["--ulimit", "memlock=-1", "--ulimit", "stack=67108864"]
    parts += ["--network", "host"] if opts.network == "host" else ["-p", f"127.0.0.1:{port}:{port}"]
    for host, spec in _volumes(opts, create=False).items():
        parts += ["-v", f"{host}:{spec['bind']}:{spec['mode']}"]
    for key in _secret_env():
        parts += ["-e", key]
    for key, val in {**opts.env, **env}.items():
        parts += ["-e", f"{key}={val}"]
    for key, val in {LABEL: "1", **opts.labels}.items():
        parts += ["--label", f"{key}={val}"]
    if opts.entrypoint:
        parts += ["--entrypoint", opts.entrypoint[0]]
    return shlex.join(parts + [opts.image] + (opts.entrypoint or [])[1:] + list(argv))


def _ensure_image(cli: Any, image: str, pull: bool) -> Any:
    import docker.errors

    try:
        return cli.images.get(image)
    except docker.errors.ImageNotFound:
        if not pull:
            raise UserError(f"the image {image} is not present: pull or build it first.") from None
    try:
        print(f"pulling {image} (first use; this can take a while)", flush=True)
        return cli.images.pull(image)
    except docker.errors.APIError as err:
        raise UserError(f"cannot pull {image}: {err.explanation or err}.") from None


class DockerServer(Server):
    runner = "docker"

    def __init__(self, argv: list[str], env: dict[str, str], info: ServerInfo, name: str, port: int,
                 opts: DockerOptions) -> None:
        super().__init__(info, name)
        self.argv, self.env, self.port, self.opts = argv, env, port, opts
        self.container: Any = None  # a docker SDK Container once created
        self._logger: threading.Thread | None = None
        self.cli = client()
        img = _ensure_image(self.cli, opts.image, opts.pull)  # may pull: interruptible, starts nothing
        info.image, info.image_id = opts.image, img.id
        info.image_digest = (img.attrs.get("RepoDigests") or [img.id])[0]

    def _start(self) -> None:
        import docker.errors

        opts = self.opts
        kwargs: dict[str, Any] = dict(
            command=list(self.argv), entrypoint=opts.entrypoint,
            labels={LABEL: "1", "dflash-bench.owner": owner(), **opts.labels},
            environment={**opts.env, **self.env, **_secret_env()}, volumes=_volumes(opts),
            device_requests=_device_requests(opts.gpus), ipc_mode="host" if opts.ipc_host else None,
            shm_size=opts.shm_size, working_dir=opts.workdir, ulimits=_ulimits() if opts.ulimits else None,
            network_mode=opts.network, init=opts.init or None,
        )
        if opts.network != "host":
            kwargs["ports"] = {f"{self.port}/tcp": ("127.0.0.1", self.port)}
        try:
            self.container = self.cli.containers.create(opts.image, **{k: v for k, v in kwargs.items() if v is not None})
            self.info.container_id = self.container.id
            self.container.start()
        except docker.errors.APIError as err:
            raise UserError(f"docker could not start the {self.name} container: {err.explanation or err}.") from None
        self._logger = threading.Thread(target=self._follow_logs, name=f"logs-{self.name}", daemon=True)
        self._logger.start()

    def _follow_logs(self) -> None:
        with open(self.log_path, "ab") as fh:
            try:
                for chunk in self.container.logs(stream=True, follow=True):
                    fh.write(chunk)
                    fh.flush()
            except Exception:  # the container is gone: the log ends here
                pass

    def exit_code(self) -> int | None:
        import docker.errors

        if self.container is None:
            return -1
        try:
            self.container.reload()
        except docker.errors.NotFound:
            return -1
        if self.container.status in ("created", "running", "restarting"):
            return None
        return int(self.container.attrs.get("State", {}).get("ExitCode", -1))

    def _terminate(self) -> None:
        import docker.errors

        if self.container is None:
            return
        try:
            self.container.stop(timeout=STOP_TIMEOUT_S)
        except docker.errors.NotFound:
            return
        except docker.errors.APIError:
            pass
        if self._logger:
            self._logger.join(timeout=5)
        try:
            self.container.remove(force=True)
        except docker.errors.NotFound:
            pass


def _ulimits() -> list:
    import docker.types

    return [docker.types.Ulimit(name="memlock", soft=-1, hard=-1),
            docker.types.Ulimit(name="stack", soft=67108864, hard=67108864)]


def _owner_gone(value: str | None) -> bool:
    if not value or ":" not in value:
        return True
    host, _, pid = value.rpartition(":")
    if host != socket.gethostname():
        return False  # another machine's harness: only --all touches it
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError):
        return False
    return False


def stop_leftovers(all_: bool = False, sweep_id: str | None = None, labels: dict[str, str] | None = None) -> list[str]:
    """Remove dflash-bench containers: those whose harness is gone, or all of them with `all_`."""
    cli = client()
    filters = [LABEL] + [f"{k}={v}" for k, v in (labels or {}).items()]
    if sweep_id:
        filters.append(f"dflash-bench.sweep={sweep_id}")
    removed = []
    for cont in cli.containers.list(all=True, filters={"label": filters}):
        if all_ or sweep_id or _owner_gone(cont.labels.get("dflash-bench.owner")):
            cont.remove(force=True)
            removed.append(f"container {cont.short_id} ({cont.labels.get('dflash-bench.engine', '?')}-"
                           f"{cont.labels.get('dflash-bench.mode', '?')}, sweep {cont.labels.get('dflash-bench.sweep', '-')})")
    return removed
