"""The fast path's small fused kernels (Triton), so a decode step is a few launches per layer, not twenty.

- `add_rms_norm`: one program per token row, float32 statistics; adds the residual (`h + a`, rounded as
  torch rounds it) and returns both the sum and its norm, so the matmuls before it need no residual
  epilogue (cuBLAS's addmm copies the residual first).
- `qk_rope_store`: split the fused q/k/v projection, Qwen3's per-head q/k RMSNorm, NeoX RoPE, and the K/V
  cache write, in one launch (q comes back `[t, H, hd]`, k and v go straight into their cache slots).
- `silu_mul`: silu(gate) * up over the fused gate/up projection.
- `rms_norm` (no residual); `embed_norm`: a step's embedding rows and the first layer's norm of them;
  `argmax` over the vocabulary in two short launches.
- `commit`: the end of a decode step (greedy or synthetic acceptance, then the per-slot state), one launch.

Each computes in float32 and rounds once on store. The torch versions in `decoder.py` are the reference; the
tests compare the two in Triton's interpreter (no GPU there).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def norm_warps(block: int) -> int:
    """8 warps for rows of 2048+ (H100, hidden 4096: 1.6 us a call vs 2.0 with 4; benchmarks/speed/kernel_tuning.py)."""
    return 8 if block >= 2048 else 4


@triton.jit
def _add_rms_norm_kernel(h_ptr, a_ptr, w_ptr, sum_ptr, out_ptr, n, eps, BLOCK: tl.constexpr, ADD: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    keep = cols < n
    h = tl.load(h_ptr + row * n + cols, mask=keep, other=0.0).to(tl.float32)
    if ADD:
        a = tl.load(a_ptr + row * n + cols, mask=keep, other=0.0).to(tl.float32)
        s = (h + a).to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * n + cols, s, mask=keep)
        x = s.to(tl.float32)
    else:
        x = h
    r = tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)
    w = tl.load(w_ptr + cols, mask=keep, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n + cols, (x * r * w).to(out_ptr.dtype.element_ty), mask=keep)


def add_rms_norm(h: torch.Tensor, a: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`(h + a, rms_norm(h + a) * w)` for contiguous `[t, n]` h and a."""
    t, n = h.shape
    assert h.is_contiguous() and a.is_contiguous() and a.shape == h.shape
    s, out = torch.empty_like(h), torch.empty_like(h)
    block = triton.next_power_of_2(n)
    _add_rms_norm_kernel[(t,)](h, a, w, s, out, n, eps, BLOCK=block, num_warps=norm_warps(block), ADD=True)
    return s, out


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """`rms_norm(x) * w` for a contiguous `[t, n]` x (the first layer's norm; the drafter's context norm)."""
    t, n = x.shape
    assert x.is_contiguous()
    out = torch.empty_like(x)
    block = triton.next_power_of_2(n)
    _add_rms_norm_kernel[(t,)](x, x, w, out, out, n, eps, BLOCK=block, num_warps=norm_warps(block), ADD=False)
    return out


@triton.jit
def _embed_norm_kernel(ids_ptr, s_b, s_j, emb_ptr, w_ptr, h_ptr, out_ptr, n_tok, hidden, scale, eps, fill,
                       BLOCK: tl.constexpr, FILL: tl.constexpr):
    """Program per token row r = b * n_tok + j: its embedding row (times scale) and that row's RMSNorm."""
    r = tl.program_id(0)
    b = r // n_tok
    j = r % n_tok
    if FILL:  # the DFlash block: the anchor, then the mask token
        tok = tl.load(ids_ptr + b * s_b)
        tok = tl.where(j == 0, tok, fill)
    else:
        tok = tl.load(ids_ptr + b * s_b + j * s_j)
    cols = tl.arange(0, BLOCK)
    keep = cols < hidden
    e = tl.load(emb_ptr + tok * hidden + cols, mask=keep, other=0.0).to(tl.float32)
    h = (e * scale).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + r * hidden + cols, h, mask=keep)
    x = h.to(tl.float32)
    rs = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    w = tl.load(w_ptr + cols, mask=keep, other=0.0).to(tl.float32)
    tl.store(out_ptr + r * hidden + cols, (x * rs * w).to(out_ptr.dtype.element_ty), mask=keep)


def embed_norm(ids: torch.Tensor, embed: torch.Tensor, w: torch.Tensor, eps: float, scale: float = 1.0,
               n: int | None = None, fill: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`(h, rms_norm(h) * w)` with h `[bs * n, hidden]` = `embed[tokens] * scale` in one launch: tokens = ids
    `[bs, n]` (any strides), or with `fill`, `[ids[b, 0], fill x (n - 1)]` per row (the DFlash block; ids
    may then be `[bs]`)."""
    ids = ids[:, None] if ids.dim() == 1 else ids
    bs = ids.shape[0]
    n = ids.shape[1] if n is None else n
    hidden = embed.shape[1]
    assert embed.is_contiguous()
    h = torch.empty(bs * n, hidden, dtype=embed.dtype, device=embed.device)
    out = torch.empty_like(h)
    block = triton.next_power_of_2(hidden)
    _embed_norm_kernel[(bs * n,)](ids, ids.stride(0), ids.stride(1), embed, w, h, out, n, hidden, scale, eps,
                                  -1 if fill is None else fill, BLOCK=block, FILL=fill is not None,
                                  num_warps=norm_warps(block))
    return h, out


@triton.jit
def _argmax_chunk_kernel(x_ptr, stride, n, val_ptr, idx_ptr, chunks, BLOCK: tl.constexpr):
    """Program (row, chunk): the max of one chunk of a row and the first column holding it."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    cols = c * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + r * stride + cols, mask=cols < n, other=float("-inf")).to(tl.float32)
    m = tl.max(x, 0)
    tl.store(val_ptr + r * chunks + c, m)
    tl.store(idx_ptr + r * chunks + c, tl.min(tl.where(x == m, cols, n), 0))


@triton.jit
def _argmax_rows_kernel(val_ptr, idx_ptr, out_ptr, chunks, n, per_row, s_row, s_col, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    ok = c < chunks
    v = tl.load(val_ptr + r * chunks + c, mask=ok, other=float("-inf"))
    i = tl.load(idx_ptr + r * chunks + c, mask=ok, other=n)
    dst = out_ptr + (r // per_row) * s_row + (r % per_row) * s_col
    tl.store(dst, tl.min(tl.where(v == tl.max(v, 0), i, n), 0).to(tl.int64))


ARGMAX_CHUNK = 4096


def argmax(logits: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """`logits.argmax(-1)` (the first index of the max, as torch) over rows of a vocabulary: every chunk of
    every row in parallel, then one program a row (torch's reduction gives one row only a few blocks: 9 us
    for Qwen3's 151,936 columns on an H100). `logits` `[bs, n, V]` (or `[rows, V]`); `out`: an int64 `[bs, n]`
    to write into (any strides, e.g. the drafts' columns of the runner's token rows)."""
    n = logits.shape[-1]
    x = logits.reshape(-1, n)
    assert x.stride(1) == 1
    rows, chunks = x.shape[0], triton.cdiv(n, ARGMAX_CHUNK)
    val, idx = chunk_maxima(rows, chunks, x.device)
    _argmax_chunk_kernel[(rows, chunks)](x, x.stride(0), n, val, idx, chunks, BLOCK=ARGMAX_CHUNK, num_warps=8)
    return pick_chunk(val, idx, n, torch.empty(logits.shape[:-1], dtype=torch.int64, device=x.device)
                      if out is None else out)


def chunk_maxima(rows: int, chunks: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Buffers for each row's max per column chunk (float32) and its first column (int32)."""
    return (torch.empty(rows, chunks, dtype=torch.float32, device=device),
            torch.empty(rows, chunks, dtype=torch.int32, device=device))


def pick_chunk(val: torch.Tensor, idx: torch.Tensor, n: int, out: torch.Tensor) -> torch.Tensor:
    """The second stage of a greedy argmax: per row, the first column of the best chunk maximum, into `out`
    (int64 `[rows]`, or any `[bs, k]` view with bs * k = rows)."""
    rows, chunks = val.shape
    o2 = out.view(-1, 1) if out.dim() == 1 else out
    assert out.dtype == torch.int64 and o2.dim() == 2 and o2.numel() == rows
    _argmax_rows_kernel[(rows,)](val, idx, o2, chunks, n, o2.shape[1], o2.stride(0), o2.stride(1),
                                 BLOCK=max(triton.next_power_of_2(chunks), 2))
    return out


@triton.jit
def _qk_rope_store_kernel(qkv_ptr, stride_t, q_ptr, w_ptr, cos_ptr, sin_ptr, rows_ptr, pos_ptr,
                          k_ptr, v_ptr, s_slot, s_pos, s_head, eps,
                          NQ: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr, NORM: tl.constexpr,
                          G: tl.constexpr):
    """Program (token t, head group): G consecutive heads of the NQ query, then HKV key, then HKV value heads."""
    t = tl.program_id(0)
    hh = tl.program_id(1) * G + tl.arange(0, G)  # [G] head index
    half = tl.arange(0, HD // 2)
    is_q = hh < NQ
    is_k = (hh >= NQ) & (hh < NQ + HKV)
    is_v = (hh >= NQ + HKV) & (hh < NQ + 2 * HKV)
    src = qkv_ptr + t * stride_t + hh[:, None] * HD + half[None, :]
    there = (hh < NQ + 2 * HKV)[:, None]
    x1 = tl.load(src, mask=there, other=0.0)
    x2 = tl.load(src + HD // 2, mask=there, other=0.0)
    slot = tl.load(rows_ptr + t)
    pos = tl.load(pos_ptr + t)
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    if NORM:  # q/k norm weights: one row per query head, then one per key head
        r = tl.rsqrt((tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)) / HD + eps)[:, None]
        wrow = w_ptr + hh[:, None] * HD + half[None, :]
        qk = (is_q | is_k)[:, None]
        f1 = f1 * r * tl.load(wrow, mask=qk, other=0.0).to(tl.float32)
        f2 = f2 * r * tl.load(wrow + HD // 2, mask=qk, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + pos * (HD // 2) + half)[None, :]
    sn = tl.load(sin_ptr + pos * (HD // 2) + half)[None, :]
    y1 = f1 * c - f2 * sn  # NeoX: x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1)
    y2 = f2 * c + f1 * sn
    q_dst = q_ptr + (t * NQ + hh[:, None]) * HD + half[None, :]
    tl.store(q_dst, y1.to(q_ptr.dtype.element_ty), mask=is_q[:, None])
    tl.store(q_dst + HD // 2, y2.to(q_ptr.dtype.element_ty), mask=is_q[:, None])
    kv_row = slot * s_slot + pos * s_pos
    k_dst = k_ptr + kv_row + (hh[:, None] - NQ) * s_head + half[None, :]
    tl.store(k_dst, y1.to(k_ptr.dtype.element_ty), mask=is_k[:, None])
    tl.store(k_dst + HD // 2, y2.to(k_ptr.dtype.element_ty), mask=is_k[:, None])
    v_dst = v_ptr + kv_row + (hh[:, None] - NQ - HKV) * s_head + half[None, :]
    tl.store(v_dst, x1, mask=is_v[:, None])  # values: copied as they are
    tl.store(v_dst + HD // 2, x2, mask=is_v[:, None])


ROPE_HEADS = 4  # heads per program of qk_rope_store: on an H100 1.2 us for one token, 1.6 for 16 (16 heads: 1.7, 1.8)
ROPE_WARPS = 4


def qk_rope_store(qkv: torch.Tensor, nq: int, hkv: int, hd: int, cos: torch.Tensor, sin: torch.Tensor,
                  rows: torch.Tensor, pos: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                  wqk: torch.Tensor | None, eps: float) -> torch.Tensor | None:
    """From `qkv` `[t, (nq + 2 hkv) hd]`: return q `[t, nq, hd]` (None if nq == 0) and write k, v to the cache.

    cos, sin: float32 tables `[max_len, hd / 2]` by position (attention scaling folded in). rows, pos: `[t]`
    slot and position of each token. kc, vc: `[slots, max_len, hkv, hd]`. wqk `[nq + hkv, hd]`: Qwen3's q/k norm
    weights per head, or None (no q/k norm).
    """
    t = qkv.shape[0]
    assert qkv.stride(1) == 1 and kc.stride() == vc.stride() and kc.stride(3) == 1
    rows, pos, cos, sin = rows.contiguous(), pos.contiguous(), cos.contiguous(), sin.contiguous()  # read flat
    q = torch.empty((t, nq, hd), dtype=kc.dtype, device=qkv.device) if nq else None
    heads = nq + 2 * hkv
    g = min(ROPE_HEADS, triton.next_power_of_2(heads))
    _qk_rope_store_kernel[(t, triton.cdiv(heads, g))](
        qkv, qkv.stride(0), kc if q is None else q, cos if wqk is None else wqk, cos, sin, rows, pos, kc, vc,
        kc.stride(0), kc.stride(1), kc.stride(2), eps, NQ=nq, HKV=hkv, HD=hd, NORM=wqk is not None, G=g,
        num_warps=ROPE_WARPS)
    return q


@triton.jit
def _act_mul_kernel(gu_ptr, out_ptr, stride_t, n, BLOCK: tl.constexpr, GELU: tl.constexpr):
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = cols < n
    g = tl.load(gu_ptr + t * stride_t + cols, mask=keep, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + t * stride_t + n + cols, mask=keep, other=0.0).to(tl.float32)
    if GELU:  # tanh GELU: 0.5 (1 + tanh(z)) = sigmoid(2 z), z = sqrt(2 / pi) (x + 0.044715 x^3)
        act = g * tl.sigmoid(2.0 * 0.7978845608028654 * (g + 0.044715 * g * g * g))
    else:  # SiLU
        act = g * tl.sigmoid(g)
    tl.store(out_ptr + t * n + cols, (act * u).to(out_ptr.dtype.element_ty), mask=keep)


def act_mul(gu: torch.Tensor, gelu: bool = False) -> torch.Tensor:
    """act(gate) * up for `gu` `[t, 2 n]` (gate first, as the fused gate/up weight is stacked): SiLU, or with
    `gelu` the tanh GELU (Gemma's GeGLU)."""
    t, n2 = gu.shape
    n = n2 // 2
    assert gu.stride(1) == 1
    out = torch.empty((t, n), dtype=gu.dtype, device=gu.device)
    block = 1024
    _act_mul_kernel[(t, triton.cdiv(n, block))](gu, out, gu.stride(0), n, BLOCK=block, GELU=gelu)
    return out


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up (`act_mul`)."""
    return act_mul(gu)


@triton.jit
def _commit_kernel(post_ptr, s_post, drafts_ptr, s_drafts, active_ptr, start_ptr, anchor_ptr, s_anchor, out_ptr,
                   s_out, u_ptr, step_ptr, steps, s_step, s_row, rate,
                   B: tl.constexpr, BLOCK: tl.constexpr, SYNTH: tl.constexpr):
    """One program per row; it reads and writes only its own row (the shared step counter is only read)."""
    r = tl.program_id(0)
    k = tl.arange(0, BLOCK)
    is_draft = k < B - 1
    post = tl.load(post_ptr + r * s_post + k, mask=k < B, other=0)
    drafts = tl.load(drafts_ptr + r * s_drafts + k, mask=is_draft, other=0)
    if SYNTH:  # the row's own step counter, advanced here (every program touches only its row's)
        count = tl.load(step_ptr + r)
        tl.store(step_ptr + r, count + 1)
        ok = tl.load(u_ptr + (count % steps) * s_step + r * s_row + k, mask=is_draft, other=1.0) < rate
    else:
        ok = drafts == post  # draft k against the target's token after the anchor and drafts 0..k-1
    acc = tl.min(tl.where(is_draft & (~ok), k, B - 1), axis=0)  # the leading run of accepted drafts
    bonus = tl.sum(tl.where(k == acc, post, 0), axis=0)
    active = tl.load(active_ptr + r)
    start = tl.load(start_ptr + r)
    tl.store(start_ptr + r, start + (acc + 1) * active)
    tl.store(anchor_ptr + r * s_anchor, tl.where(active != 0, bonus, tl.load(anchor_ptr + r * s_anchor)))
    tl.store(out_ptr + r * s_out, acc.to(tl.int64))
    tl.store(out_ptr + r * s_out + 1 + k, drafts, mask=is_draft)
    tl.store(out_ptr + r * s_out + B, bonus)


def commit(post: torch.Tensor, drafts: torch.Tensor, active: torch.Tensor, start: torch.Tensor, anchor: torch.Tensor,
           out: torch.Tensor, synth: tuple | None = None) -> None:
    """A step's commit in one launch (it replaced a dozen tiny torch ops, ~30 us a step on an H100).

    post `[bs, B]`: the target's tokens after the anchor and each draft; drafts `[bs, >= B - 1]`; active, start
    `[bs]`, anchor `[bs]` (any stride: a column of the runner's token rows); out `[bs, B + 1]` (row slices of
    the runner's buffers). Accepts the leading drafts that match `post`, or with synth = (uniforms
    `[steps, >= bs, B - 1]`, per-row step counters `[bs]`, rate) those whose uniform at table row
    `step[r] % steps` is below rate, and advances every row's counter. Then for the active rows
    start += accepted + 1, anchor = the bonus token; out = [accepted, drafts, bonus] for every row. AR
    (B == 1) has no drafts. `accept.commit` is the torch reference.
    """
    bs, B = post.shape
    assert post.stride(1) == drafts.stride(1) == out.stride(1) == 1
    assert active.is_contiguous() and start.is_contiguous()
    u, step, rate = synth if synth is not None else (post, post, 0.0)  # unread without synth
    if synth is not None:
        assert u.stride(2) == 1 and step.shape == (bs,) and step.is_contiguous()
    _commit_kernel[(bs,)](post, post.stride(0), drafts, drafts.stride(0), active, start, anchor, anchor.stride(0),
                          out, out.stride(0), u, step, u.shape[0], u.stride(0), u.stride(1), rate,
                          B=B, BLOCK=max(triton.next_power_of_2(B), 2), SYNTH=synth is not None)
