"""Engine profiles: the server command for AR and DFlash, readiness endpoint, where acceptance is read.

    from dflash_bench import profiles
    profile = profiles.get("vllm")
    argv = profile.command(pair, "dflash", port=8000, preset="h100", extra_args=["--seed", "0"])
"""

from __future__ import annotations

from dflash_bench.profiles.base import MODES, PRESETS, EngineProfile, check_mode, check_preset, tensor_parallel
from dflash_bench.profiles.builtin import Builtin
from dflash_bench.profiles.emulator import Emulator
from dflash_bench.profiles.gpus import recorded_gpus
from dflash_bench.profiles.llamacpp import LlamaCpp
from dflash_bench.profiles.sglang import SGLang
from dflash_bench.profiles.vllm import VLLM
from dflash_bench.errors import UserError
from dflash_bench.models import ModelPair
from dflash_bench.settings import SweepSettings

PROFILES: dict[str, EngineProfile] = {e.name: e for e in (VLLM(), SGLang(), Builtin(), Emulator(), LlamaCpp())}

__all__ = ["PROFILES", "MODES", "PRESETS", "EngineProfile", "check_mode", "check_preset", "get", "names", "recorded_gpus",
           "server_gpus", "tensor_parallel"]


def names() -> list[str]:
    return list(PROFILES)


def get(name: str) -> EngineProfile:
    """The profile of an engine by name (vllm, sglang, builtin, emulator, llamacpp); an unknown name is a UserError."""
    try:
        return PROFILES[name.lower()]
    except (KeyError, AttributeError):
        raise UserError(f"unknown engine {name!r}: use one of {', '.join(PROFILES)}.") from None


def server_gpus(engine: str, pair: ModelPair, settings: SweepSettings) -> int:
    """GPUs of one launched server, the one answer for telemetry, Slurm jobs and the server's record:
    `--tensor-parallel-size` (SweepSettings.tensor_parallel), else the tensor-parallel flag in its command
    (card flags and --engine-arg, the last one winning), else one; the emulator uses none."""
    if engine == "emulator":
        return 0
    if settings.tensor_parallel:
        return int(settings.tensor_parallel)
    return tensor_parallel(get(engine).command(pair, "ar", 0, settings.gpu, settings.engine_args)) or 1
