"""vLLM: `vllm serve TARGET` (image vllm/vllm-openai, whose entrypoint is `vllm serve`).

DFlash adds `--speculative-config {"method": "dflash", "model": DRAFTER, "num_speculative_tokens": B-1}`.
Acceptance: Δ of the `vllm:spec_decode_*_total` counters on /metrics (always on).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from dflash_bench.profiles.base import EngineProfile, python_module
from dflash_bench.models import ModelPair

DEFAULT_IMAGE = "vllm/vllm-openai:v0.29.0"


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

    def version_note(self, pair: ModelPair) -> str:
        return pair.vllm_version

    def local_install(self) -> tuple[bool, str] | None:
        return python_module("vllm")

    def base_command(self, pair: ModelPair) -> list[str]:
        return ["vllm", "serve", pair.target]

    def target_flags(self, pair: ModelPair, preset: str) -> list[str]:
        # The card flags work on Hopper and Blackwell alike: every preset uses them as published.
        return list(pair.vllm_flags)

    def spec_flags(self, pair: ModelPair, preset: str) -> list[str]:
        config = {"method": "dflash", "model": pair.require_drafter(),
                  "num_speculative_tokens": pair.num_speculative_tokens, **pair.vllm_spec}
        return ["--speculative-config", json.dumps(config)]

    def env(self, pair: ModelPair, mode: str) -> dict[str, str]:
        return dict(pair.vllm_env)

    def container_command(self, argv: list[str]) -> list[str]:
        # The image's entrypoint is already `vllm serve`: do not repeat it.
        return argv[2:] if argv[:2] == ["vllm", "serve"] else list(argv)
