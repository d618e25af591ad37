"""Known target/drafter pairs and the server settings their model cards publish.

`resolve(name)` takes a short name ("Qwen3-8B"), the target's or the drafter's Hugging Face id, or any
other model id or local folder together with an explicit drafter. The card flags live here; the engine
profiles in `dflash_bench.profiles` turn them into command lines.
Sources: z-lab/dflash README and the z-lab model cards, as quoted in shared/reference/dflash.md §5 and
servers.md §5.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_bench.errors import UserError

if TYPE_CHECKING:
    from dflash_bench.published import PublishedTable

# Card flag sets shared by several pairs (target flags: the AR baseline keeps them).
_VLLM_CARD = ("--attention-backend", "flash_attn", "--max-num-batched-tokens", "32768")
_SGLANG_QWEN3_CARD = (
    "--tp-size", "1", "--dtype", "bfloat16", "--attention-backend", "fa3",
    "--mem-fraction-static", "0.75", "--trust-remote-code",
)
_SGLANG_QWEN35_CARD = (
    "--tp-size", "1", "--attention-backend", "trtllm_mha", "--mem-fraction-static", "0.75",
    "--mamba-scheduler-strategy", "extra_buffer", "--trust-remote-code",
)
_SGLANG_QWEN35_ENV = {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}
# Why the gpt-oss pairs stay "not confirmed" on vLLM (docs/results/release-claims.md)
_GPT_OSS_UNRUN = ("not run here: no shape of it is recorded (the release's claim is gpt-oss-120b's, whose shape is); "
                  "vLLM renders gpt-oss chats with the Harmony encoding, so sweeps of random weights send completions "
                  "(--api completions)")
_GPT_OSS_120B_UNRUN = ("its shape is recorded (the drafter's from a third-party table of the z-lab configs) and goes "
                       "to vLLM with --api completions (mission.sh --pair gpt-oss-120b); its AR and DFlash have run on "
                       "one H200 and on two at tensor parallel 2, to 1,024 rows (docs/results/release-claims.md)")


@dataclass(frozen=True)
class ModelPair:
    """A target model, its DFlash drafter, and the settings their cards publish."""

    name: str
    target: str
    drafter: str | None
    block_size: int = 16
    thinking: bool = False  # the chat-template thinking mode the drafter was trained with
    reasoning_effort: str | None = None  # gpt-oss: "medium" per the card
    vllm_flags: tuple[str, ...] = _VLLM_CARD  # target flags, same for AR and DFlash
    vllm_spec: dict = field(default_factory=dict)  # extra keys of --speculative-config
    vllm_env: dict = field(default_factory=dict)
    vllm_version: str = "v0.20.1+"
    sglang_flags: tuple[str, ...] = _SGLANG_QWEN3_CARD
    sglang_spec_flags: tuple[str, ...] = ()  # extra DFlash-only flags (draft attention backend)
    sglang_env: dict = field(default_factory=dict)
    sglang_version: str = "with PR #22077 (DFLASH)"
    notes: str = ""
    # an EAGLE-3 head for the same target (sweep --modes ...,eagle3), and the tokens it drafts a step (the DFlash
    # blog's EAGLE-3 baseline: 7)
    eagle3: str | None = None
    eagle3_tokens: int = 7

    @property
    def num_speculative_tokens(self) -> int:
        """vLLM's `num_speculative_tokens`: the block minus its anchor slot (B - 1)."""
        return self.block_size - 1

    def published(self) -> PublishedTable | None:
        """The model card's own table for this pair (dflash_bench.published), or None where it has none."""
        from dflash_bench.published import published_for

        return published_for(self.name)

    def require_drafter(self) -> str:
        if not self.drafter:
            raise UserError(f"model {self.name} has no DFlash drafter: pass --drafter to run the dflash mode.")
        return self.drafter

    def require_eagle3(self) -> str:
        if not self.eagle3:
            raise UserError(f"model {self.name} has no EAGLE-3 head known here: pass --eagle3 (a Hugging Face id or "
                            "folder) to run the eagle3 mode.")
        return self.eagle3


def _qwen35(size: str, drafter: str | None = None, tp: int = 1, *, version: str = "3.5", notes: str = "") -> ModelPair:
    target = f"Qwen/Qwen{version}-{size}"
    sglang_flags = _SGLANG_QWEN35_CARD if tp == 1 else ("--tp-size", str(tp)) + _SGLANG_QWEN35_CARD[2:]
    vllm_flags = _VLLM_CARD if tp == 1 else _VLLM_CARD + ("--tensor-parallel-size", str(tp))
    return ModelPair(
        name=f"Qwen{version}-{size}", target=target, drafter=drafter or f"z-lab/Qwen{version}-{size}-DFlash",
        block_size=16, thinking=True, vllm_flags=vllm_flags, vllm_version="v0.20.1+ (z-lab uses PR #40898)",
        sglang_flags=sglang_flags, sglang_spec_flags=("--speculative-draft-attention-backend", "fa4"),
        sglang_env=dict(_SGLANG_QWEN35_ENV), notes=notes or "hybrid (GatedDeltaNet) target; thinking on",
    )


_GEMMA4_31B = ModelPair(
    name="gemma-4-31B-it", target="google/gemma-4-31B-it", drafter="z-lab/gemma-4-31B-it-DFlash",
    block_size=16, thinking=True,
    vllm_flags=("--attention-backend", "triton_attn", "--max-num-batched-tokens", "32768", "--trust-remote-code"),
    vllm_spec={"attention_backend": "flash_attn"}, vllm_env={"VLLM_USE_V2_MODEL_RUNNER": "1"},
    vllm_version="build of PR #41703 (pass --image)",
    sglang_flags=("--attention-backend", "triton"),
    sglang_spec_flags=("--speculative-draft-attention-backend", "fa4"),
    sglang_version="build of PR #23000 (pass --image)",
    notes="card measured on B300, thinking on, up to 5.8x at concurrency 1",
)

KNOWN: dict[str, ModelPair] = {p.name: p for p in [
    _GEMMA4_31B,
    replace(  # the MoE sibling is served with the 31B card's flags
        _GEMMA4_31B, name="gemma-4-26B-A4B-it", target="google/gemma-4-26B-A4B-it",
        drafter="z-lab/gemma-4-26B-A4B-it-DFlash", vllm_version="0.26.0+ (mixed sliding/full drafter on the V2 runner)",
        notes="MoE: 128 experts, 8 a token (3.8B of 25.2B parameters a token); flags of the gemma-4-31B-it card; "
              "the release: one H100, vLLM, tau about 7.8, 222.3 tok/s, 3.4x over AR",
    ),
    ModelPair(name="Qwen3-4B", target="Qwen/Qwen3-4B", drafter="z-lab/Qwen3-4B-DFlash-b16", notes="thinking off"),
    ModelPair(name="Qwen3-8B", target="Qwen/Qwen3-8B", drafter="z-lab/Qwen3-8B-DFlash-b16", notes="thinking off",
              eagle3="RedHatAI/Qwen3-8B-speculator.eagle3"),
    ModelPair(
        name="Qwen3-Coder-30B-A3B", target="Qwen/Qwen3-Coder-30B-A3B-Instruct",
        drafter="z-lab/Qwen3-Coder-30B-A3B-DFlash",
        notes="MoE; 8-layer drafter; B=16 assumed: not confirmed, as its drafter's config.json is quoted in nothing "
              "read here, so no shape of the pair is recorded to run (check its config.json)",
    ),
    ModelPair(
        name="Llama-3.1-8B-Instruct", target="meta-llama/Llama-3.1-8B-Instruct",
        drafter="z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat", block_size=10,
        eagle3="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        notes="gated target: needs HF_TOKEN; SGLang flags in the Qwen3 card's form (no published command)",
    ),
    ModelPair(
        name="gpt-oss-20b", target="openai/gpt-oss-20b", drafter="z-lab/gpt-oss-20b-DFlash", block_size=10,
        thinking=True, reasoning_effort="medium", vllm_version="v0.20.1+ (gpt-oss not confirmed)",
        notes="reasoning effort medium; flags in the Qwen3 card's form (no published command); vLLM not confirmed: "
              + _GPT_OSS_UNRUN,
    ),
    ModelPair(
        name="gpt-oss-120b", target="openai/gpt-oss-120b", drafter="z-lab/gpt-oss-120b-DFlash", block_size=10,
        thinking=True, reasoning_effort="medium", vllm_version="v0.20.1+ (gpt-oss not confirmed)",
        notes="card: H200, SGLang, reasoning effort medium; flags in the Qwen3 card's form; vLLM not confirmed: "
              + _GPT_OSS_120B_UNRUN,
    ),
    _qwen35("4B"),
    _qwen35("9B"),
    _qwen35("27B"),
    _qwen35("35B-A3B", notes="MoE, hybrid; card command of the z-lab README"),
    _qwen35("122B-A10B", tp=4, notes="MoE, hybrid; TP 4 is this tool's default, not the card's"),
    _qwen35("27B", version="3.6", notes="preview drafter; thinking on"),
    _qwen35("35B-A3B", version="3.6"),
]}


def known() -> list[ModelPair]:
    """The known pairs, in the order `dflash-bench models` prints them."""
    return list(KNOWN.values())


def _lookup(name: str) -> ModelPair | None:
    low = name.strip().lower()
    for pair in KNOWN.values():
        if low in (pair.name.lower(), pair.target.lower(), (pair.drafter or "").lower()):
            return pair
    return None


def _local_block_size(drafter: str) -> int | None:
    """block_size from a local drafter folder's config.json (top level or inside dflash_config)."""
    cfg = Path(drafter) / "config.json"
    if not cfg.is_file():
        return None
    try:
        data = json.loads(cfg.read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read the drafter config {cfg}: {err}.") from None
    nested = data.get("dflash_config") if isinstance(data, dict) else None
    size = (data.get("block_size") if isinstance(data, dict) else None) or (
        nested.get("block_size") if isinstance(nested, dict) else None)
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, int) or size < 2:
        raise UserError(f"the drafter config {cfg} has block_size {size!r}: expected a whole number of at least 2.")
    return size


def check_local(name: str | None, option: str = "--model") -> None:
    """Refuse, before anything launches, a name that can only be a local path (absolute, ./ ../ ~, or more than the one
    slash of a Hugging Face id) where nothing exists."""
    if not name or not name.strip() or Path(name).expanduser().exists():
        return
    text = name.strip()
    if text.startswith(("/", "./", "../", "~")) or text in (".", "..") or text.rstrip("/").count("/") > 1:
        raise UserError(f"{option} {name}: no such file or folder; give a model folder that exists, a Hugging Face "
                        "id (org/name) or a short name from `dflash-bench models`.")


def resolve(name: str, *, drafter: str | None = None, block_size: int | None = None,
            eagle3: str | None = None) -> ModelPair:
    """The pair for a short name or a Hugging Face id; any other id or folder needs `drafter` for dflash.

    Unknown short names (no "/" and not a folder) raise UserError listing the known names.
    """
    if not name or not name.strip():
        raise UserError("the model name is empty: pass a short name (see `dflash-bench models`) or a Hugging Face id.")
    pair = _lookup(name)
    if pair is None:
        looks_like_id = "/" in name or Path(name).exists()
        if not looks_like_id:
            names = ", ".join(KNOWN)
            raise UserError(f"unknown model {name!r}: use one of {names}, or a Hugging Face id with --drafter.")
        size = block_size or (_local_block_size(drafter) if drafter else None) or 16
        return ModelPair(name=name.rstrip("/").rsplit("/", 1)[-1], target=name, drafter=drafter, block_size=size,
                         eagle3=eagle3, notes="not a known pair: card flags unknown")
    if drafter or block_size:
        size = block_size or (_local_block_size(drafter) if drafter else None) or pair.block_size
        pair = replace(pair, drafter=drafter or pair.drafter, block_size=size)
    return replace(pair, eagle3=eagle3) if eagle3 else pair


def print_table() -> None:
    """`dflash-bench models`: the known pairs as a table."""
    from dflash_bench.console import new_console
    from rich.table import Table

    table = Table(title="Known target / DFlash drafter pairs")
    for col in ("name", "target", "drafter", "B", "thinking", "vLLM", "SGLang", "notes"):
        table.add_column(col, overflow="fold")
    for p in known():
        thinking = p.reasoning_effort or ("on" if p.thinking else "off")
        table.add_row(p.name, p.target, p.drafter or "-", str(p.block_size), thinking, p.vllm_version,
                      p.sglang_version, p.notes)
    new_console().print(table)
