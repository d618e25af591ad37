"""`dflash-bench doctor`: is this machine ready to launch servers? One yes/no line per check."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import typer

MIN_FREE_GIB = 100  # a 31B bf16 target alone is about 62 GB


@dataclass
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'yes' if self.ok else 'no ':<4} {self.name}: {self.detail}"


def check_gpus() -> Check:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as err:  # no driver, no library
        return Check("GPUs", False, f"NVML is not available ({type(err).__name__}): no NVIDIA driver here")
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                 for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()
    names = [n.decode() if isinstance(n, bytes) else n for n in names]
    driver = driver.decode() if isinstance(driver, bytes) else driver
    if not names:
        return Check("GPUs", False, f"driver {driver} but no GPU visible")
    kinds = sorted(set(names))
    return Check("GPUs", True, f"{len(names)} x {', '.join(kinds)}; driver {driver}")


def check_docker() -> tuple[Check, Check, list[Check]]:
    """(daemon, GPU runtime, one check per default engine image)."""
    from dflash_bench import profiles
    from dflash_bench.errors import UserError
    from dflash_bench.launch.docker import client

    try:
        cli = client()
    except UserError as err:
        off = Check("docker daemon", False, str(err))
        return off, Check("docker GPU runtime", False, "no daemon"), []
    info = cli.info()
    daemon = Check("docker daemon", True, f"{info.get('ServerVersion', '?')}, storage {info.get('Driver', '?')}")
    runtimes = sorted(info.get("Runtimes") or {})
    cdi = bool(info.get("CDISpecDirs"))
    gpu = Check("docker GPU runtime", "nvidia" in runtimes or cdi,
                f"runtimes {', '.join(runtimes) or 'none'}" + ("" if "nvidia" in runtimes else
                                                             " (install nvidia-container-toolkit for --gpus)"))
    images = []
    for profile in profiles.PROFILES.values():
        if not profile.image:
            continue
        present = bool(cli.images.list(name=profile.image))
        others = sorted({t for img in cli.images.list(name=profile.image.split(":")[0]) for t in img.tags})
        detail = "present" if present else profile.image_missing()
        if others and not present:
            detail += f"; local tags: {', '.join(others)}"
        images.append(Check(f"{profile.name} image {profile.image}", present, detail))
    return daemon, gpu, images


def check_hf() -> list[Check]:
    from dflash_bench.launch.docker import hf_cache_dir

    token = any(os.environ.get(k) for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"))
    checks = [Check("HF_TOKEN", token, "set (value not shown)" if token else
                    "not set: gated models (Llama, Gemma) will not download")]
    cache = hf_cache_dir()
    probe = next((p for p in [cache, *cache.parents] if p.exists()), Path("/"))
    free = shutil.disk_usage(probe).free / 2**30
    checks.append(Check("disk for the model cache", free >= MIN_FREE_GIB,
                        f"{free:.0f} GiB free at {cache} (want >= {MIN_FREE_GIB} GiB)"))
    return checks


def check_local_engines() -> list[Check]:
    """Third-party engines installed here, for `--runner process` (each profile says how to look)."""
    from dflash_bench import profiles

    out = []
    for profile in profiles.PROFILES.values():
        found = profile.local_install()
        if found is not None:
            out.append(Check(f"{profile.name} installed here (--runner process)", *found))
    return out


def checks() -> list[Check]:
    daemon, gpu_rt, images = check_docker()
    return [check_gpus(), daemon, gpu_rt, *images, *check_local_engines(), *check_hf()]


def run_doctor() -> None:
    """Print one yes/no line per check."""
    for check in checks():
        typer.echo(check.line())
