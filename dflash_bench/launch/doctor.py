"""`dflash-bench doctor`: is this machine ready to launch servers? One yes/no line per check, each "no" with what
it means for the user, then whether what the user asked for (engines, runner) can run here: exit 1 when not."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import typer

MIN_FREE_GIB = 100  # a 31B bf16 target alone is about 62 GB
NO_GPU = "vLLM and SGLang cannot serve here; the demo and --engine builtin or llamacpp run on the CPU"
NO_DAEMON = "no engine can run from its image (--runner docker); --runner process runs what is installed here"
NO_GPU_RUNTIME = "containers cannot reach the GPUs: vLLM and SGLang cannot run in docker here"


@dataclass
class DoctorCheck:
    name: str
    ok: bool
    detail: str
    means: str = ""  # what a "no" means for the user

    def line(self) -> str:
        text = f"{'yes' if self.ok else 'no ':<4} {self.name}: {self.detail}"
        return f"{text} -> {self.means}" if not self.ok and self.means else text


def check_gpus() -> DoctorCheck:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as err:  # no driver, no library
        return DoctorCheck("GPUs", False, f"NVML is not available ({type(err).__name__}): no NVIDIA driver here", NO_GPU)
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                 for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()
    names = [n.decode() if isinstance(n, bytes) else n for n in names]
    driver = driver.decode() if isinstance(driver, bytes) else driver
    if not names:
        return DoctorCheck("GPUs", False, f"driver {driver} but no GPU visible", NO_GPU)
    kinds = sorted(set(names))
    return DoctorCheck("GPUs", True, f"{len(names)} x {', '.join(kinds)}; driver {driver}")


def check_docker() -> tuple[DoctorCheck, DoctorCheck, list[DoctorCheck]]:
    """(daemon, GPU runtime, one check per default engine image)."""
    from dflash_bench import profiles
    from dflash_bench.errors import UserError
    from dflash_bench.launch.docker import client

    try:
        cli = client()
    except UserError as err:
        off = DoctorCheck("docker daemon", False, str(err), NO_DAEMON)
        return off, DoctorCheck("docker GPU runtime", False, "no daemon", NO_GPU_RUNTIME), []
    info = cli.info()
    daemon = DoctorCheck("docker daemon", True, f"{info.get('ServerVersion', '?')}, storage {info.get('Driver', '?')}")
    runtimes = sorted(info.get("Runtimes") or {})
    cdi = bool(info.get("CDISpecDirs"))
    gpu = DoctorCheck("docker GPU runtime", "nvidia" in runtimes or cdi,
                f"runtimes {', '.join(runtimes) or 'none'}" + ("" if "nvidia" in runtimes else
                                                             " (install nvidia-container-toolkit for --gpus)"),
                NO_GPU_RUNTIME)
    images = []
    for profile in profiles.PROFILES.values():
        if not profile.image:
            continue
        present = bool(cli.images.list(name=profile.image))
        others = sorted({t for img in cli.images.list(name=profile.image.split(":")[0]) for t in img.tags})
        detail = "present" if present else profile.image_missing()
        if others and not present:
            detail += f"; local tags: {', '.join(others)}"
        images.append(DoctorCheck(f"{profile.name} image {profile.image}", present, detail,
                            f"--engine {profile.name} --runner docker " + ("pulls it at its first launch" if
                            profile.name != "builtin" else "cannot start until it is built")))
    return daemon, gpu, images


def check_hf() -> list[DoctorCheck]:
    from dflash_bench.launch.docker import hf_cache_dir

    token = any(os.environ.get(k) for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"))
    checks = [DoctorCheck("HF_TOKEN", token, "set (value not shown)" if token else
                    "not set: gated models (Llama, Gemma) will not download", "ungated models and the demo still run")]
    cache = hf_cache_dir()
    probe = next((p for p in [cache, *cache.parents] if p.exists()), Path("/"))
    free = shutil.disk_usage(probe).free / 2**30
    checks.append(DoctorCheck("disk for the model cache", free >= MIN_FREE_GIB,
                        f"{free:.0f} GiB free at {cache} (want >= {MIN_FREE_GIB} GiB)",
                        "a large target may not fit (a 31B one in bf16 is about 62 GB); small ones and the demo do"))
    return checks


def check_local_engines() -> list[DoctorCheck]:
    """Third-party engines installed here, for `--runner process` (each profile says how to look)."""
    from dflash_bench import profiles

    out = []
    for profile in profiles.PROFILES.values():
        found = profile.local_install()
        if found is not None:
            out.append(DoctorCheck(f"{profile.name} installed here (--runner process)", *found,
                             f"--engine {profile.name} --runner process cannot start here"))
    return out


@dataclass
class Machine:
    """Every check, by what it answers."""

    gpus: DoctorCheck
    daemon: DoctorCheck
    gpu_runtime: DoctorCheck
    images: list[DoctorCheck]
    installed: dict[str, DoctorCheck]  # engine -> its `--runner process` check
    hf: list[DoctorCheck]

    def all(self) -> list[DoctorCheck]:
        return [self.gpus, self.daemon, self.gpu_runtime, *self.images, *self.installed.values(), *self.hf]

    def missing(self, engine: str, runner: str) -> list[str]:
        """What `--engine engine --runner runner` needs that this machine lacks (nothing: it can run here)."""
        from dflash_bench import profiles

        profile = profiles.get(engine)
        out = []
        if profile.needs_gpu and not self.gpus.ok:
            out.append("a GPU")
        if runner == "docker":
            if not self.daemon.ok:
                out.append("the docker daemon")
            elif profile.needs_gpu and not self.gpu_runtime.ok:
                out.append("docker's GPU runtime")
        elif engine in self.installed and not self.installed[engine].ok:
            out.append(f"{engine} installed here")
        return out


def machine() -> Machine:
    daemon, gpu_rt, images = check_docker()
    installed = {name.split(" ")[0]: check for check in check_local_engines() for name in [check.name]}
    return Machine(check_gpus(), daemon, gpu_rt, images, installed, check_hf())


def checks() -> list[DoctorCheck]:
    return machine().all()


def run_doctor(engines: list[str] | None = None, runner: str | None = None) -> int:
    """Print one yes/no line per check, then whether what was asked for can run here; the exit code (1: not).

    Asked for nothing, doctor asks what `sweep` on a GPU host needs: vLLM or SGLang (either will do) with its
    default runner."""
    from dflash_bench import profiles
    from dflash_bench.errors import UserError

    if runner not in (None, "docker", "process"):
        raise UserError(f"--runner is docker or process, not {runner!r}")
    asked = engines or [p.name for p in profiles.PROFILES.values() if p.needs_gpu]
    for name in asked:
        profiles.get(name)  # an unknown engine: one sentence before any check runs
    found = machine()
    for check in found.all():
        typer.echo(check.line())
    lacking = {f"{e} (--runner {r})": found.missing(e, r) for e in asked for r in [runner or profiles.get(e).runner]}
    ready = [what for what, missing in lacking.items() if not missing]
    if engines and len(ready) == len(lacking) or not engines and ready:
        typer.echo(f"ready for {', '.join(ready)}")
        return 0
    why = "; ".join(f"{what} needs {', '.join(missing)}" for what, missing in lacking.items() if missing)
    typer.echo(f"not ready: {why}" + ("" if engines else
               " (`dflash-bench demo` and --engine builtin or llamacpp run on a CPU: ask with doctor --engine)"))
    return 1
