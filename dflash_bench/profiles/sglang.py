"""SGLang: `python3 -m sglang.launch_server --model-path TARGET` (image lmsysorg/sglang, no entrypoint).

DFlash adds `--speculative-algorithm DFLASH --speculative-draft-model-path DRAFTER
--speculative-num-draft-tokens B` and the card's draft attention backend. `--enable-metrics` in both modes.
Acceptance: per-request `meta_info.spec_verify_ct` (Σ completion_tokens / Σ spec_verify_ct).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dflash_bench.profiles.base import EngineProfile, python_module
from dflash_bench.models import ModelPair

DEFAULT_IMAGE = "lmsysorg/sglang:v0.5.20"

# Attention backends that exist only on one GPU generation, and what the preset uses instead.
# fa3 is Hopper-only; trtllm_mha and fa4 are the Blackwell kernels of the Qwen3.5 cards.
BACKEND_SWAPS = {
    "generic": {},
    "h100": {"trtllm_mha": "fa3", "fa4": "fa3"},
    "b300": {"fa3": "trtllm_mha"},
}
BACKEND_FLAGS = ("--attention-backend", "--speculative-draft-attention-backend")


def _swap_backends(flags: tuple[str, ...] | list[str], preset: str) -> list[str]:
    swaps, out = BACKEND_SWAPS[preset], list(flags)
    for i in range(1, len(out)):
        if out[i - 1] in BACKEND_FLAGS:
            out[i] = swaps.get(out[i], out[i])
    return out


@dataclass(frozen=True)
class SGLang(EngineProfile):
    name = "sglang"
    image = DEFAULT_IMAGE
    ready_path = "/health"
    acceptance = "sglang-meta"
    tau_counting = ("SGLang's completion_tokens / spec_verify_ct counts the prefill's first token and every verify "
                    "forward, a last one cut at max_tokens included: about 1 / verify steps above the definition's")
    default_port = 30000
    api = "generate"  # native /generate: its meta_info carries spec_verify_ct, the acceptance source
    chat_template = "client"  # /generate takes templated text
    local_module = "sglang"
    cache_reset = "/flush_cache"  # refused (400) while requests run; between cells none do
    memory_fraction = 0.88  # --mem-fraction-static: weights and the KV pool; the rest: activations, graphs
    # SGLang's benchmark switch (read in 0.5.16's source: layers/moe/topk.py select_experts) gives each token k experts
    # evenly spaced from a random offset. Its MoE backends that route inside their own kernels (triton_kernels,
    # FlashInfer's TRT-LLM) skip select_experts and so the switch. Seen on one H200 with gemma-4-26B-A4B's random
    # weights (Triton's fused MoE): AR's tok/s at 32 rows fell to a third of alike routing's, as a spread batch's does
    routing_simulation = ("SGLANG_SIMULATE_UNIFORM_EXPERTS", "1")

    def sizing_flags(self, context_len: int | None, max_concurrency: int, tensor_parallel: int | None,
                     memory_fraction: float | None = None) -> list[str]:
        flags = ["--tp-size", str(tensor_parallel)] if tensor_parallel else []
        if context_len is None:
            return flags
        return ["--context-length", str(context_len), "--mem-fraction-static", str(memory_fraction or self.memory_fraction),
                "--max-running-requests", str(max_concurrency), *flags]

    def version_note(self, pair: ModelPair) -> str:
        return pair.sglang_version

    def local_install(self) -> tuple[bool, str] | None:
        return python_module("sglang")

    def base_command(self, pair: ModelPair) -> list[str]:
        return ["python3", "-m", "sglang.launch_server", "--model-path", pair.target]

    def target_flags(self, pair: ModelPair, preset: str) -> list[str]:
        return _swap_backends(pair.sglang_flags, preset)

    def spec_flags(self, pair: ModelPair, preset: str) -> list[str]:
        return ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", pair.require_drafter(),
                "--speculative-num-draft-tokens", str(pair.block_size),
                *_swap_backends(pair.sglang_spec_flags, preset)]

    def harness_flags(self) -> list[str]:
        return ["--enable-metrics"]

    def synthetic_refusal(self, extra_args: Sequence[str] = ()) -> str | None:
        return ("SGLang's DFlash has no synthetic acceptance (its SGLANG_SIMULATE_ACC_LEN reaches EAGLE's verify "
                "only): measure SGLang without --synthetic-acceptance, in a sweep of its own")

    def env(self, pair: ModelPair, mode: str) -> dict[str, str]:
        return dict(pair.sglang_env)
