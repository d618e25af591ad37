"""Token distributions and speculative acceptance (greedy and rejection sampling) of the reference engine.

Rejection sampling is the standard lossless rule: accept draft d with probability min(1, p(d)/q(d)); at the
first rejection sample from the residual max(0, p - q) renormalised; when every draft is accepted sample
the bonus from p at the last position. Greedy rows accept the longest prefix equal to the target's argmax.
"""

from __future__ import annotations

import torch

from dflash_bench.engine.sampling_params import SamplingParams


def probs_from_logits(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Processed distribution of logits `[n, ..., V]` with per-row temperature, top-k, top-p `[n]`."""
    shape = logits.shape
    n, V = shape[0], shape[-1]
    x = logits.float().reshape(n, -1, V) / temperature.float().clamp_min(1e-6)[:, None, None]
    srt, idx = x.sort(-1, descending=True)
    k = torch.where(top_k > 0, top_k, V).clamp(max=V)
    srt = srt.masked_fill(torch.arange(V, device=x.device) >= k[:, None, None], float("-inf"))
    p = srt.softmax(-1)
    keep = (p.cumsum(-1) - p) < top_p.float()[:, None, None]
    p = p * keep
    p = p / p.sum(-1, keepdim=True)
    return torch.zeros_like(p).scatter(-1, idx, p).reshape(shape)


def _rand(params: list[SamplingParams] | None, n: int, shape: tuple[int, ...], device: torch.device | str) -> torch.Tensor:
    """Uniform noise `[n, *shape]`; a row whose request has a seed draws from its own generator."""
    out = torch.rand((n, *shape), device=device)
    for i, p in enumerate(params or ()):
        if p.generator is not None:
            out[i] = torch.rand(shape, generator=p.generator, device=device)
    return out


def _multinomial(probs: torch.Tensor, params: list[SamplingParams] | None) -> torch.Tensor:
    """One sample per distribution of probs `[n, ..., V]` (exponential race: argmax p / Exp(1), exact)."""
    u = _rand(params, probs.shape[0], tuple(probs.shape[1:]), probs.device)
    return (probs / -torch.log(u.clamp_min(1e-30))).argmax(-1)


def param_tensors(params: list[SamplingParams], device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t = torch.tensor([p.temperature for p in params], device=device)
    k = torch.tensor([p.top_k for p in params], device=device)
    tp = torch.tensor([p.top_p for p in params], device=device)
    return t, k, tp


def sample_drafts(logits: torch.Tensor, params: list[SamplingParams]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draft tokens from draft logits `[bs, n, V]`: argmax for greedy rows, samples otherwise.

    Returns (tokens `[bs, n]`, q `[bs, n, V]` or None when every row is greedy; greedy rows get one-hot q).
    """
    tokens = logits.argmax(-1)
    samp = [i for i, p in enumerate(params) if not p.greedy]
    if not samp:
        return tokens, None
    q = torch.nn.functional.one_hot(tokens, logits.shape[-1]).float()
    rows = torch.tensor(samp, device=logits.device)
    sub = [params[i] for i in samp]
    t, k, tp = param_tensors(sub, logits.device)
    qs = probs_from_logits(logits[rows], t, k, tp)
    q[rows] = qs
    tokens[rows] = _multinomial(qs, sub)
    return tokens, q


def accept(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    q: torch.Tensor | None,
    params: list[SamplingParams],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify: target logits `[bs, T, V]` for `[anchor, d_1..d_{T-1}]`, drafts `[bs, T-1]`.

    Returns (accepted drafts per row `[bs]`, the bonus token per row `[bs]`). q None means one-hot drafts.
    """
    post = logits.argmax(-1)
    acc = (drafts == post[:, :-1]).cumprod(1).sum(1)
    bonus = post.gather(1, acc[:, None])[:, 0]
    samp = [i for i, p in enumerate(params) if not p.greedy]
    if samp:
        rows = torch.tensor(samp, device=logits.device)
        sub = [params[i] for i in samp]
        t, k, tp = param_tensors(sub, logits.device)
        p = probs_from_logits(logits[rows], t, k, tp)
        qr = None if q is None else q[rows]
        a, b = rejection_sample(p, drafts[rows], qr, sub)
        acc[rows], bonus[rows] = a, b
    return acc, bonus


def rejection_sample(p: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor | None,
                     params: list[SamplingParams] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling on target probs p `[n, T, V]`, drafts `[n, T-1]`, draft probs q (None: one-hot)."""
    n, T, V = p.shape
    pd = p[:, :-1].gather(-1, drafts[..., None])[..., 0]
    qd = torch.ones_like(pd) if q is None else q.gather(-1, drafts[..., None])[..., 0]
    ok = _rand(params, n, (T - 1,), p.device) * qd < pd
    acc = ok.int().cumprod(1).sum(1)
    if q is None:
        q = torch.nn.functional.one_hot(drafts, V).to(p.dtype)
    q_full = torch.cat([q.to(p.dtype), torch.zeros_like(p[:, :1])], dim=1)  # no draft after the last position
    at = acc[:, None, None].expand(n, 1, V)
    pa, qa = p.gather(1, at)[:, 0], q_full.gather(1, at)[:, 0]
    res = (pa - qa).clamp_min(0)
    tot = res.sum(-1, keepdim=True)
    res = torch.where(tot > 0, res / tot.clamp_min(1e-30), pa)
    return acc, _multinomial(res, params)


def sample_tokens(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """One token per row from logits `[bs, V]` (plain decoding: the AR step and the prefill)."""
    out = logits.argmax(-1)
    samp = [i for i, p in enumerate(params) if not p.greedy]
    if samp:
        rows = torch.tensor(samp, device=logits.device)
        sub = [params[i] for i in samp]
        t, k, tp = param_tensors(sub, logits.device)
        out[rows] = _multinomial(probs_from_logits(logits[rows], t, k, tp), sub)
    return out
