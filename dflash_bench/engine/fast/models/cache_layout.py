"""What one slot of the fast path's KV pool holds, kind of layer by kind of layer: the one layout its caches are
allocated from (`dense.DenseTarget`, `gemma.GemmaTarget`, `draft.FastDrafter`; `family.FAMILIES` says which
family's layout a target has) and that sizes the pool
(`pool.slot_bytes`) and the sweep's check of a builtin plan (`sweep/fit.py`); and the reference engine's, which
`target.ReferenceTarget` and `propose.DFlashProposer` allocate from the same `kv_shapes` and drafter geometry. No torch:
the sweep reads it.

A kind's `layers` caches hold K and V of `[slots, rows, kv heads, head size]` each. Gemma 4 with
`attention_k_eq_v` stores its value too: the value is the raw key normed without a weight and not rotated, so it
is not the stored key. A sliding layer of Gemma 4 keeps a ring of its window plus `RING_MARGIN` positions (and a
spare row a prefill's padding is written to) once that is shorter than `max_len`; every other layer, the
drafter's sliding ones included, keeps `max_len` positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dflash_bench.engine.reference.layers import kv_shapes, layer_config
from dflash_bench.errors import UserError

RING_MARGIN = 48  # ring rows past the window: at least the most new tokens a step writes per row (a 16-token block)
GEMMA_KINDS = ("sliding_attention", "full_attention")  # GemmaTarget's kinds, in its order (a layer's `kind` index)


def split(n: int, size: int, what: str) -> int:
    """One tensor-parallel rank's share of `n` heads (or rows) among `size` ranks (`shard.py`); one sentence when
    `size` does not divide them."""
    if n % size:
        raise UserError(f"--tensor-parallel-size {size} does not divide the {n} {what}: use a size that divides it")
    return n // size


@dataclass(frozen=True)
class CacheKind:
    """The cache of one kind of layer, per slot."""

    layers: int
    hkv: int  # KV heads
    hd: int  # head size
    rows: int  # positions a slot keeps: max_len, or a ring's `ring` + 1 (its spare row)
    window: int | None = None
    ring: int = 0  # 0: position p at row p; else key p at row p % ring

    def slot_bytes(self, dtype_bytes: int) -> int:
        """K and V of one slot in every layer of this kind."""
        return 2 * self.layers * self.rows * self.hkv * self.hd * dtype_bytes


def gemma_kinds(cfg: Any, max_len: int, tp: int = 1) -> list[CacheKind]:
    """A Gemma 4 text target's caches (a transformers config): its sliding layers, then its full ones, each with
    the KV heads and head size of its first layer (`layers.layer_config`); `tp`: a rank's of that many (its share
    of each kind's KV heads)."""
    out = []
    for kind in GEMMA_KINDS:
        ids = [i for i, t in enumerate(cfg.layer_types) if t == kind]
        c = layer_config(cfg, ids[0]) if ids else cfg
        window = cfg.sliding_window if kind == "sliding_attention" else None
        ring = window + RING_MARGIN if window is not None and window + RING_MARGIN < max_len else 0
        hkv = split(c.num_key_value_heads, tp, f"KV heads of the {kind.replace('_', ' ')} layers")
        out.append(CacheKind(len(ids), hkv, c.head_dim, ring + 1 if ring else max_len, window, ring))
    return out


def dense_kind(cfg: Any, max_len: int, tp: int = 1) -> CacheKind:
    """A dense target's one cache (`decoder.KVCache`: Qwen3, Qwen2, Llama, Mistral): every layer keeps `max_len`;
    `tp`: a rank's of that many."""
    heads = cfg.num_attention_heads
    hkv = getattr(cfg, "num_key_value_heads", None) or heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return CacheKind(cfg.num_hidden_layers, split(hkv, tp, "KV heads"), hd, max_len)


def drafter_kind(dc: Any, max_len: int, tp: int = 1) -> CacheKind:
    """A DFlash drafter's cache (a `DrafterConfig`): every layer, sliding or not, keeps `max_len` positions."""
    return CacheKind(dc.num_hidden_layers, split(dc.num_key_value_heads, tp, "KV heads of the drafter"), dc.head_dim,
                     max_len)


def check_drafter_split(dc: Any, size: int) -> None:
    """Whether `size` tensor-parallel ranks split this drafter (a `DrafterConfig`) into whole heads and equal rows
    (`shard.py`); one sentence when not. The target's: `family.check_split`."""
    split(dc.num_attention_heads, size, "attention heads of the drafter")
    split(dc.intermediate_size, size, "MLP rows of the drafter")
    drafter_kind(dc, 1, size)


def reference_kinds(cfg: Any, max_len: int) -> list[CacheKind]:
    """The reference engine's caches of a target (`slot_cache.SlotCache` over `layers.kv_shapes`, serve without
    --fast): every layer, sliding or not, keeps `max_len` positions."""
    return [CacheKind(1, hkv, hd, max_len) for hkv, hd in kv_shapes(cfg)]
