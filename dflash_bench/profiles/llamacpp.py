"""llama.cpp: `llama-server -m TARGET.gguf` (image ghcr.io/ggml-org/llama.cpp:server, entrypoint llama-server).

DFlash adds `-md DRAFTER.gguf --spec-type draft-dflash --spec-draft-n-max B-1` (docs/speculative.md).
Both modes get `--metrics` (the /metrics endpoint is off by default) and `--jinja` (the chat template
stored in the GGUF renders chat requests, as the HF tokenizer's would). The HF folders are converted to
GGUF at launch with the tree's own converter (`dflash_bench.llamacpp.convert`), once per content hash.
Acceptance: deltas of `llamacpp:spec_decode_*_total` on /metrics (tools/server/server-task.cpp).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from dflash_bench.errors import UserError
from dflash_bench.models import ModelPair
from dflash_bench.profiles.base import EngineProfile

IMAGE = "ghcr.io/ggml-org/llama.cpp:server"
CUDA_IMAGE = "ghcr.io/ggml-org/llama.cpp:server-cuda"
DTYPE_ENV = "DFLASH_BENCH_GGUF_TYPE"  # f32 | bf16: the GGUF the HF weights are converted to (overrides the preset's)
# The GGUF type follows the builtin engine's dtype on the same preset: float32 on the CPU (generic), bfloat16 on
# the GPU presets. A bf16 GGUF beside the builtin engine's f32 changed the text (AR = DFlash on 18/20) and tau.
PRESET_DTYPE = {"generic": "f32", "h100": "bf16", "b300": "bf16"}
# Slots when no cell says (a server launched outside a sweep): four, each with the model's whole context.
PARALLEL = 4
# The GPU presets offload every layer; the generic preset leaves it to llama.cpp (CPU here).
PRESET_FLAGS = {"generic": [], "h100": ["-ngl", "999"], "b300": ["-ngl", "999"]}


def gguf_dtype(preset: str = "generic") -> str:
    from dflash_bench.llamacpp.convert import check_dtype

    return check_dtype(os.environ.get(DTYPE_ENV) or PRESET_DTYPE.get(preset, "bf16"))


@dataclass(frozen=True)
class LlamaCpp(EngineProfile):
    name = "llamacpp"
    image = IMAGE
    ready_path = "/health"
    acceptance = "llamacpp-metrics"
    tau_counting = ("llama.cpp shortens a request's last draft to the tokens left and does not count a step with none; "
                    "drafts accepted past EOS still count (server-context.cpp, n_draft_accepted)")
    client_tau = "timings"  # each response's timings.draft_n_accepted over its decode steps
    slots_per_cell = True
    # A server per concurrency still serves every suite, repeat and --thinking value of it, and llama.cpp keeps each
    # slot's last prompt and, in host memory (--cache-ram), the prompts its slots held before: a repeat's prompts
    # would all be found there. A sweep's server erases every slot before each cell; POST /slots is refused without
    # --slot-save-path, which names a folder that exists in any runner (nothing is saved: only erase is sent), and
    # erasing leaves the host-memory cache, so that is off.
    cache_reset = "/slots/{slot}?action=erase"
    cache_reset_flags = ("--cache-ram", "0", "--slot-save-path", "/tmp")
    cache_reset_keeps = {"--cache-ram": "the prompts its slots held stay in host memory, where erasing the slots "
                                        "leaves them"}
    default_port = 8080
    runner = "process"  # the CPU build `dflash-bench engines build llamacpp` installs; docker on GPU hosts
    needs_gpu = False

    def base_command(self, pair: ModelPair) -> list[str]:
        return ["llama-server", "-m", pair.target]

    def target_flags(self, pair: ModelPair, preset: str) -> list[str]:
        return list(PRESET_FLAGS[preset])

    def slot_flags(self, pair: ModelPair, slots: tuple[int, int] | None) -> list[str]:
        """--parallel = the cell's concurrency, each slot its own KV cache of the context the cells need (a
        unified cache of the model's 2,048 tokens shared by 4 slots made the drafter skip drafts at 4)."""
        n, per_slot = slots if slots else (PARALLEL, model_context(pair.target) or 4096)
        return ["--parallel", str(n), "-c", str(n * per_slot), "--no-kv-unified"]

    def weights(self, preset: str) -> str | None:
        return f"GGUF {gguf_dtype(preset)}"

    def spec_flags(self, pair: ModelPair, preset: str) -> list[str]:
        return ["-md", pair.require_drafter(), "--spec-type", "draft-dflash",
                "--spec-draft-n-max", str(pair.num_speculative_tokens)]

    def harness_flags(self) -> list[str]:
        return ["--metrics", "--jinja", "--no-webui"]

    def image_for(self, preset: str) -> str:
        return IMAGE if preset == "generic" else CUDA_IMAGE

    def container_command(self, argv: list[str]) -> list[str]:
        # The image's entrypoint is already llama-server.
        return argv[1:] if argv[:1] == ["llama-server"] else list(argv)

    def local_install(self) -> tuple[bool, str] | None:
        from dflash_bench.llamacpp.server_build import find_server

        found = find_server()
        return (True, str(found)) if found else (False, "not found (dflash-bench engines build llamacpp)")

    def serve_pair(self, pair: ModelPair, mode: str, convert: bool, preset: str = "generic") -> ModelPair:
        """The pair as GGUF files: converted (once per content hash) when `convert`, else the planned paths."""
        from dflash_bench.llamacpp import convert as conv

        dtype = gguf_dtype(preset)
        if pair.target.endswith(".gguf"):  # already converted by the user: served as given
            return pair
        target = _folder(pair.target, convert)
        drafter = _folder(pair.require_drafter(), convert) if mode == "dflash" else None
        if drafter is not None and str(drafter).endswith(".gguf"):
            d: str | None = str(drafter)
        elif drafter is None:
            d = None
        elif convert:
            d = str(conv.gguf_for(drafter, dtype, target_dir=target, log=_say))
        else:
            d = str(conv.gguf_path(drafter, dtype, target)) if drafter.is_dir() and target.is_dir() \
                else _planned(pair.require_drafter(), dtype)
        if convert:
            t = str(conv.gguf_for(target, dtype, log=_say))
        else:
            t = str(conv.gguf_path(target, dtype)) if target.is_dir() else _planned(pair.target, dtype)
        return replace(pair, target=t, drafter=d or pair.drafter)

    def process_argv(self, argv: list[str]) -> list[str]:
        """llama-server from PATH, else the one `dflash-bench engines build llamacpp` installed."""
        from dflash_bench.llamacpp.server_build import find_server

        if argv[:1] != ["llama-server"]:
            return list(argv)
        found = find_server()
        if found is None:
            raise UserError("llama-server is not on PATH and not built here: run `dflash-bench engines build "
                            "llamacpp` (a CPU build from PyPI's llama-cpp-python sdist), or use --runner docker.")
        from dflash_bench.llamacpp.server_build import check_server_version

        check_server_version(found)
        return [str(found), *argv[1:]]


def model_context(ref: str) -> int | None:
    """The positions the model was trained for (config.json max_position_embeddings), where a local folder says."""
    import json

    path = Path(ref).expanduser()
    path = path if path.is_dir() else path.parent
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    n = config.get("max_position_embeddings") or (config.get("text_config") or {}).get("max_position_embeddings")
    return n if isinstance(n, int) and n > 0 else None


def _folder(ref: str, download: bool) -> Path:
    """A local model folder for `ref` (a folder, or a Hugging Face id fetched into the HF cache)."""
    path = Path(ref).expanduser()
    if path.is_dir() or path.suffix == ".gguf":
        return path
    if not download:
        return path
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UserError(f"{ref} is not a local folder, and huggingface_hub is not installed to download it.") from None
    return Path(snapshot_download(ref))


def _planned(ref: str, dtype: str) -> str:
    return f"<{ref} as GGUF {dtype}, converted at launch>"


def _say(line: str) -> None:
    import sys

    print(line, file=sys.stderr)
