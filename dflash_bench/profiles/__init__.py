"""Engine profiles: the server command for AR and DFlash, readiness endpoint, where acceptance is read.

    from dflash_bench import profiles
    profile = profiles.get("vllm")
    argv = profile.command(pair, "dflash", port=8000, preset="h100", extra_args=["--seed", "0"])
"""

from __future__ import annotations

from dflash_bench.profiles.base import MODES, PRESETS, EngineProfile, check_mode, check_preset, tensor_parallel
from dflash_bench.profiles.builtin import Builtin
from dflash_bench.profiles.emulator import Emulator
from dflash_bench.profiles.llamacpp import LlamaCpp
from dflash_bench.profiles.sglang import SGLang
from dflash_bench.profiles.vllm import VLLM
from dflash_bench.errors import UserError

PROFILES: dict[str, EngineProfile] = {e.name: e for e in (VLLM(), SGLang(), Builtin(), Emulator(), LlamaCpp())}

__all__ = ["PROFILES", "MODES", "PRESETS", "EngineProfile", "check_mode", "check_preset", "get", "names", "tensor_parallel"]


def names() -> list[str]:
    return list(PROFILES)


def get(name: str) -> EngineProfile:
    """The profile of an engine by name (vllm, sglang, builtin, emulator, llamacpp); an unknown name is a UserError."""
    try:
        return PROFILES[name.lower()]
    except (KeyError, AttributeError):
        raise UserError(f"unknown engine {name!r}: use one of {', '.join(PROFILES)}.") from None
