"""Slot-based static KV cache and the per-row attention masks that make rollback free.

Each sequence owns a slot: a row of a preallocated `[slots, max_len, kv_heads, head_dim]` buffer per layer.
K/V are written at absolute positions; a row only ever attends to positions below its own length, so
"rolling back" rejected drafts is just not counting them (they are overwritten by the next step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class SlotCache:
    """Per-layer K/V buffers indexed by (slot, position); `shapes`: each layer's (KV heads, head size)."""

    def __init__(self, shapes: list[tuple[int, int]], slots: int, max_len: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        self.k = [torch.zeros((slots, max_len, h, d), dtype=dtype, device=device) for h, d in shapes]
        self.v = [torch.zeros((slots, max_len, h, d), dtype=dtype, device=device) for h, d in shapes]
        self.max_len = max_len

    def write(self, layer: int, slots: torch.Tensor, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v `[bs, q, kv_heads, hd]` at `pos` `[bs, q]` of each row's slot."""
        rows = slots[:, None].expand_as(pos)
        self.k[layer][rows, pos] = k
        self.v[layer][rows, pos] = v

    def read(self, layer: int, slots: torch.Tensor, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of the first `kv_len` positions of each slot, as `[bs, kv_heads, kv_len, hd]`."""
        return self.k[layer][slots, :kv_len].transpose(1, 2), self.v[layer][slots, :kv_len].transpose(1, 2)


def row_mask(starts: torch.Tensor, q_len: int, kv_len: int, *, causal: bool, window: int | None = None) -> torch.Tensor:
    """Boolean `[bs, 1, q_len, kv_len]`: which keys each query of each row may see.

    Query j of row b sits at position `starts[b] + j`. Causal: keys at positions <= its own (bottom-right
    aligned per row). Non-causal (the DFlash block): every key below `starts[b] + q_len`.
    """
    qpos = starts[:, None] + torch.arange(q_len, device=starts.device)  # [bs, q]
    kpos = torch.arange(kv_len, device=starts.device)[None, None, :]
    if causal:
        vis = kpos <= qpos[:, :, None]
    else:
        vis = kpos < (starts + q_len)[:, None, None].expand(-1, q_len, 1)
    if window is not None:
        vis = vis & (qpos[:, :, None] - kpos < window)
        if not causal:
            vis = vis & (kpos - qpos[:, :, None] < window)
    return vis[:, None]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
           softcap: float | None = None) -> torch.Tensor:
    """Attention of q `[bs, H, q, hd]` over k, v `[bs, Hkv, kv, hd]` (GQA) -> `[bs, q, H, hd]`."""
    if softcap is None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        return out.transpose(1, 2)
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    w = torch.matmul(q, k.transpose(2, 3)) * scale
    w = torch.tanh(w / softcap) * softcap
    w = w.masked_fill(~mask, float("-inf")).softmax(-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(w, v).transpose(1, 2)
