"""What every engine profile provides: the server command for AR and DFlash, readiness, acceptance source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from dflash_bench.errors import UserError
from dflash_bench.models import ModelPair

MODES = ("ar", "dflash")
PRESETS = ("generic", "h100", "b300")
# Other GPU names map onto the preset of their generation.
PRESET_ALIASES = {"h200": "h100", "h20": "h100", "hopper": "h100", "b200": "b300", "gb200": "b300",
                  "gb300": "b300", "blackwell": "b300"}
TP_FLAGS = ("--tensor-parallel-size", "-tp", "--tp-size", "--tp")


def tensor_parallel(engine_args: Any) -> int | None:
    """The tensor-parallel size passed through to the engine (vLLM `--tensor-parallel-size`, SGLang `--tp-size`)."""
    args = [str(a) for a in engine_args] if isinstance(engine_args, list) else []
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in TP_FLAGS:
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            if value.isdigit() and int(value) > 0:
                return int(value)
    return None


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise UserError(f"unknown mode {mode!r}: use ar or dflash.")
    return mode


def check_preset(preset: str | None) -> str:
    name = (preset or "generic").lower()
    name = PRESET_ALIASES.get(name, name)
    if name not in PRESETS:
        raise UserError(f"unknown GPU preset {preset!r}: use one of {', '.join(PRESETS + tuple(PRESET_ALIASES))}.")
    return name


@dataclass(frozen=True)
class EngineProfile:
    """One serving engine. The AR and DFlash commands differ only in the speculative flags."""

    name: ClassVar[str]
    image: ClassVar[str | None]  # default container image (None: no image, process runner only)
    ready_path: ClassVar[str] = "/health"
    acceptance: ClassVar[str]  # "vllm-metrics" | "sglang-meta" | "builtin-metrics"
    metrics_path: ClassVar[str] = "/metrics"
    default_port: ClassVar[int] = 8000

    def command(self, pair: ModelPair, mode: str, port: int, preset: str | None = "generic",
                extra_args: Sequence[str] = (), host: str | None = None) -> list[str]:
        """The full server command line (as a local process would run it)."""
        mode, preset = check_mode(mode), check_preset(preset)
        argv = self.base_command(pair) + self.target_flags(pair, preset)
        argv += self.spec_flags(pair, preset) if mode == "dflash" else self.ar_flags()
        argv += ["--port", str(port)] + (["--host", host] if host else [])
        return argv + self.harness_flags() + list(extra_args)

    def env(self, pair: ModelPair, mode: str) -> dict[str, str]:
        """Environment variables the card asks for (the same for AR and DFlash)."""
        return {}

    def container_command(self, argv: list[str]) -> list[str]:
        """The part of `argv` that follows the image name in `docker run` (the image's entrypoint runs it)."""
        return list(argv)

    # Engine-specific parts.
    def base_command(self, pair: ModelPair) -> list[str]:
        raise NotImplementedError

    def target_flags(self, pair: ModelPair, preset: str) -> list[str]:
        raise NotImplementedError

    def spec_flags(self, pair: ModelPair, preset: str) -> list[str]:
        raise NotImplementedError

    def ar_flags(self) -> list[str]:
        """Flags only the AR server gets (none for vLLM and SGLang: AR is the command minus spec flags)."""
        return []

    def harness_flags(self) -> list[str]:
        """Flags the harness needs in both modes (metrics on, ...)."""
        return []
