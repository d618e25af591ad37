"""The DFlash training step: random anchors, block masks, position-decayed cross-entropy.

For each sequence (prompt + target-regenerated response) the frozen target gives the outputs of its
`target_layer_ids` layers at every position. N anchors are drawn among the response positions. Each anchor p
becomes a block `[token@p, mask x (B-1)]` at positions p..p+B-1 whose queries see the context features at
positions < p and every slot of their own block (bidirectional), never another block. Slot k (1..B-1) is
trained to predict the token at p+k, weighted by exp(-(k-1)/gamma). The math reuses the engine's drafter
modules (`dflash_bench.engine.reference.drafter`), so what is trained here is exactly what the engine runs.

A block may also be cut to its first l slots (`block_lengths`): its queries then see only those slots of their
block and only slots 1..l-1 are trained. A drafter trained on a mix of whole and cut blocks drafts as well from
a block an engine cuts to the drafts it will verify (the builtin engine under load) as from the whole block.
"""

from __future__ import annotations

import math
from typing import Callable, cast

import torch
import torch.nn.functional as F

from dflash_bench.engine.reference.slot_cache import attend
from dflash_bench.engine.reference.drafter import DFlashDrafter, DrafterLayer, rope, rope_cos_sin


def default_gamma(block_size: int) -> float:
    """The paper's decay: 7 for B=16, 5 for B=10, 4 for B=8 (interpolated elsewhere)."""
    return {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1.0, block_size / 2 - 1))


def position_weights(block_size: int, gamma: float, device: torch.device | str | None = None) -> torch.Tensor:
    """w_k = exp(-(k-1)/gamma) for the B-1 mask slots k = 1..B-1."""
    k = torch.arange(1, block_size, device=device, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


def select_anchors(loss_mask: torch.Tensor, lengths: torch.Tensor, n: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw up to `n` distinct anchors per row among response positions that have at least one label.

    `loss_mask` `[bs, L]` marks response tokens; `lengths` `[bs]` the real lengths. Returns anchors `[bs, n]`
    and their validity `[bs, n]` (rows with fewer candidates get invalid padding anchors at position 0).
    """
    bs, L = loss_mask.shape
    pos = torch.arange(L, device=loss_mask.device)
    cand = loss_mask.bool() & (pos[None] < (lengths[:, None] - 1))
    scores = torch.rand(bs, L, generator=generator, device="cpu").to(loss_mask.device)
    scores = scores.masked_fill(~cand, -1.0)
    k = min(n, L)
    top, idx = scores.topk(k, dim=1)
    valid = top >= 0
    anchors = torch.where(valid, idx, torch.zeros_like(idx))
    return anchors, valid


def block_lengths(shape: tuple[int, int], block_size: int, cut: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Slots per block `[bs, n]`: the whole block, or with probability `cut` a length drawn uniformly from
    2..block_size-1."""
    whole = torch.rand(shape, generator=generator) >= cut
    short = torch.randint(2, max(3, block_size), shape, generator=generator)
    return torch.where(whole, torch.full(shape, block_size), short.clamp(max=block_size))


def block_logits(drafter: DFlashDrafter, embed_weight: torch.Tensor, lm_head: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor,
                 feats: torch.Tensor, anchors: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Draft logits `[bs, n, B-1, V]` of every anchor's block, in one drafter pass.

    `ids` `[bs, L]` the tokens, `feats` `[bs, L, K*hidden]` the target layer outputs, `anchors` `[bs, n]`,
    `lengths` `[bs, n]` each block's slots (default: all B; a slot past its block's length is not attended to,
    and its logits are not to be trained).
    """
    c = drafter.config
    B, hd = c.block_size, c.head_dim
    bs, L = ids.shape
    n = anchors.shape[1]
    dev = ids.device
    ar = torch.arange(B, device=dev)
    block_pos = (anchors[:, :, None] + ar).reshape(bs, n * B)
    block = torch.full((bs, n, B), c.mask_token_id, device=dev, dtype=ids.dtype)
    block[:, :, 0] = ids.gather(1, anchors)
    h = F.embedding(block.reshape(bs, n * B), embed_weight) * c.input_embedding_scale
    dtype = h.dtype
    ctx = drafter.context(feats.to(dtype))
    ctx_pos = torch.arange(L, device=dev)[None].expand(bs, L)
    cos_c, sin_c = rope_cos_sin(ctx_pos, hd, c.rope_theta, dtype)
    cos_b, sin_b = rope_cos_sin(block_pos, hd, c.rope_theta, dtype)
    mask = _block_mask(anchors, L, B, lengths)
    for layer in cast("list[DrafterLayer]", drafter.layers):  # a ModuleList of DrafterLayer
        a = layer.self_attn
        kc, vc = a.kv(ctx, cos_c, sin_c)
        x = layer.input_layernorm(h)
        kb, vb = a.kv(x, cos_b, sin_b)
        q = rope(a.q_norm(a.q_proj(x).unflatten(-1, (-1, hd))), cos_b, sin_b).transpose(1, 2)
        k = torch.cat([kc, kb], 1).transpose(1, 2)
        v = torch.cat([vc, vb], 1).transpose(1, 2)
        h = h + a.o_proj(attend(q, k, v, mask, hd**-0.5).flatten(2))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    h = drafter.norm(h).reshape(bs, n, B, -1)[:, :, 1:]
    logits = lm_head(h) * c.output_multiplier
    if c.final_logit_softcapping:
        cap = float(c.final_logit_softcapping)
        logits = torch.tanh(logits / cap) * cap
    return logits


def _block_mask(anchors: torch.Tensor, L: int, B: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """`[bs, 1, n*B, L + n*B]`: a block's queries see context < its anchor and their own block only (its first
    `lengths` slots when given)."""
    bs, n = anchors.shape
    dev = anchors.device
    q_anchor = anchors.repeat_interleave(B, dim=1)  # [bs, n*B]
    ctx = torch.arange(L, device=dev)[None, None, :] < q_anchor[:, :, None]
    blk_id = torch.arange(n, device=dev).repeat_interleave(B)
    own = (blk_id[:, None] == blk_id[None, :])[None].expand(bs, -1, -1)
    if lengths is not None:  # keys past their block's length are not there
        slot = torch.arange(B, device=dev).repeat(n)
        own = own & (slot[None, None, :] < lengths.to(dev).repeat_interleave(B, dim=1)[:, None, :])
    return torch.cat([ctx, own], dim=2)[:, None]


def dflash_loss(logits: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor, anchors: torch.Tensor,
                valid: torch.Tensor, gamma: float, block_len: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Decay-weighted CE of slot k against the token at anchor+k, plus an acceptance estimate (slots past a
    block's `block_len` are neither trained nor counted).

    Returns (loss, stats) where stats has `acc_len` (mean accepted drafts + 1 per block if the drafts were
    verified against these labels: the training-time estimate of tau) and `top1` per slot.
    """
    bs, n, Bm1, V = logits.shape
    dev = logits.device
    k = torch.arange(1, Bm1 + 1, device=dev)
    pos = anchors[:, :, None] + k  # [bs, n, B-1]
    ok = valid[:, :, None] & (pos < lengths[:, None, None])
    if block_len is not None:
        ok = ok & (k[None, None] < block_len.to(dev)[:, :, None])
    labels = ids.gather(1, pos.clamp(max=ids.shape[1] - 1).reshape(bs, -1)).reshape(bs, n, Bm1)
    ce = F.cross_entropy(logits.float().reshape(-1, V), labels.reshape(-1), reduction="none").reshape(bs, n, Bm1)
    w = position_weights(Bm1 + 1, gamma, dev)[None, None] * ok
    loss = (ce * w).sum() / w.sum().clamp_min(1e-6)
    with torch.no_grad():  # tensors, so the training loop does not wait on the GPU every step
        hit = (logits.argmax(-1) == labels) & ok
        run = torch.cumprod(hit.long(), dim=-1).sum(-1)  # accepted drafts per block
        nb = valid.sum().clamp_min(1)
        stats = {
            "acc_len": (run.float() * valid).sum() / nb + 1.0,
            "top1": hit.float().sum((0, 1)) / ok.float().sum((0, 1)).clamp_min(1),
        }
    return loss, stats


def progress(step: int, steps: int, elapsed: float, time_limit: float | None) -> float:
    """How far the run is (0..1): by steps, or by time when a time limit comes first."""
    return max(step / steps, elapsed / time_limit if time_limit else 0.0)


def schedule_lr(progress: float, step: int, peak: float, warmup: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to 10% of the peak over the run's progress."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))
