"""Rotary position embedding (NeoX rotate-half), the one reference: the drafter, the fast path's torch ops
and the tests of its Triton kernels all use these (the reference target runs Hugging Face's own)."""

from __future__ import annotations

import torch


def inv_freq(head_dim: int, theta: float, device: torch.device | str | None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The rotation frequencies `[head_dim / 2]`, in `dtype` (float32 as HF; float64 for float64 models)."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=dtype) / head_dim))


def cos_sin(pos: torch.Tensor, freqs: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin `[..., 1, head_dim]` of positions `pos` `[...]`: angles in `freqs`' precision, then cast.

    `scale`: HF's attention scaling of scaled RoPE variants, folded into both."""
    f = pos.to(freqs.dtype)[..., None] * freqs
    emb = torch.cat([f, f], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype)[..., None, :], sin.to(dtype)[..., None, :]


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on x `[..., heads, head_dim]` with `cos_sin`'s tables."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def kernel_tables(pos: torch.Tensor, freqs: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`cos_sin`'s angles as the Triton kernels read them: float32 cos and sin `[t, head_dim / 2]` (the halves
    are equal), built once for every position of a cache so that a step does not recompute them."""
    f = pos.float()[:, None] * freqs.float()
    return (f.cos() * scale).contiguous(), (f.sin() * scale).contiguous()
