"""The end of a fast-path step: greedy acceptance of the drafts and the commit, as the Triton and C kernels do it.

`commit` is the torch reference of `triton_ops.commit` and the C kernels' commit (same arguments): accept the
longest run of drafts the target agrees with (or, for benchmarks, a synthetic run), then advance the active
rows. `synthetic_rate` fits the per-position acceptance of synthetic mode to a mean tokens-per-step tau.
"""

from __future__ import annotations

import torch


def synthetic_rate(tau: float, block_size: int) -> float:
    """The per-position acceptance a with 1 + sum_{k=1}^{B-1} a^k = tau (bisection)."""
    if not 1.0 <= tau <= block_size:
        raise ValueError(f"synthetic acceptance length must lie in [1, {block_size}], got {tau}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if 1 + sum(mid**k for k in range(1, block_size)) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


SYNTHETIC_STEPS = 4096  # rows of the synthetic-acceptance table (it cycles after that many steps)


def commit(post: torch.Tensor, drafts: torch.Tensor, active: torch.Tensor, start: torch.Tensor, anchor: torch.Tensor,
           out: torch.Tensor, synth: tuple | None = None) -> None:
    """The end of a step: accept, then advance the active rows (the reference of `triton_ops.commit`, same args)."""
    n = post.shape[1] - 1  # drafts verified per row (AR: none)
    if synth is not None:
        uniforms, step, rate = synth  # step: each row's own counter, advanced here
        ok = uniforms[step % uniforms.shape[0], torch.arange(len(post), device=post.device), :n] < rate  # no host read
        step += 1
    else:
        ok = drafts[:, :n] == post[:, :-1]
    acc = ok.long().cumprod(1).sum(1)
    bonus = post.gather(1, acc[:, None])[:, 0]
    on = active.bool()
    start += (acc + 1) * active
    anchor.copy_(torch.where(on, bonus, anchor))
    out.copy_(torch.cat([acc[:, None], drafts[:, :n], bonus[:, None]], 1))
