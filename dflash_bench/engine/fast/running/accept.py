"""The end of a fast-path step: greedy acceptance of the drafts and the commit, as the Triton and C kernels do it.

`commit` is the torch reference of `triton_ops.commit` and the C kernels' commit (same arguments): accept the
longest run of drafts the target agrees with (or, for benchmarks, a synthetic run), then advance the active
rows. Synthetic acceptance's table of draws is made by `steps.StepBodies` from its profile (dflash_bench/synthetic.py).
"""

from __future__ import annotations

import torch


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
