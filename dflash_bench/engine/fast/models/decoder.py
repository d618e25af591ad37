"""What every fast-path forward shares: a decoder's layers over a static slot KV cache, and the forward's tail.

`DecoderTarget` is the forward's contract and its tail, written once; a family (`dense.py`, `gemma.py`) writes its
trunk. `fuse_layer` fuses a SwiGLU layer's projections (the dense targets' and the drafter's), `weight_bytes`
counts what a step reads. The cache is `[slots, rows, kv_heads, head_dim]` per layer (`KVCache`) and a batch of
`bs` rows always covers slots `row0 .. row0 + bs - 1`.

Two ways to run a layer, same math: with kernels (`selector.py` picks them: on a GPU Triton's `triton_ops`
(norms, q/k norm + RoPE + cache write, silu * up) and `triton_attn` (split-K attention that reads only each
row's valid keys); on a CPU the same calls in C, `cpu_kernels`), or plain torch ops and SDPA over the cache
view `cache[row0:row0 + bs, :L]` with an additive mask built once per step (the kernels' reference, and the
CPU path without a C compiler). Prefill (long `n`) always takes SDPA for its attention.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from dflash_bench.engine.reference.slot_cache import row_mask
from dflash_bench.engine.fast.kernels.selector import Kernels, prepared
from dflash_bench.engine.fast.models.shard import Shard
from dflash_bench.engine.reference.rope import cos_sin, kernel_tables, rope

KERNEL_MAX_QUERIES = 32  # steps with at most this many tokens per row use the Triton attention kernel


class Index:
    """The index tensors of a forward's steps (`offsets`), one per target and per drafter. Inside `keeping` (the
    runner's graph bodies, whose shapes are few and fixed) each is made once per shape and kept: a graph replays
    no kernel for them (the runner's warm-up, outside capture, makes them first). Outside it (an eager prefill's
    shapes are many) they are made afresh and freed."""

    def __init__(self) -> None:
        self.kept: dict[tuple, torch.Tensor] = {}
        self.keep = False

    @contextlib.contextmanager
    def keeping(self) -> Iterator[None]:
        self.keep = True
        try:
            yield
        finally:
            self.keep = False

    def offsets(self, n: int, device: torch.device, row0: int = 0, bs: int = 0) -> torch.Tensor:
        """`arange(n)`, or with `bs` the slot of every entry of a `[bs, n]` step (row i is slot row0 + i).
        Read-only."""
        key = (n, str(device), row0, bs)
        t = self.kept.get(key)
        if t is None:
            t = torch.arange(n, device=device) if not bs else \
                torch.arange(row0, row0 + bs, device=device)[:, None].expand(bs, n).contiguous()
            if self.keep:
                self.kept[key] = t
        return t


# attend(i, layer, normed h, qkv=None) -> [t, H * hd]: a layer stack's attention in one step (StepAttention)
Attend = Callable[..., torch.Tensor]


def norm(kernels: Kernels | None) -> Callable[[torch.Tensor, torch.Tensor | None, float], torch.Tensor]:
    """RMSNorm without a residual: torch's, or the Triton kernel (one launch instead of torch's few)."""
    return kernels.ops.rms_norm if kernels else rms_norm


def matmul(kernels: Kernels | None, lane: int = 0) -> Callable[..., torch.Tensor]:
    """`F.linear`, or with kernels the one that takes decode-sized inputs (<= 32 rows) to the skinny kernel
    (`lane` 1 for matmuls that run beside the main stream's: their own split-K workspace)."""
    if not kernels:
        return F.linear
    return kernels.gemm.linear if lane == 0 else functools.partial(kernels.gemm.linear, lane=lane)


def embed_norm(kernels: Kernels | None, ids: torch.Tensor, embed: torch.Tensor, w: torch.Tensor, eps: float, *, scale: float = 1.0,
               n: int | None = None, fill: int | None = None, shard: Shard | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """A step's input rows h `[bs * n, hidden]` = `embed[tokens] * scale` and the first layer's norm of them.

    tokens = ids `[bs, n]`, or with `fill` the DFlash block `[ids[b, 0], fill x (n - 1)]`. With kernels one
    launch (torch: a gather that takes 8 us for 16 rows on an H100, then the norm). `shard`: `embed` is this
    rank's rows of a vocabulary-parallel table (`Shard.embed`).
    """
    if kernels and (shard is None or not shard.on):
        return kernels.ops.embed_norm(ids, embed, w, eps, scale, n, fill)
    if fill is not None:
        assert n is not None  # the block's length
        ids = torch.cat([ids[:, :1], torch.full((ids.shape[0], n - 1), fill, dtype=ids.dtype, device=ids.device)], 1)
    h = shard.embed(ids.reshape(-1), embed) if shard is not None else F.embedding(ids.reshape(-1), embed)
    if scale != 1.0:
        h = h * scale
    return h, norm(kernels)(h, w, eps)


def add_rms_norm(h: torch.Tensor, a: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the next norm: `(h + a, rms_norm(h + a) * w)` (torch; `triton_ops` fuses it)."""
    s = h + a
    return s, rms_norm(s, w, eps)


def rms_norm(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm in one fused kernel on CUDA (float32 statistics)."""
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def qk_rope(qkv: torch.Tensor, ly: Layer, H: int, hkv: int, hd: int, cos: torch.Tensor, sin: torch.Tensor, eps: float
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split fused projections `[t, (H + 2 hkv) hd]`; q/k norm (Qwen3) and RoPE on q and k together."""
    t = qkv.shape[0]
    qk = qkv[:, : (H + hkv) * hd].view(t, H + hkv, hd)
    if ly.wqk is not None:
        qk = rms_norm(qk, None, eps) * ly.wqk
    qk = rope(qk, cos, sin)
    return qk[:, :H], qk[:, H:], qkv[:, (H + hkv) * hd:].view(t, hkv, hd)


def softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Final-logit softcapping (Gemma): `tanh(logits / cap) * cap`; none when `cap` is None."""
    return logits if not cap else torch.tanh(logits / cap) * cap


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


def step_mask(starts: torch.Tensor, q_len: int, L: int, rep: int, dtype: torch.dtype, *, causal: bool,
              window: int | None = None) -> torch.Tensor:
    """`slot_cache.row_mask` as an additive mask `[bs, 1, rep * q_len, L]` for grouped queries (row r is query
    r % q_len of its group: see `attention`)."""
    vis = row_mask(starts, q_len, L, causal=causal, window=window)[:, 0]
    m = torch.zeros(vis.shape, dtype=dtype, device=starts.device).masked_fill(~vis, float("-inf"))
    return m.repeat(1, rep, 1)[:, None]


def attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q `[bs, n, H, hd]` over cache views `[bs, L, Hkv, hd]` -> `[bs * n, H * hd]`.

    The H / Hkv query heads that share a KV head are stacked along the query axis, so SDPA sees plain
    multi-head attention (no KV repeat) and each KV byte is read once per step.
    """
    bs, n, H, hd = q.shape
    hkv = kc.shape[2]
    rep = H // hkv
    qg = q.view(bs, n, hkv, rep, hd).permute(0, 2, 3, 1, 4).reshape(bs, hkv, rep * n, hd)
    if q.is_cuda:  # a masked kernel that reads only [0, L); kept off cuDNN, whose graph capture is less proven
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            o = F.scaled_dot_product_attention(qg, kc.transpose(1, 2), vc.transpose(1, 2), attn_mask=mask, scale=scale)
    else:
        o = F.scaled_dot_product_attention(qg, kc.transpose(1, 2), vc.transpose(1, 2), attn_mask=mask, scale=scale)
    return o.view(bs, hkv, rep, n, hd).permute(0, 3, 1, 2, 4).reshape(bs * n, H * hd)


class Taps:
    """The outputs of the layers a step taps (`taps`, in that order), collected as the layers run; `hook(outputs)`
    is called as soon as the last of them is computed, before the remaining layers (so work on them can overlap)."""

    def __init__(self, taps: tuple[int, ...], hook: Callable[[list[torch.Tensor]], None] | None = None):
        self.taps, self.hook = taps, hook
        self.got: dict[int, torch.Tensor] = {}

    def add(self, i: int, h: torch.Tensor) -> None:
        if i in self.taps:
            self.got[i] = h
            if self.hook is not None and len(self.got) == len(set(self.taps)):
                self.hook(self.ordered())

    def ordered(self) -> list[torch.Tensor]:
        return [self.got[t] for t in self.taps]


def run_layers(layers: list[Layer], h: torch.Tensor, x: torch.Tensor, attend: Attend, final_norm: torch.Tensor, eps: float,
               kernels: Kernels | None, taps: Taps | None = None, shard: Shard | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pre-norm decoder layers over h `[t, hidden]` with x = norm(h) of the first layer.

    Each residual add is fused with the norm that follows it (the next layer's, or `final_norm` after the
    last), so a layer is: attend, o_proj, add+norm, gate/up, silu*up, down, add+norm. Returns (h, norm of h);
    each layer's output goes to `taps`. `shard`: the layers are sharded (`shard.py`): the row-parallel o_proj and
    down_proj outputs are summed across ranks.
    """
    add_norm, act = (kernels.ops.add_rms_norm, kernels.ops.silu_mul) if kernels else (add_rms_norm, silu_mul)
    mm = matmul(kernels)
    red = shard.reduce if shard is not None else (lambda a: a)
    for i, ly in enumerate(layers):
        h, x = add_norm(h, red(mm(attend(i, ly, x), ly.wo)), ly.ln2, eps)
        nxt = layers[i + 1].ln1 if i + 1 < len(layers) else final_norm
        h, x = add_norm(h, red(mm(act(mm(x, ly.w13)), ly.w2)), nxt, eps)
        if taps is not None:
            taps.add(i, h)
    return h, x


@dataclass
class Layer:
    wqkv: torch.Tensor
    bqkv: torch.Tensor | None
    wo: torch.Tensor
    wqk: torch.Tensor | None  # q_norm weights per query head, then k_norm per KV head: [H + Hkv, hd]
    ln1: torch.Tensor
    ln2: torch.Tensor
    w13: torch.Tensor
    w2: torch.Tensor


class KVCache:
    """Per-layer K/V `[slots, max_len, kv_heads, hd]`; batch row i of a step at `row0` is slot `row0 + i`."""

    def __init__(self, layers: int, slots: int, max_len: int, kv_heads: int, hd: int, dtype: torch.dtype,
                 device: torch.device | str, index: Index) -> None:
        shape = (slots, max_len, kv_heads, hd)
        self.index = index
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.slots, self.max_len = slots, max_len

    def rows(self, row0: int, pos: torch.Tensor, slot: torch.Tensor | None = None) -> torch.Tensor:
        """The slot of every entry of `pos` `[bs, n]` (row i is slot row0 + i, or with `slot` `[bs]` the slot
        `slot[i]`: a prefill's, read on the device), contiguous: the kernels read it flat, and a stride-0
        view would cost a copy in every layer."""
        if slot is not None:
            return slot.view(-1, 1).expand(pos.shape).contiguous()
        return self.index.offsets(pos.shape[1], pos.device, row0, pos.shape[0])

    def write(self, i: int, rows: torch.Tensor, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v `[bs, n, kv_heads, hd]` at (rows, pos)."""
        self.k[i].index_put_((rows, pos), k)
        self.v[i].index_put_((rows, pos), v)

    def view(self, i: int, row0: int, bs: int, L: int, slot: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        if slot is not None:  # a copy of the slots' first L positions (a prefill's: one graph serves every slot)
            return self.k[i][:, :L].index_select(0, slot), self.v[i][:, :L].index_select(0, slot)
        return self.k[i][row0:row0 + bs, :L], self.v[i][row0:row0 + bs, :L]


class StepAttention:
    """A layer stack's attention over its `KVCache` (the target's and the drafter's alike).

    Called once per step, it returns `attend(i, layer, normed h, qkv=None) -> [t, H * hd]`: the q/k/v projection
    (unless given: `DenseTarget.forward_mixed` projects two calls' rows in one matmul), q/k norm and RoPE, the cache write and
    attention with layer i's `kinds[i]` = (causal, window). With `kernels`, the Triton ones (RoPE from tables built
    here once for every cache position; SDPA for rows longer than KERNEL_MAX_QUERIES, i.e. prefill); without,
    torch ops and SDPA with this step's masks.
    """

    def __init__(self, cache: KVCache, kernels: Kernels | None, *, heads: int, kv_heads: int, head_dim: int, eps: float,
                 scale: float, kinds: list[tuple[bool, int | None]], inv_freq: torch.Tensor, rope_scale: float) -> None:
        self.cache, self.kernels, self.kinds = cache, kernels, kinds
        self.H, self.hkv, self.hd, self.eps, self.scale = heads, kv_heads, head_dim, eps, scale
        self.inv_freq, self.rope_scale = inv_freq, rope_scale
        if kernels:
            self.cos, self.sin = kernel_tables(torch.arange(cache.max_len, device=inv_freq.device), inv_freq, rope_scale)

    def __call__(self, pos: torch.Tensor, starts: torch.Tensor, row0: int, L: int, slot: torch.Tensor | None = None
                 ) -> Attend:
        """`slot` `[bs]`: each row's slot as a device tensor instead of `row0` (a prefill's)."""
        bs, n = pos.shape
        H, hkv, hd, eps, cache = self.H, self.hkv, self.hd, self.eps, self.cache
        rows = cache.rows(row0, pos, slot)
        use_kernel = self.kernels is not None and n <= KERNEL_MAX_QUERIES and slot is None
        dtype = cache.k[0].dtype
        masks = {} if use_kernel else {k: step_mask(starts, n, L, H // hkv, dtype, causal=k[0], window=k[1])
                                       for k in set(self.kinds)}
        if self.kernels is not None:
            ops, attn, gemm = self.kernels.ops, self.kernels.attn, self.kernels.gemm
            flat_rows, flat_pos = rows.reshape(-1), pos.reshape(-1)

            def kernel_attend(i: int, ly: Layer, x: torch.Tensor, qkv: torch.Tensor | None = None) -> torch.Tensor:
                kc, vc = cache.k[i], cache.v[i]
                qkv = gemm.linear(x, ly.wqkv, ly.bqkv) if qkv is None else qkv
                q = ops.qk_rope_store(qkv, H, hkv, hd, self.cos, self.sin, flat_rows, flat_pos, kc, vc, ly.wqk,
                                      eps).view(bs, n, H, hd)
                if use_kernel:
                    causal, window = self.kinds[i]
                    return attn.decode_attention(q, kc, vc, starts, row0, L, self.scale, causal=causal, window=window)
                return attention(q, *cache.view(i, row0, bs, L, slot), masks[self.kinds[i]], self.scale)
            return kernel_attend

        cos, sin = cos_sin(pos.reshape(-1), self.inv_freq, dtype, self.rope_scale)

        def attend(i: int, ly: Layer, x: torch.Tensor, qkv: torch.Tensor | None = None) -> torch.Tensor:
            qkv = F.linear(x, ly.wqkv, ly.bqkv) if qkv is None else qkv
            q, k, v = qk_rope(qkv, ly, H, hkv, hd, cos, sin, eps)
            cache.write(i, rows, pos, k.view(bs, n, hkv, hd), v.view(bs, n, hkv, hd))
            return attention(q.view(bs, n, H, hd), *cache.view(i, row0, bs, L, slot), masks[self.kinds[i]],
                             self.scale)
        return attend


def fused(kernels: Kernels | None, *linears: nn.Linear, shard: Shard | None = None) -> torch.Tensor:
    """Projections' weights concatenated into one matmul's (`[sum of outputs, inputs]`), as the kernels read it;
    with `shard`, this rank's rows of each (column-parallel)."""
    rows = shard.rows if shard is not None else (lambda w: w)
    return prepared(kernels, torch.cat([rows(m.weight.detach()) for m in linears]))


def fuse_layer(layer: Any, kernels: Kernels | None, H: int, hkv: int, shard: Shard | None = None) -> Layer:
    """A pre-norm SwiGLU decoder layer (Qwen3, Qwen2, Llama, Mistral; the DFlash drafter's) with its q/k/v and
    gate/up projections fused. Biases: on q/k/v only. `shard`: this rank's shard (`shard.py`; H and hkv its heads):
    q/k/v and gate/up by rows, o_proj and down_proj by columns."""
    a, m = layer.self_attn, layer.mlp
    shard = shard or Shard()
    qn, kn = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
    wqk = None
    if qn is not None:
        assert kn is not None  # q and k are normed together
        wqk = torch.cat([qn.weight.detach().expand(H, -1), kn.weight.detach().expand(hkv, -1)])
    projs = (a.q_proj, a.k_proj, a.v_proj)
    return Layer(wqkv=fused(kernels, *projs, shard=shard),
                 bqkv=torch.cat([shard.rows(p.bias.detach()) for p in projs]) if a.q_proj.bias is not None else None,
                 wo=prepared(kernels, shard.cols(a.o_proj.weight.detach())), wqk=wqk,
                 ln1=layer.input_layernorm.weight.detach(), ln2=layer.post_attention_layernorm.weight.detach(),
                 w13=fused(kernels, m.gate_proj, m.up_proj, shard=shard),
                 w2=prepared(kernels, shard.cols(m.down_proj.weight.detach())))


def weight_bytes(layers: list[Any], *tensors: torch.Tensor) -> int:
    """Bytes one step reads of these weights: every tensor of each layer (a dataclass) and `tensors`."""
    ts = [t for ly in layers for t in (getattr(ly, f.name) for f in dataclasses.fields(ly)) if isinstance(t, torch.Tensor)]
    ts += tensors
    return sum(t.numel() * t.element_size() for t in ts)


class DecoderTarget:
    """What every family's target shares: the forward's contract and its tail (the tapped outputs, the last
    rows, the head). A family writes `trunk`, its embedding and layers; see `family.Target`."""

    kernels: Kernels | None
    lm_head: torch.Tensor
    index: Index  # its steps' index tensors
    softcap: float | None = None  # final-logit softcapping (Gemma's), none by default
    shard: Shard = Shard()  # this rank's shard of the weights (`shard.py`); the head's logits are gathered

    def trunk(self, ids: torch.Tensor, pos: torch.Tensor, starts: torch.Tensor, row0: int, L: int,
              slot: torch.Tensor | None, last: torch.Tensor | None, taps: Taps,
              packed: torch.Tensor | None = None, resumed: bool = False) -> torch.Tensor:
        """The final norm's output `[bs * n, hidden]` of ids `[bs, n]` at `pos`; each layer's output to `taps`.
        `packed` (a family that `packs`): the indices of the real tokens among the bs x n, the rest padding.
        `resumed` (a prefill, `last` given): its rows start at `starts`, their slots holding the keys before."""
        raise NotImplementedError

    def resumable(self, p: int, hi: int) -> bool:
        """Every position of a slot is its own row: what was written below p is there until a prefill rewrites
        it."""
        return True

    def forward(self, ids: torch.Tensor, starts: torch.Tensor, row0: int, L: int, *, last_only: bool = False,
                taps: tuple[int, ...] = (), on_taps: Callable[[list[torch.Tensor], torch.Tensor], None] | None = None,
                head: bool = True, pos: torch.Tensor | None = None, slot: torch.Tensor | None = None,
                last: torch.Tensor | None = None, lane: int = 0,
                packed: torch.Tensor | None = None, resumed: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run ids `[bs, n]` at positions `starts[b] + j` in slots `row0..row0+bs-1`, attending to `[0, L)`.

        Returns (logits `[bs, n or 1, V]`, the outputs of layers `taps` concatenated `[bs, n, K * hidden]`
        or None); with head=False the final norm's output `[bs * (n or 1), hidden]` in place of the logits.
        With `on_taps`, the tapped outputs (a list of `[bs * n, hidden]`, in `taps` order, to be joined by the
        callee) and the positions `[bs, n]` are instead handed to `on_taps` as soon as the last tapped layer has
        run (so work on them can overlap the later layers), and None is returned in place of the
        concatenation. `pos`: the positions `starts[:, None] + arange(n)`, when the caller has them already.
        `slot` `[bs]`: each row's slot as a device tensor instead of `row0`, and `last` `[bs]`: each row's last
        token among the bs x n (a prefill's). `lane`: the split-K workspace of the head's matmul (see `matmul`).
        `packed`: an eager prefill's real tokens among the bs x n (a family that `packs` leaves the padding out of
        its matmuls; the results are the same). `resumed`: a prefill whose rows start past keys their slots hold
        (`starts` > 0 somewhere: a prefix cache's resume).
        """
        bs, n = ids.shape
        if pos is None:
            pos = starts[:, None] + self.index.offsets(n, ids.device)
        step_pos = pos
        tapped = Taps(taps, None if on_taps is None else (lambda feats: on_taps(feats, step_pos)))
        x = self.trunk(ids, pos, starts, row0, L, slot, last, tapped, packed, resumed)
        if last_only and last is not None:
            x = x.index_select(0, last)
        elif last_only:  # contiguous rows: a strided 3-D input would make F.linear read lm_head once per row
            x = x.view(bs, n, -1)[:, -1].contiguous()
        out = softcap(self.shard.gather_vocab(matmul(self.kernels, lane)(x, self.lm_head)), self.softcap).view(
            bs, 1 if last_only else n, -1) if head else x
        if not taps or on_taps is not None:
            return out, None
        return out, torch.cat(tapped.ordered(), -1).view(bs, n, -1)
