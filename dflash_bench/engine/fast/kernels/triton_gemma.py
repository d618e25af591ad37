"""Gemma 4's small fused kernels (Triton), so that a layer's step is the matmuls, the attention and two launches.

- `qkv_norm_rope_store`: from the fused q/k/v projection, in one launch: the q RMSNorm (weight `qn`, shared by
  the heads), the k RMSNorm (`kn`), the v RMSNorm (no weight), NeoX RoPE on q and k from float32 tables by
  position (a full layer's partial "proportional" rotary is in its table: the unrotated pairs have frequency 0,
  i.e. cos 1 and sin 0), q to its own tensor and k, v into a cache at (row, at): `at` is the position for a
  cache of every position, the ring row for a sliding layer's ring. The torch reference is `gemma.qkv_torch`.
- `gelu_mul`: tanh GELU of the gate times up, over the fused gate/up projection.
- `norm_add_norm`: Gemma's sandwich norm in one launch: the block's output normed (its post norm), added to the
  residual (times the layer's scalar after the MLP), and the sum normed for what comes next; the same roundings
  as `triton_ops.rms_norm` then `triton_ops.add_rms_norm` (or torch's `(h + m) * scalar` then `rms_norm`).

Statistics and RoPE run in float32 and each output is rounded once (the torch path rounds after each op, so the
two agree to a rounding in half types and to float32's precision in float32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dflash_bench.engine.fast.kernels.triton_ops import act_mul, norm_warps


@triton.jit
def _qkv_kernel(qkv_ptr, stride_t, q_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, rows_ptr, pos_ptr, at_ptr,
                k_ptr, v_ptr, s_slot, s_pos, s_head, eps,
                NQ: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr, G: tl.constexpr):
    """Program (token t, head group): G consecutive heads of the NQ query, then HKV key, then HKV value heads."""
    t = tl.program_id(0)
    hh = tl.program_id(1) * G + tl.arange(0, G)  # [G] head index
    half = tl.arange(0, HD // 2)
    is_q = (hh < NQ)[:, None]
    is_k = ((hh >= NQ) & (hh < NQ + HKV))[:, None]
    is_v = ((hh >= NQ + HKV) & (hh < NQ + 2 * HKV))[:, None]
    src = qkv_ptr + t * stride_t + hh[:, None] * HD + half[None, :]
    there = (hh < NQ + 2 * HKV)[:, None]
    f1 = tl.load(src, mask=there, other=0.0).to(tl.float32)
    f2 = tl.load(src + HD // 2, mask=there, other=0.0).to(tl.float32)
    r = tl.rsqrt((tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)) / HD + eps)[:, None]
    wq1 = tl.load(qn_ptr + half).to(tl.float32)[None, :]
    wq2 = tl.load(qn_ptr + HD // 2 + half).to(tl.float32)[None, :]
    wk1 = tl.load(kn_ptr + half).to(tl.float32)[None, :]
    wk2 = tl.load(kn_ptr + HD // 2 + half).to(tl.float32)[None, :]
    f1 = f1 * r * tl.where(is_q, wq1, tl.where(is_k, wk1, 1.0))  # values: normed without a weight
    f2 = f2 * r * tl.where(is_q, wq2, tl.where(is_k, wk2, 1.0))
    pos = tl.load(pos_ptr + t)
    c = tl.load(cos_ptr + pos * (HD // 2) + half)[None, :]
    sn = tl.load(sin_ptr + pos * (HD // 2) + half)[None, :]
    y1 = f1 * c - f2 * sn  # NeoX: x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1)
    y2 = f2 * c + f1 * sn
    q_dst = q_ptr + (t * NQ + hh[:, None]) * HD + half[None, :]
    tl.store(q_dst, y1.to(q_ptr.dtype.element_ty), mask=is_q)
    tl.store(q_dst + HD // 2, y2.to(q_ptr.dtype.element_ty), mask=is_q)
    row = tl.load(rows_ptr + t) * s_slot + tl.load(at_ptr + t) * s_pos
    k_dst = k_ptr + row + (hh[:, None] - NQ) * s_head + half[None, :]
    tl.store(k_dst, y1.to(k_ptr.dtype.element_ty), mask=is_k)
    tl.store(k_dst + HD // 2, y2.to(k_ptr.dtype.element_ty), mask=is_k)
    v_dst = v_ptr + row + (hh[:, None] - NQ - HKV) * s_head + half[None, :]
    tl.store(v_dst, f1.to(v_ptr.dtype.element_ty), mask=is_v)  # values: no RoPE
    tl.store(v_dst + HD // 2, f2.to(v_ptr.dtype.element_ty), mask=is_v)


HEADS = 4  # heads per program (as triton_ops.qk_rope_store)
WARPS = 4


def fits(hd: int) -> bool:
    """Whether `qkv_norm_rope_store` runs this head size (its halves are one power-of-two block)."""
    return hd >= 4 and hd & (hd - 1) == 0


def qkv_norm_rope_store(qkv: torch.Tensor, nq: int, hkv: int, hd: int, qn: torch.Tensor, kn: torch.Tensor,
                        cos: torch.Tensor, sin: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor,
                        at: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, eps: float) -> torch.Tensor:
    """From `qkv` `[t, (nq + 2 hkv) hd]`: return q `[t, nq, hd]`, normed and rotated, and write k (normed,
    rotated) and v (normed) to `kc[rows, at]`, `vc[rows, at]`.

    qn, kn: `[hd]` norm weights. cos, sin: float32 `[positions, hd / 2]` (`rope.kernel_tables`). rows, pos, at:
    `[t]` each token's cache row, position (its RoPE angle) and place in the row. kc, vc: `[rows, places, hkv, hd]`
    (any such strides, equal for both).
    """
    t = qkv.shape[0]
    assert fits(hd) and qkv.stride(1) == 1 and kc.stride() == vc.stride() and kc.stride(3) == 1
    assert qn.is_contiguous() and kn.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()
    rows, pos, at = rows.contiguous(), pos.contiguous(), at.contiguous()  # read flat
    q = torch.empty((t, nq, hd), dtype=qkv.dtype, device=qkv.device)
    heads = nq + 2 * hkv
    g = min(HEADS, triton.next_power_of_2(heads))
    _qkv_kernel[(t, triton.cdiv(heads, g))](
        qkv, qkv.stride(0), q, qn, kn, cos, sin, rows, pos, at, kc, vc, kc.stride(0), kc.stride(1), kc.stride(2),
        eps, NQ=nq, HKV=hkv, HD=hd, G=g, num_warps=WARPS)
    return q


def gelu_mul(gu: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up for `gu` `[t, 2 n]` (triton_ops.act_mul, the kernel SiLU's path uses too)."""
    return act_mul(gu, gelu=True)


@triton.jit
def _norm_add_norm_kernel(h_ptr, a_ptr, wa_ptr, wn_ptr, sum_ptr, out_ptr, n, eps, scalar, BLOCK: tl.constexpr,
                          SCALE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    keep = cols < n
    a = tl.load(a_ptr + row * n + cols, mask=keep, other=0.0).to(tl.float32)
    ra = tl.rsqrt(tl.sum(a * a, axis=0) / n + eps)
    wa = tl.load(wa_ptr + cols, mask=keep, other=0.0).to(tl.float32)
    m = (a * ra * wa).to(sum_ptr.dtype.element_ty).to(tl.float32)  # the post norm, rounded as its own launch
    h = tl.load(h_ptr + row * n + cols, mask=keep, other=0.0).to(tl.float32)
    s = (h + m).to(sum_ptr.dtype.element_ty)
    if SCALE:
        s = (s.to(tl.float32) * scalar).to(sum_ptr.dtype.element_ty)
    tl.store(sum_ptr + row * n + cols, s, mask=keep)
    x = s.to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)
    w = tl.load(wn_ptr + cols, mask=keep, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n + cols, (x * r * w).to(out_ptr.dtype.element_ty), mask=keep)


def norm_add_norm(h: torch.Tensor, a: torch.Tensor, wa: torch.Tensor, wn: torch.Tensor, eps: float,
                  scalar: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """`(s, rms_norm(s) * wn)` with `s = (h + rms_norm(a) * wa) * scalar`, for contiguous `[t, n]` h and a."""
    t, n = h.shape
    assert h.is_contiguous() and a.is_contiguous() and a.shape == h.shape
    s, out = torch.empty_like(h), torch.empty_like(h)
    block = triton.next_power_of_2(n)
    _norm_add_norm_kernel[(t,)](h, a, wa, wn, s, out, n, eps, scalar, BLOCK=block, SCALE=scalar != 1.0,
                                num_warps=norm_warps(block))
    return s, out
