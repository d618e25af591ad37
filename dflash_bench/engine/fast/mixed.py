"""A decode step that carries new prompts (AR, `serve --fast --prefill mixed`): one forward over the running rows'
next tokens and up to MIXED_ROWS prompts (scheduler.py decides which), as vLLM's scheduler mixes prefills into
the decode batch.

Between two steps, a prefill stalls every running row for its whole length, and each forward reads the weights
once. In one forward the matmuls take the rows' and the prompts' tokens together: on the 8B shape on an H100
(`benchmarks/mixed_step.py`) a step of 31 rows takes 6.7 ms, a 320-token prompt's prefill 11.1 ms, the step that
carries it 12.6 ms. Each half keeps its own attention (`StepAttention`): the rows over their slots' caches, the
prompts causally over their own slots. The rows' K/V is written before the prompts': a prompt's slot that the
batch bucket covers is a padding row of the step (its start is 0, a freed slot's), overwritten by the prompt.

The graph of a (batch bucket, prompt bucket, prompts) triple (its body: `steps.StepBodies.mixed`) reads the
prompts from `pre_in` (`prefill.stage`) and leaves their first tokens in `pre_tok`; their slots' start and
anchor are set inside it, while `active` stays as the host's mask left it (off): the next step the host
launches with a slot in it turns it on.
"""

from __future__ import annotations

import torch

from dflash_bench.engine.fast.model import FastTarget, embed_norm, matmul, offsets, run_layers


def forward_mixed(t: FastTarget, anchor: torch.Tensor, starts: torch.Tensor, L: int, ids: torch.Tensor,
                  slot: torch.Tensor, last: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' tokens `anchor` `[bs]` at `starts` (slots 0..bs-1, keys in `[0, L)`) and k prompts `ids` `[k, P]`
    into `slot` `[k]` at positions 0..P-1 (`zero`: k zeros, their starts) in one forward. Returns the final norm's
    rows `[bs, hidden]` and the prompts' rows at `last` `[k]` (indices into the k x P prompt tokens)."""
    bs, (k, P) = anchor.shape[0], ids.shape
    rows = t.attention(starts[:, None], starts, 0, L)
    prompts = t.attention(offsets(P, ids.device)[None].expand(k, P), zero, 0, P, slot)
    mm = matmul(t.kernels)

    def attend(i, ly, x):
        qkv = mm(x, ly.wqkv, ly.bqkv)
        return torch.cat([rows(i, ly, x[:bs], qkv[:bs]), prompts(i, ly, x[bs:], qkv[bs:])])

    h, x = embed_norm(t.kernels, torch.cat([anchor, ids.reshape(-1)])[:, None], t.embed, t.layers[0].ln1, t.eps)
    _, x, _ = run_layers(t.layers, h, x, attend, t.norm, t.eps, t.kernels)
    return x[:bs], x[bs:].index_select(0, last)
