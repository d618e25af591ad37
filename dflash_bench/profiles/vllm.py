"""vLLM: `vllm serve TARGET` (image vllm/vllm-openai, whose entrypoint is `vllm serve`).

DFlash adds `--speculative-config {"method": "dflash", "model": DRAFTER, "num_speculative_tokens": B-1}`; with a
synthetic acceptance profile also `"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [...]`.
Acceptance: Δ of the `vllm:spec_decode_*_total` counters on /metrics (always on).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from dflash_bench.errors import UserError
from dflash_bench.geometry import text_config
from dflash_bench.model_shapes import pair_configs
from dflash_bench.profiles.base import EngineProfile, flag_values, python_module
from dflash_bench.models import ModelPair

if TYPE_CHECKING:
    from dflash_bench.synthetic import SyntheticProfile

DEFAULT_IMAGE = "vllm/vllm-openai:v0.29.0"

# vLLM's DFlash draft model (qwen3_dflash.py) raises for a drafter that mixes sliding-window and full-attention
# layers up to 0.25.1 (read in its source, seen on an H100): those versions are refused before launch. 0.26.0
# accepts such a drafter on its V2 model runner, which `VllmConfig.use_v2_model_runner` turns on by itself for it
# unless VLLM_USE_V2_MODEL_RUNNER is set; with VLLM_USE_V2_MODEL_RUNNER=0 it raises MIXED_DRAFT_LOG_V1 instead.
MIXED_DRAFT_REFUSED_UP_TO = (0, 25, 1)
MIXED_DRAFT_LOG = "DFlash does not yet support mixed sliding/full attention"
MIXED_DRAFT_LOG_V1 = "DFlash drafters with mixed sliding/full attention require the V2 model runner"
# A draft position's logits in a verify step, bytes a vocabulary entry (`sampler_reserve`): the model's bf16 logits
# (and a rank's part of them before they are gathered), the rejection sampler's copy of its rows, their float32 cast,
# that cast's clone, and a sampled request's float32 softmax: 17 to 18 by the tensors. Measured on two H200s,
# gpt-oss-120b's DFlash at 1,024 rows of 9 drafts over 201,088 entries: 12 bytes set aside, its GPUs' memory filled
# whole at the peak, at least 17.5 bytes a position beyond the AR server's own margin
VERIFY_LOGIT_BYTES = 18


def mixed_draft_sentence(version: str | None) -> str:
    which = f"vLLM {version}" if version else "this vLLM"
    return (f"{which} cannot run DFlash with this drafter: its DFlash draft model refuses a drafter that mixes "
            f"sliding-window and full-attention layers (NotImplementedError, vllm issue 40898) and applies no "
            f"final-logit softcapping (PR #41703); vLLM 0.26.0 runs such a drafter on its V2 model runner: measure "
            f"this pair's DFlash with vLLM 0.26.0 or later, or with sglang.")


def v1_runner_sentence() -> str:
    return ("vLLM runs a DFlash drafter that mixes sliding-window and full-attention layers only on its V2 model "
            "runner, and VLLM_USE_V2_MODEL_RUNNER=0 turned that off: unset it (vLLM then picks V2 for this drafter).")


def softcap_sentence(version: str | None, cap: float) -> str:
    which = f"vLLM {version}" if version else "this vLLM"
    return (f"{which} drafts without the drafter's final-logit softcapping ({cap:g}): its DFlash draft model "
            f"(qwen3_dflash.py) computes logits through the target's shared lm_head with no soft cap. Greedy drafts "
            f"(temperature 0, the sweep's default) are the same tokens, since tanh keeps the argmax; sampled drafts "
            f"(temperature > 0) are drawn from uncapped logits, which can lower acceptance.")


def _version_tuple(version: str) -> tuple[int, ...] | None:
    parts = version.split("+")[0].split(".")[:3]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        return None


@dataclass(frozen=True)
class VLLM(EngineProfile):
    name = "vllm"
    image = DEFAULT_IMAGE
    ready_path = "/health"
    acceptance = "vllm-metrics"
    tau_counting = ("vLLM counts a step's accepted drafts before its stop checks (v1 scheduler, update_from_output): "
                    "drafts accepted past max_tokens or EOS count, so tau reads slightly above the definition's on "
                    "short outputs")
    client_tau = "chunks"  # one delta per engine step (servers.md)
    default_port = 8000
    local_module = "vllm"
    # vLLM's routing simulator (read in 0.26.0's source: fused_moe/router/routing_simulator_router.py) draws each
    # token's experts uniformly at random; it also moves gpt-oss's MXFP4 experts from the Triton kernel that routes
    # inside itself to the one that takes the simulator's choice. Seen on two H200s: vLLM logs "Simulating MoE routing"
    routing_simulation = ("VLLM_MOE_ROUTING_SIMULATION_STRATEGY", "uniform_random")
    cache_reset = "/reset_prefix_cache"  # vLLM's entrypoints/serve/dev routes, attached only in dev mode
    cache_reset_env = (("VLLM_SERVER_DEV_MODE", "1"),)  # as `vllm bench sweep` starts its servers
    memory_fraction = 0.92  # --gpu-memory-utilization: weights, activations and KV together
    reserved_gib = 4.0  # an 8k-token prefill's activations, CUDA graphs, a 262k vocabulary's logits

    def sizing_flags(self, context_len: int | None, max_concurrency: int, tensor_parallel: int | None,
                     memory_fraction: float | None = None) -> list[str]:
        flags = ["--tensor-parallel-size", str(tensor_parallel)] if tensor_parallel else []
        if context_len is None:
            return flags
        # --max-num-seqs: vLLM sizes its sampler for it (default 1024 rows of float32 logits), which runs a large
        # vocabulary out of memory; the sweep never sends more than this
        return ["--max-model-len", str(context_len),
                "--gpu-memory-utilization", str(memory_fraction or self.memory_fraction),
                "--max-num-seqs", str(max_concurrency), *flags]

    def version_note(self, pair: ModelPair) -> str:
        return pair.vllm_version

    def refusal(self, pair: ModelPair, mode: str, version: str | None) -> str | None:
        from dflash_bench.model_shapes import mixes_layer_types, pair_configs

        if mode == "eagle3" and not pair.eagle3:
            return (f"{pair.name} has no EAGLE-3 head known here: pass --eagle3 (a Hugging Face id or folder) to run "
                    "the eagle3 mode")
        if mode != "dflash" or not version or not mixes_layer_types(pair_configs(pair)[1]):
            return None
        known = _version_tuple(version)
        return mixed_draft_sentence(version) if known and known <= MIXED_DRAFT_REFUSED_UP_TO else None

    def failure(self, log_tail: str) -> str | None:
        if MIXED_DRAFT_LOG in log_tail:
            return mixed_draft_sentence(None)
        return v1_runner_sentence() if MIXED_DRAFT_LOG_V1 in log_tail else None

    def caveat(self, pair: ModelPair, mode: str, version: str | None) -> str | None:
        from dflash_bench.model_shapes import pair_configs

        if mode != "dflash" or not pair.drafter:
            return None
        drafter = pair_configs(pair)[1] or {}
        cap = drafter.get("final_logit_softcapping") or (drafter.get("dflash_config") or {}).get("final_logit_softcapping")
        return softcap_sentence(version, float(cap)) if cap else None

    def local_install(self) -> tuple[bool, str] | None:
        return python_module("vllm")

    def base_command(self, pair: ModelPair) -> list[str]:
        return ["vllm", "serve", pair.target]

    def target_flags(self, pair: ModelPair, preset: str) -> list[str]:
        # The card flags work on Hopper and Blackwell alike: every preset uses them as published.
        return list(pair.vllm_flags)

    def spec_flags(self, pair: ModelPair, preset: str) -> list[str]:
        return ["--speculative-config", json.dumps(self._spec_config(pair))]

    def synthetic_refusal(self, extra_args: Sequence[str] = ()) -> str | None:
        return None

    def synthetic_spec_flags(self, pair: ModelPair, preset: str, synthetic: SyntheticProfile) -> list[str]:
        """vLLM's own synthetic rejection sampling (vllm/config/speculative.py, 0.26.0 and later), always given the
        profile's per-position rates: given a mean length alone, vLLM draws another profile (positions below tau - 1
        always accepted, the next by the fraction, none after)."""
        if len(synthetic.rates) != pair.num_speculative_tokens:
            raise UserError(f"the synthetic acceptance profile has {len(synthetic.rates)} rates and vLLM drafts "
                            f"{pair.num_speculative_tokens} tokens a step: give one rate per draft position")
        config = {**self._spec_config(pair), "rejection_sample_method": "synthetic",
                  "synthetic_acceptance_rates": list(synthetic.rates)}
        return ["--speculative-config", json.dumps(config)]

    def _spec_config(self, pair: ModelPair) -> dict:
        return {"method": "dflash", "model": pair.require_drafter(),
                "num_speculative_tokens": pair.num_speculative_tokens, **pair.vllm_spec}

    def eagle3_flags(self, pair: ModelPair, preset: str, synthetic: SyntheticProfile | None = None) -> list[str]:
        """vLLM's EAGLE-3 (`"method": "eagle3"`, the pair's head, its draft tokens); drawing `synthetic` at the same
        tau over its own draft length, as the DFlash server draws it over the block."""
        from dflash_bench.synthetic import for_draft as synthetic_for_draft

        config: dict = {"method": "eagle3", "model": pair.require_eagle3(), "num_speculative_tokens": pair.eagle3_tokens}
        if synthetic is not None:
            config.update(rejection_sample_method="synthetic",
                          synthetic_acceptance_rates=list(synthetic_for_draft(synthetic, pair.eagle3_tokens).rates))
        return ["--speculative-config", json.dumps(config)]

    def env(self, pair: ModelPair, mode: str) -> dict[str, str]:
        return dict(pair.vllm_env)

    def verify_budget(self, pair: ModelPair, mode: str, argv: Sequence[str]) -> tuple[int, int, int] | None:
        """vLLM (0.26.0's `SpeculativeConfig.max_num_new_slots_for_drafting`, read in its source) sets aside
        `num_speculative_tokens - 1` slots a row of --max-num-batched-tokens for DFlash's parallel drafting, and none
        for EAGLE-3's serial one; what is left is all a step may schedule (`max_num_scheduled_tokens`), which a verify
        of a row takes its draft length plus one of."""
        drafts = {"dflash": pair.num_speculative_tokens, "eagle3": pair.eagle3_tokens}.get(mode)
        budget = [v for v in flag_values(list(argv), ("--max-num-batched-tokens",)) if v.isdigit()]
        rows = [v for v in flag_values(list(argv), ("--max-num-seqs",)) if v.isdigit()]
        if drafts is None or not budget or not rows:
            return None
        slots = drafts - 1 if mode == "dflash" else 0
        return int(budget[-1]), int(rows[-1]) * slots, drafts + 1

    def sampler_reserve(self, pair: ModelPair, mode: str, argv: Sequence[str]) -> int:
        """vLLM (0.26.0, read in its source) sizes its KV cache after a profile whose sampler sees one draft a row
        (`_dummy_sampler_run`), where a verify's rejection sampler holds every draft position's logits: gathered,
        cast to float32 and cloned (`rejection_sampler.py`). Seen on one H200: gpt-oss-120b's DFlash at 896 rows
        (9 drafts of a 201,088-token vocabulary) died of CUDA out of memory in that clone. The rows a step verifies
        are the fewest of --max-num-seqs and what the token budget leaves (`verify_budget`)."""
        got = self.verify_budget(pair, mode, argv)
        seqs = [v for v in flag_values(list(argv), ("--max-num-seqs",)) if v.isdigit()]
        vocab = text_config(pair_configs(pair)[0] or {}).get("vocab_size")
        if got is None or not seqs or not isinstance(vocab, int):
            return 0
        budget, aside, per_row = got
        rows = min(int(seqs[-1]), max(budget - aside, 0) // per_row)
        return rows * (per_row - 2) * vocab * VERIFY_LOGIT_BYTES  # per_row - 1 drafts, one of them profiled

    def container_command(self, argv: list[str]) -> list[str]:
        # The image's entrypoint is already `vllm serve`: do not repeat it.
        return argv[2:] if argv[:2] == ["vllm", "serve"] else list(argv)
