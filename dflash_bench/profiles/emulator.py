"""The timing emulator as an engine: `dflash-bench emulate --mode ar|dflash` with known ground truth.

Not a way to measure a model: a measuring instrument. A sweep against it checks the harness end to end
(launch, measure, resume, report) on any machine, and its numbers are known in advance.
Timing options (`--ttft-ms`, `--itl-ms`, `--acceptance-length`, ...) pass through `--engine-arg`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from dflash_bench.profiles.base import EngineProfile
from dflash_bench.models import ModelPair

if TYPE_CHECKING:
    from dflash_bench.synthetic import SyntheticProfile


@dataclass(frozen=True)
class Emulator(EngineProfile):
    name = "emulator"
    image = None  # runs where dflash-bench is installed (process runner, or a test image)
    ready_path = "/health"
    acceptance = "vllm-metrics"
    tau_counting = ("the emulator draws each step's accepted drafts around --acceptance-length and counts them with "
                    "vLLM's counters; a last step's draws past max_tokens count, as in vLLM")
    client_tau = "chunks"
    default_port = 8000
    runner = "process"
    needs_gpu = False
    cache_reset = "/reset_prefix_cache"  # its --prefix-cache is vLLM's, emptied by vLLM's route

    def base_command(self, pair: ModelPair) -> list[str]:
        return ["dflash-bench", "emulate", "--model", pair.name]

    def target_flags(self, pair: ModelPair, preset: str) -> list[str]:
        return []

    def spec_flags(self, pair: ModelPair, preset: str) -> list[str]:
        return ["--mode", "dflash", "--block-size", str(pair.block_size)]

    def synthetic_refusal(self, extra_args: Sequence[str] = ()) -> str | None:
        return None

    def synthetic_spec_flags(self, pair: ModelPair, preset: str, synthetic: SyntheticProfile) -> list[str]:
        """Its steps' accepted runs drawn from the profile (`emulate --acceptance-rates`), a known truth."""
        return self.spec_flags(pair, preset) + ["--acceptance-rates", ",".join(str(r) for r in synthetic.rates)]

    def eagle3_flags(self, pair: ModelPair, preset: str, synthetic: SyntheticProfile | None = None) -> list[str]:
        """An EAGLE-3 server's stand-in: a speculative server of the head's draft length (its tokens plus one)."""
        from dflash_bench.synthetic import for_draft as synthetic_for_draft

        flags = ["--mode", "dflash", "--block-size", str(pair.eagle3_tokens + 1)]
        if synthetic is not None:
            rates = synthetic_for_draft(synthetic, pair.eagle3_tokens).rates
            flags += ["--acceptance-rates", ",".join(str(r) for r in rates)]
        return flags
