"""Engine profiles: the server command for AR and DFlash, readiness endpoint, where acceptance is read.

    from dflash_bench import engines
    profile = engines.get("vllm")
    argv = profile.command(pair, "dflash", port=8000, preset="h100", extra_args=["--seed", "0"])
"""

from __future__ import annotations

from dflash_bench.engines.base import MODES, PRESETS, EngineProfile, check_mode, check_preset, tensor_parallel
from dflash_bench.engines.builtin import Builtin
from dflash_bench.engines.emulator import Emulator
from dflash_bench.engines.sglang import SGLang
from dflash_bench.engines.vllm import VLLM
from dflash_bench.errors import UserError

ENGINES: dict[str, EngineProfile] = {e.name: e for e in (VLLM(), SGLang(), Builtin(), Emulator())}

__all__ = ["ENGINES", "MODES", "PRESETS", "EngineProfile", "check_mode", "check_preset", "get", "names", "tensor_parallel"]


def names() -> list[str]:
    return list(ENGINES)


def get(name: str) -> EngineProfile:
    """The profile of an engine by name (vllm, sglang, builtin); an unknown name is a UserError."""
    try:
        return ENGINES[name.lower()]
    except (KeyError, AttributeError):
        raise UserError(f"unknown engine {name!r}: use one of {', '.join(ENGINES)}.") from None
