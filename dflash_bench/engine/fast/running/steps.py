"""The bodies of a fast-path step, each captured as a CUDA graph per shape: compute, then commit for the active rows.

A DFlash step is the draft (the block from the anchor, over the drafter's context K/V), then the verify (the
target over the token row; from its tapped layers the drafter's context K/V of the block's positions, on a
second stream beside the target's last layers; greedy acceptance and the commit: advance `start`, move
`anchor`, pack `[accepted, drafts, bonus]` into `out`). AR is one token; a mixed step is AR carrying prompts
(`Target.forward_mixed`). Rows of a bucket past the last running slot are padding: their results are discarded and
`active` keeps their state still.

Synthetic acceptance (benchmarks only): the verifier accepts a drawn number of drafts instead of comparing
them with the target: the profile's (dflash_bench/synthetic.py: per position the share of steps that accept
that far, r_i), each position drawn with its conditional rate r_i / r_{i-1}, leading run kept, so that
E[tokens per step] = 1 + sum r_i over the whole block. A step that verifies only its first w - 1 drafts
(adaptive width, width.py) draws from the same profile, 1 + sum_{i<w} r_i tokens. The draws come from a seeded
table on the device (0.0 where a position is accepted, 1.0 where not), read at a per-row step counter the
commit advances; the commit accepts a position whose entry lies below ACCEPT_BELOW.
"""

from __future__ import annotations

import torch

from dflash_bench.engine.fast.running.accept import SYNTHETIC_STEPS, commit
from dflash_bench.engine.fast.models.family import Drafter, Target
from dflash_bench.engine.fast.models.decoder import matmul, softcap
from dflash_bench.engine.fast.running.device_state import SlotState
from dflash_bench.synthetic import SyntheticProfile

ACCEPT_BELOW = 0.5  # the commit's threshold over the table of draws (0.0: accepted, 1.0: rejected)


class StepBodies:
    """The step bodies over one `SlotState` (see the module)."""

    def __init__(self, target: Target, drafter: Drafter | None, state: SlotState, *, overlap: bool = True,
                 synthetic: SyntheticProfile | None = None, seed: int = 0, cut_draft: bool = False):
        self.t, self.d, self.s = target, drafter, state
        self.B = drafter.B if drafter else 1
        self.dev, self.max_len = target.device, target.max_len
        self.taps = tuple(drafter.c.target_layer_ids) if drafter else ()
        # the drafter's context K/V is computed on this stream while the target's last layers run
        self.side = torch.cuda.Stream(self.dev) if drafter and self.dev.type == "cuda" and overlap else None
        self.synthetic = synthetic
        if synthetic is not None:
            assert synthetic.block_size == self.B, "the profile is the drafter's block's"
            gen = torch.Generator().manual_seed(seed)
            slots = state.start.shape[0]
            uniforms = torch.rand(SYNTHETIC_STEPS, slots, self.B - 1, generator=gen, dtype=torch.float64)
            rejected = uniforms >= torch.tensor(synthetic.conditional(), dtype=torch.float64)
            self.draws = rejected.to(torch.float32).to(self.dev)  # [step, row, position]: 0.0 accepted, 1.0 not
            self.synth_step = torch.zeros(slots, dtype=torch.long, device=self.dev)  # per row: the commit advances it
        # draft only the w positions a step verifies (a block cut to w), not the whole block: for drafters
        # trained on blocks of random length, which draft a cut block as well
        self.cut_draft = cut_draft

    def committed(self) -> list[torch.Tensor]:
        """The state a graph body advances (everything else it writes is recomputed identically)."""
        return [self.s.start, self.s.anchor] + ([self.synth_step] if self.synthetic is not None else [])

    def ar(self, bs: int, L: int) -> None:
        s = self.s
        x, _ = self.t.forward(s.anchor[:bs, None], s.start[:bs], 0, L, head=False)
        self.commit(bs, self.greedy(x, bs, 1))

    def draft(self, bs: int, L: int, w: int) -> None:
        """The drafter over the whole block, as z-lab's drafters are trained (a block cut to w tokens drafts worse
        with them), or with `cut_draft` over the w positions the verify checks (for drafters trained on cut
        blocks too, as the embedded one); the vocabulary only for the w - 1 drafts the verify checks."""
        s, d = self.s, self.d
        assert d is not None
        n = w if self.cut_draft else self.B
        pos = torch.add(s.start[:bs, None], self.t.index.offsets(n, self.dev), out=s.pos[:bs, :n])
        x = d.hidden(s.anchor[:bs], s.start[:bs], 0, L, pos=pos, n=n)
        if w < n:
            x = x.view(bs, n - 1, -1)[:, : w - 1].reshape(bs * (w - 1), -1)
        drafts = s.drafts[:bs, : w - 1]
        if self.t.shard.on:  # each rank's best of its vocabulary rows, then the best of those
            drafts.copy_(self.t.shard.argmax(d.logits(x)).view(bs, w - 1))
        elif self.t.kernels is not None and d.plain_head:
            self.t.kernels.gemm.linear_argmax(x, d.lm_head, drafts)
        else:
            self.argmax(d.logits(x).view(bs, w - 1, -1), drafts)

    def verify(self, bs: int, L: int, w: int) -> None:
        """The target over `[anchor, drafts]`, then the commit. The drafter's context K/V of every row's 16
        positions is written from the tapped features here: the accepted ones are the next draft's context,
        and the rest lie at or past the new start, where that draft's own block is written before it is read.
        Rows outside the step write only there too, as their target rows do."""
        s, d = self.s, self.d
        assert d is not None
        ids = s.tokens[:bs, :w]
        if w == 1:  # no draft ran to set the positions
            s.pos[:bs, 0].copy_(s.start[:bs])
        side = self.side
        main, keep = torch.cuda.current_stream() if side else None, []

        def context(feats: list[torch.Tensor], pos: torch.Tensor) -> None:
            if side is None or main is None:
                d.write_context(feats, pos, 0)
                return
            keep.append((feats, pos))  # alive until the join: main's allocator must not reuse it meanwhile
            side.wait_stream(main)
            with torch.cuda.stream(side):
                d.write_context(feats, pos, 0, lane=1)
        x, _ = self.t.forward(ids, s.start[:bs], 0, L, taps=self.taps, on_taps=context, head=False,
                              pos=s.pos[:bs, :w])
        post = self.greedy(x, bs, w)
        if side is not None and main is not None:
            main.wait_stream(side)
        self.commit(bs, post, w)

    def mixed(self, bs: int, P: int, k: int) -> None:
        """The AR step of rows 0..bs-1 with the k prompts `pre_in` holds (padded to P): the rows' commit, then each
        prompt's slot takes its length as start and its first token as anchor."""
        s = self.s
        slot, last, ids = s.pre_in[0:k], s.pre_in[k:2 * k], s.pre_in[2 * k:2 * k + k * P].view(k, P)
        x, xp = self.t.forward_mixed(s.anchor[:bs], s.start[:bs], self.max_len, ids, slot, last, s.pre_start[:k])
        self.commit(bs, self.greedy(x, bs, 1))
        tok = self.argmax(self.t.shard.gather_vocab(matmul(self.t.kernels)(xp, self.t.lm_head)).view(k, 1, -1)).view(k)
        s.pre_tok[:k].copy_(tok)
        s.start.index_copy_(0, slot, last + 1 - self.t.index.offsets(k, slot.device) * P)  # last = i * P + n_i - 1
        s.anchor.index_copy_(0, slot, tok)

    def greedy(self, x: torch.Tensor, bs: int, n: int) -> torch.Tensor:
        """The target's greedy tokens `[bs, n]` from its final hidden rows; the logits are written (for
        logprobs) only when the state keeps them. With `shard`, from this rank's vocabulary rows: the logits gathered
        where they are kept, else the best of each rank's best."""
        shard = self.t.shard
        if self.s.logits is None and self.t.kernels is not None and not shard.on:
            return self.t.kernels.gemm.linear_argmax(x, self.t.lm_head).view(bs, n)
        logits = softcap(matmul(self.t.kernels)(x, self.t.lm_head), self.t.softcap)
        if shard.on and self.s.logits is None:
            return shard.argmax(logits).view(bs, n)
        logits = shard.gather_vocab(logits).view(bs, n, -1)
        if self.s.logits is not None:
            self.s.logits[:bs, :n] = logits
        return self.argmax(logits)

    def argmax(self, logits: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Greedy tokens of `logits` `[bs, n, V]` -> `[bs, n]`, written into `out` when given."""
        if self.t.kernels is not None:
            return self.t.kernels.ops.argmax(logits, out)
        ids = logits.argmax(-1)
        return ids if out is None else out.copy_(ids)

    def commit(self, bs: int, post: torch.Tensor, w: int = 1) -> None:
        s = self.s
        synth = (self.draws, self.synth_step[:bs], ACCEPT_BELOW) if self.synthetic is not None else None
        fn = commit if self.t.kernels is None else self.t.kernels.ops.commit  # the kernel: one launch, not a dozen
        fn(post, s.drafts[:bs], s.active[:bs], s.start[:bs], s.anchor[:bs], s.out[:bs, : w + 1], synth)
