"""Model families of the fast path: the one registry keyed by model type, and what the engine asks of a family.

A family is one module (its `Target`) plus one line in `FAMILIES`: the model types it serves, its slot layout
(`cache_layout.py`, read without torch by the pool and the sweep's fit check), the class that runs it, and the tiny
architecture (`testing/tiny.py`) its exactness tests run it as (tests/test_engine_families.py fails without one).
What differs between families is the Target's: its caches (`caches`), its kernels (`kernels`, and any of its
own beside them), whether prompts may ride a decode step (`rides`). No other module names a model type.

No torch at import: the sweep reads the layout through here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

from dflash_bench.engine.fast.models.cache_layout import CacheKind, dense_kind, gemma_kinds, split
from dflash_bench.errors import UserError

if TYPE_CHECKING:
    import torch

    from dflash_bench.engine.fast.kernels.selector import Kernels
    from dflash_bench.engine.fast.models.shard import Shard
    from dflash_bench.engine.fast.models.decoder import Index


class Target(Protocol):
    """A family's target on the fast path (`decoder.DecoderTarget` holds the shared part of one)."""

    rides: bool  # prompts may ride a decode step (`forward_mixed`; AR with --prefill mixed)
    packs: bool  # an eager prefill's matmuls may leave its padding out (`forward`'s `packed`)
    caches: list[CacheKind]  # what one slot holds (its family's layout), allocated for `slots` slots
    kernels: Kernels | None  # the step's kernels (None: torch ops)
    slots: int
    max_len: int
    vocab_size: int
    dtype: torch.dtype
    device: torch.device
    embed: torch.Tensor  # `[V, hidden]`, lent to the drafter
    head: torch.Tensor  # the output embedding `[V, hidden]`, lent to the drafter
    lm_head: torch.Tensor  # the head as this target's matmuls read it
    softcap: float | None  # final-logit softcapping
    shard: Shard  # this rank's shard of the weights (`shard.py`; size 1: all of them)
    index: Index  # its steps' index tensors (kept inside the runner's graph bodies)

    def forward(self, ids: torch.Tensor, starts: torch.Tensor, row0: int, L: int, *, last_only: bool = False,
                taps: tuple[int, ...] = (),
                on_taps: Callable[[list[torch.Tensor], torch.Tensor], None] | None = None, head: bool = True,
                pos: torch.Tensor | None = None, slot: torch.Tensor | None = None, last: torch.Tensor | None = None,
                lane: int = 0, packed: torch.Tensor | None = None,
                resumed: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def resumable(self, p: int, hi: int) -> bool:
        """Whether a slot written nowhere at or past position `hi` still holds every key a prompt resumed at
        position `p` attends to (a prefix cache's hit, `scheduling/prefix.py`)."""

    def forward_mixed(self, anchor: torch.Tensor, starts: torch.Tensor, L: int, ids: torch.Tensor,
                      slot: torch.Tensor, last: torch.Tensor, zero: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def weight_bytes(self) -> int: ...


class Drafter(Protocol):
    """The DFlash drafter on the fast path (`draft.FastDrafter`)."""

    B: int  # its block size
    c: Any  # its `DrafterConfig`
    shard: Shard  # this rank's shard of its weights
    kernels: Kernels | None
    lm_head: torch.Tensor
    index: Index

    @property
    def plain_head(self) -> bool: ...

    def hidden(self, anchors: torch.Tensor, starts: torch.Tensor, row0: int, L: int,
               pos: torch.Tensor | None = None, n: int | None = None) -> torch.Tensor: ...

    def logits(self, x: torch.Tensor) -> torch.Tensor: ...

    def write_context(self, feats: torch.Tensor | list[torch.Tensor], pos: torch.Tensor, row0: int, *,
                      lane: int = 0, slot: torch.Tensor | None = None) -> None: ...

    def weight_bytes(self) -> int: ...


def _dense() -> type:
    from dflash_bench.engine.fast.models.dense import DenseTarget

    return DenseTarget


def _gemma() -> type:
    from dflash_bench.engine.fast.models.gemma import GemmaTarget

    return GemmaTarget


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # the transformers text configs' `model_type`s it serves
    layout: Callable[..., list[CacheKind]]  # a slot's caches for (config, max_len[, ranks]) (torch-free)
    target: Callable[[], type]  # its Target class (imports torch)
    tiny: str  # the `testing/tiny.py` architecture its exactness tests build


FAMILIES = (
    Family("dense", ("qwen3", "qwen2", "llama", "mistral"), lambda cfg, n, tp=1: [dense_kind(cfg, n, tp)], _dense,
           "qwen3"),
    Family("gemma4", ("gemma4_text",), gemma_kinds, _gemma, "gemma4"),
)
MODEL_TYPES = tuple(t for f in FAMILIES for t in f.model_types)


def family_of(cfg: Any) -> Family:
    """The family of a transformers text config; one sentence when the fast path runs none."""
    kind = getattr(cfg, "model_type", "?")
    for f in FAMILIES:
        if kind in f.model_types:
            return f
    raise UserError(f"the fast path runs {', '.join(MODEL_TYPES)} models, not {kind!r}: serve without --fast")


def target_kinds(cfg: Any, max_len: int, tp: int = 1) -> list[CacheKind]:
    """The fast path's caches of a target (`pool.slot_bytes`, `sweep/fit.py`): its family's layout, on one rank of
    `tp` (its share of the KV heads)."""
    return family_of(cfg).layout(cfg, max_len, tp)


def check_split(cfg: Any, size: int) -> None:
    """Whether `size` tensor-parallel ranks split this target (a transformers text config) into whole heads and
    equal rows (`shard.py`); one sentence when not."""
    split(cfg.num_attention_heads, size, "attention heads")
    split(cfg.intermediate_size, size, "MLP rows")
    split(cfg.vocab_size, size, "vocabulary rows")
    target_kinds(cfg, 1 << 16, size)


def load_target(hf_model: Any, *, max_slots: int, max_len: int, kernels: bool | str | None = None,
                consume: bool = False, shard: Shard | None = None) -> Target:
    """The fast path's target of a loaded transformers model, by its family. `consume`: each HF layer is dropped
    once copied (a large model is then not held twice); the model cannot run after. `shard`: this rank's shard."""
    f = family_of(hf_model.config.get_text_config())
    target: Target = f.target()(hf_model, max_slots=max_slots, max_len=max_len, kernels=kernels, consume=consume,
                                shard=shard)
    return target
