"""The builtin PyTorch engine: `dflash-bench serve --model TARGET [--draft DRAFTER] --mode ar|dflash`.

Readiness on /health; acceptance from its /metrics, which use vLLM's counter names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from dflash_bench import __version__
from dflash_bench.profiles.base import EngineProfile
from dflash_bench.models import ModelPair

if TYPE_CHECKING:
    from dflash_bench.synthetic import SyntheticProfile

DEFAULT_IMAGE = f"dflash-bench:{__version__}"  # docker build -f docker/Dockerfile -t dflash-bench:VERSION .

SYNTHETIC_FLAGS = ("--synthetic-acceptance", "--synthetic-acceptance-rates")  # serve's: DFlash only, benchmarking only
# GPU presets run bf16 on CUDA; the generic preset leaves device and dtype to the engine's defaults.
PRESET_FLAGS = {"generic": [], "h100": ["--device", "cuda", "--dtype", "bfloat16"],
                "b300": ["--device", "cuda", "--dtype", "bfloat16"]}


@dataclass(frozen=True)
class Builtin(EngineProfile):
    name = "builtin"
    image = DEFAULT_IMAGE
    ready_path = "/health"
    acceptance = "builtin-metrics"
    tau_counting = ""  # as defined (acceptance_definition 2: a last step's drafts cut at max_tokens count for nothing)
    client_tau = "chunks"  # one chunk per step, the first one the prefill's token
    default_port = 8000
    runner = "process"  # it runs wherever dflash-bench is installed; the image is for GPU hosts
    needs_gpu = False
    memory_fraction = 0.9  # not a flag: its KV cache is --max-slots x --max-model-len, sized up front
    reserved_gib = 2.0
    # its server's POST /reset_prefix_cache, vLLM's route, always served: the engine forgets the prompts it keeps
    # for reuse (`Engine.reset_prefix_cache`); one that keeps none answers all the same
    cache_reset = "/reset_prefix_cache"

    def sizing_flags(self, context_len: int | None, max_concurrency: int, tensor_parallel: int | None,
                     memory_fraction: float | None = None) -> list[str]:
        """Its context and slots, and on several GPUs the fast path's tensor-parallel size (`serve --fast`)."""
        tp = ["--tensor-parallel-size", str(tensor_parallel)] if tensor_parallel and tensor_parallel > 1 else []
        if context_len is None:
            return tp
        return ["--max-model-len", str(context_len), "--max-slots", str(max_concurrency)] + tp

    def image_missing(self) -> str:
        return "not built (see docker/)"

    def local_install(self) -> tuple[bool, str] | None:
        import importlib.util

        found = importlib.util.find_spec("torch") is not None
        return found, "importable (torch)" if found else "torch not installed (pip install 'dflash-bench[engine]')"

    def base_command(self, pair: ModelPair) -> list[str]:
        return ["dflash-bench", "serve", "--model", pair.target]

    def target_flags(self, pair: ModelPair, preset: str) -> list[str]:
        return list(PRESET_FLAGS[preset])

    def ar_flags(self) -> list[str]:
        return ["--mode", "ar"]

    def mode_args(self, mode: str, extra_args: list[str]) -> list[str]:
        """`serve` refuses --synthetic-acceptance(-rates) (and so --benchmark-only's reason) in mode ar: a sweep that
        passes them as --engine-arg gives them to its DFlash server only, and its AR server stays a plain one."""
        if mode == "dflash":
            return extra_args
        out, skip = [], False
        for a in extra_args:
            if skip:
                skip = False
            elif a in SYNTHETIC_FLAGS:
                skip = True  # its value follows
            elif not (a.split("=", 1)[0] in SYNTHETIC_FLAGS or a == "--benchmark-only"):
                out.append(a)
        return out

    def spec_flags(self, pair: ModelPair, preset: str) -> list[str]:
        return ["--mode", "dflash", "--draft", pair.require_drafter()]

    def synthetic_refusal(self, extra_args: Sequence[str] = ()) -> str | None:
        """It draws on its fast path only, and from one profile: the sweep's, not an --engine-arg's as well."""
        args = [str(a).split("=", 1)[0] for a in extra_args]
        if "--fast" not in args:
            return ("the builtin engine draws a synthetic acceptance on its fast path only: add --engine-arg=--fast "
                    "to the sweep")
        given = [a for a in args if a in SYNTHETIC_FLAGS]
        if given:
            return (f"--engine-arg={given[0]} and the sweep's --synthetic-acceptance both give the DFlash server an "
                    "acceptance profile: keep the sweep's option only")
        return None

    def synthetic_spec_flags(self, pair: ModelPair, preset: str, synthetic: SyntheticProfile) -> list[str]:
        rates = ",".join(str(r) for r in synthetic.rates)
        return self.spec_flags(pair, preset) + ["--synthetic-acceptance-rates", rates, "--benchmark-only"]

    def container_command(self, argv: list[str]) -> list[str]:
        # docker/Dockerfile's entrypoint is already `dflash-bench serve --host 0.0.0.0`.
        return argv[2:] if argv[:2] == ["dflash-bench", "serve"] else list(argv)
