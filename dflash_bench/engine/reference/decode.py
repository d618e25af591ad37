"""The decode loop: prefill, draft, verify, accept, roll back; AR is the same loop with B = 1, no drafts.

Every step feeds each running sequence `[anchor, d_1..d_{B-1}]` at its own positions in one batched target
pass; acceptance is ragged per row (`start += accepted + 1`), which needs no KV copy because the slot cache
only counts positions below `start`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Sequence

import torch

from dflash_bench.engine.bookkeeping import Bookkeeping, Delta, Seq, Stats, admission_cut, eos_ids, length_groups, step_logprobs
from dflash_bench.engine.config import DEFAULT_SLOTS, EngineConfig
from dflash_bench.engine.reference.propose import Proposer
from dflash_bench.engine.interface import Engine
from dflash_bench.engine.reference.sampling import accept, sample_drafts, sample_tokens
from dflash_bench.engine.sampling_params import SamplingParams
from dflash_bench.engine.reference.target import ReferenceTarget, resolve_dtype


PREFILL_ROWS = 8  # requests per prefill forward on a GPU (on a CPU prefill is compute-bound: one at a time)
PREFILL_TOKENS = 16384  # rows x longest prompt per prefill forward (bounds the padded batch)


class ReferenceEngine:
    """The `interface.Engine` over a `ReferenceTarget` and an optional proposer. Not thread-safe: one thread drives it."""

    greedy_only = False
    synthetic_acceptance: float | None = None

    def __init__(self, target: ReferenceTarget, tokenizer: Any, proposer: Proposer | None = None, *, eos_ids: list[int]) -> None:
        self.target, self.tok, self.proposer = target, tokenizer, proposer
        self.B = proposer.block_size if proposer else 1
        if proposer and proposer.layer_ids:
            target.tap(proposer.layer_ids)
        self.max_model_len, self.vocab_size = target.max_len, target.vocab_size
        self.book = Bookkeeping(tokenizer, eos_ids=eos_ids, block_size=self.B, slots=len(target.cache.k[0]),
                                max_len=target.max_len, vocab_size=target.vocab_size)
        self.device = target.device
        self.prefill_rows = PREFILL_ROWS if self.device.type == "cuda" else 1
        self.prefill_tokens = PREFILL_TOKENS

    @property
    def stats(self) -> Stats:
        return self.book.stats

    @property
    def free_slots(self) -> list[int]:
        return self.book.free_slots

    @property
    def eos_ids(self) -> set[int]:
        return self.book.eos_ids

    def check(self, n_prompt: int, max_tokens: int) -> str | None:
        return self.book.check(n_prompt, max_tokens)

    def fits(self, k: int, longest: int) -> bool:
        """Whether k prompts, the longest of `longest` tokens, go into one prefill forward."""
        return k <= self.prefill_rows and k * longest <= self.prefill_tokens

    def admission(self, prompts: Iterable[Sequence[int]]) -> int:
        """How many of the waiting prompts (oldest first) the next `add_many` takes: at most the free slots, while
        they fit one forward (`fits`; bookkeeping.admission_cut)."""
        return admission_cut((len(p) for p in prompts), len(self.free_slots), self.fits)

    def add(self, req_id: str, prompt: list[int], params: SamplingParams) -> tuple[Seq, Delta]:
        """Prefill one new request into a free slot; returns the sequence and its first token."""
        seq, first = self.add_many([(req_id, prompt, params)])[0]
        assert first is not None  # this engine prefills at once: the first token is there
        return seq, first

    @torch.inference_mode()
    def add_many(self, reqs: list[tuple[str, list[int], SamplingParams]]) -> list[tuple[Seq, Delta | None]]:
        """Prefill new requests, several per forward (similar lengths together); results in input order."""
        done: dict[int, tuple[Seq, Delta]] = {}
        try:
            for g in length_groups([len(r[1]) for r in reqs], self.fits):
                done.update(zip(g, self._prefill([reqs[j] for j in g])))
        except BaseException:  # all or nothing: no slot stays taken by a request nobody will hear about
            for seq, _ in done.values():
                self.release(seq)
            raise
        return [done[i] for i in range(len(reqs))]

    def _prefill(self, reqs: list[tuple[str, list[int], SamplingParams]]) -> list[tuple[Seq, Delta]]:
        """One target forward over right-padded prompts (padding sits past each row's end and is overwritten)."""
        dev = self.device
        seqs = []
        try:
            for req_id, prompt, params in reqs:
                if params.seed is not None:  # the request's own random stream, whatever else is in the batch
                    params = dataclasses.replace(params, generator=torch.Generator(device=dev).manual_seed(params.seed))
                seqs.append(self.book.open(req_id, prompt, params))
            return self._prefill_rows(seqs)
        except BaseException:
            for s in seqs:
                self.release(s)
            raise

    def _prefill_rows(self, seqs: list[Seq]) -> list[tuple[Seq, Delta]]:
        dev, n = self.device, len(seqs)
        lens = [len(s.prompt) for s in seqs]
        ids = torch.zeros(n, max(lens), dtype=torch.long)
        for row, s in enumerate(seqs):
            ids[row, : lens[row]] = torch.tensor(s.prompt)
        last = torch.tensor(lens, device=dev) - 1
        keep = torch.unique(last)  # logits only where some row ends
        logits, feats = self.target.forward(ids.to(dev), torch.zeros(n, dtype=torch.long, device=dev),
                                            torch.tensor([s.slot for s in seqs], device=dev), keep=keep)
        logits = logits[torch.arange(n, device=dev), torch.searchsorted(keep, last)]  # [n, V]
        toks = sample_tokens(logits, [s.params for s in seqs]).tolist()
        out = []
        for row, s in enumerate(seqs):
            if self.proposer:
                self.proposer.prefill(s.slot, None if feats is None else feats[row, : lens[row]])
            out.append((s, self.book.prefilled(s, toks[row], logits[row : row + 1])))
        return out

    @torch.inference_mode()
    def step(self, seqs: list[Seq]) -> list[Delta]:
        """One verify step for every running sequence (each gets 1..B new tokens)."""
        dev, params = self.device, [s.params for s in seqs]
        slots = torch.tensor([s.slot for s in seqs], device=dev)
        starts = torch.tensor([s.start for s in seqs], device=dev)
        anchors = torch.tensor([[s.out[-1]] for s in seqs], device=dev)
        if self.B == 1:
            logits, _ = self.target.forward(anchors, starts, slots)
            bonus = sample_tokens(logits[:, 0], params)
            acc = torch.zeros_like(bonus)
            drafts = bonus[:, None][:, :0]
        else:
            assert self.proposer is not None  # B > 1
            drafts, q = self._draft(seqs, params)
            logits, feats = self.target.forward(torch.cat([anchors, drafts], 1), starts, slots)
            acc, bonus = accept(logits, drafts, q, params)
            self.proposer.commit(seqs, feats, starts)
        host = torch.cat([acc[:, None], bonus[:, None], drafts], 1).tolist()  # one device-to-host copy a step
        tokens = [h[2:][: h[0]] + [h[1]] for h in host]
        want = [row for row, s in enumerate(seqs) if s.params.logprobs is not None]
        lps = dict(zip(want, step_logprobs([(logits[row], tokens[row], seqs[row].params.logprobs or 0)
                                            for row in want])))
        return [self.book.stepped(s, tokens[row], logits[row, : len(tokens[row])], lps=lps.get(row))
                for row, s in enumerate(seqs)]

    def _draft(self, seqs: list[Seq], params: list[SamplingParams]) -> tuple[torch.Tensor, torch.Tensor | None]:
        assert self.proposer is not None  # drafts are asked for with B > 1 only
        tokens, draft_logits = self.proposer.propose(seqs)
        if tokens is not None:
            return tokens.to(self.device), None
        assert draft_logits is not None  # a proposer gives tokens or their logits
        return sample_drafts(draft_logits, params)

    def release(self, s: Seq) -> None:
        self.book.release(s)

    def reset_prefix_cache(self) -> None:
        """Nothing to forget: the reference engine computes every prompt whole."""


def generate(engine: Engine, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[Seq]:
    """Run prompts to completion, all admitted at once and batched (tests and offline use)."""
    plist = params if isinstance(params, list) else [params] * len(prompts)
    seqs = [s for s, _ in engine.add_many([(str(i), p, sp) for i, (p, sp) in enumerate(zip(prompts, plist))])]
    running = [s for s in seqs if not s.finish]
    while running:
        engine.step(running)
        for s in running:
            if s.finish:
                engine.release(s)
        running = [s for s in running if not s.finish]
    for s in seqs:
        engine.release(s)
    return seqs


def reference_engine(config: EngineConfig, tokenizer: Any) -> ReferenceEngine:
    """The reference engine `config` asks for (as `build.build` resolved it): the target, and in dflash mode the
    drafter, loaded (`config.dummy`: random weights of the configs' shapes), `config.slots` slots of
    `max_model_len` tokens each."""
    from dflash_bench.engine.reference.drafter import load_drafter
    from dflash_bench.engine.reference.propose import DFlashProposer

    device, dt, n = config.device, resolve_dtype(config.dtype, config.device), config.slots or DEFAULT_SLOTS
    if device != "cpu":  # cuDNN attention plans a kernel per new shape; the KV length changes every step
        torch.backends.cuda.enable_cudnn_sdp(False)
    target = ReferenceTarget(config.model, dtype=dt, device=device, max_slots=n, max_len=config.max_model_len,
                             dummy=config.dummy)
    proposer = None
    if config.draft is not None:
        drafter = load_drafter(config.draft, target_hidden=target.hidden_size, target_layers=target.n_layers,
                               target_vocab=target.vocab_size, dtype=dt, device=device, dummy=config.dummy)
        proposer = DFlashProposer(drafter, target.embed_weight(), target.lm_head(), max_slots=n,
                                  max_len=config.max_model_len)
    return ReferenceEngine(target, tokenizer, proposer, eos_ids=eos_ids(target.model, tokenizer))
