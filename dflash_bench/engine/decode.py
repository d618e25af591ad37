"""The decode loop: prefill, draft, verify, accept, roll back; AR is the same loop with B = 1, no drafts.

Every step feeds each running sequence `[anchor, d_1..d_{B-1}]` at its own positions in one batched target
pass; acceptance is ragged per row (`start += accepted + 1`), which needs no KV copy because the slot cache
only counts positions below `start`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from dflash_bench.engine.detok import Detokenizer
from dflash_bench.engine.propose import Proposer
from dflash_bench.engine.sampling import SamplingParams, accept, sample_drafts, sample_tokens
from dflash_bench.engine.target import Target


@dataclass
class Seq:
    req_id: str
    prompt: list[int]
    params: SamplingParams
    slot: int
    detok: Detokenizer
    start: int = 0  # position of the anchor (= committed target KV length)
    out: list[int] = field(default_factory=list)  # generated tokens; out[-1] is the anchor
    finish: str | None = None
    steps: int = 0  # verify steps (each one a draft in vLLM's counting when B > 1)
    accepted: int = 0  # accepted draft tokens over all steps


@dataclass
class Delta:
    """What one step produced for one request (streamed to the client as one chunk)."""

    req_id: str
    token_ids: list[int]
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish: str | None = None
    logprobs: list[tuple[int, float, list[tuple[int, float]]]] | None = None
    steps: int = 0  # verify steps so far
    accepted: int = 0  # accepted draft tokens so far


@dataclass
class Stats:
    """Counters with vLLM's speculative-decoding semantics (read by /metrics)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    generation_tokens: int = 0
    prompt_tokens: int = 0
    requests: int = 0  # finished (stop or length); aborted ones are not counted, as in vLLM


PREFILL_ROWS = 8  # requests per prefill forward on a GPU (on a CPU prefill is compute-bound: one at a time)
PREFILL_TOKENS = 16384  # rows x longest prompt per prefill forward (bounds the padded batch)


class Engine:
    """Owns the target, the optional proposer and the slots. Not thread-safe: one thread drives it."""

    def __init__(self, target: Target, tokenizer, proposer: Proposer | None = None, *, eos_ids: list[int]):
        self.target, self.tok, self.proposer = target, tokenizer, proposer
        self.B = proposer.block_size if proposer else 1
        if proposer and proposer.layer_ids:
            target.tap(proposer.layer_ids)
        self.free_slots = list(range(len(target.cache.k[0]) - 1, -1, -1))
        self.eos_ids = set(eos_ids)
        self.stats = Stats(accepted_per_pos=[0] * max(self.B - 1, 0))
        self.device = target.device
        self.prefill_rows = PREFILL_ROWS if self.device.type == "cuda" else 1

    def check(self, n_prompt: int, max_tokens: int) -> str | None:
        """Why a request cannot be served (None when it can)."""
        room = self.target.max_len - self.B - 1
        if n_prompt < 1:
            return "the prompt is empty"
        if n_prompt + max_tokens > room:
            return (f"the prompt ({n_prompt} tokens) plus max_tokens ({max_tokens}) is longer than this server's "
                    f"limit of {room} tokens")
        return None

    def add(self, req_id: str, prompt: list[int], params: SamplingParams) -> tuple[Seq, Delta]:
        """Prefill one new request into a free slot; returns the sequence and its first token."""
        return self.add_many([(req_id, prompt, params)])[0]

    @torch.inference_mode()
    def add_many(self, reqs: list[tuple[str, list[int], SamplingParams]]) -> list[tuple[Seq, Delta]]:
        """Prefill new requests, several per forward (similar lengths together); results in input order."""
        order = sorted(range(len(reqs)), key=lambda i: len(reqs[i][1]))
        groups: list[list[int]] = [[]]
        for i in order:
            longest = len(reqs[i][1])  # sorted: the newcomer is the longest of its group
            g = groups[-1]
            if g and (len(g) >= self.prefill_rows or (len(g) + 1) * longest > PREFILL_TOKENS):
                groups.append(g := [])
            g.append(i)
        done: dict[int, tuple[Seq, Delta]] = {}
        try:
            for g in groups:
                done.update(zip(g, self._prefill([reqs[j] for j in g])))
        except BaseException:  # all or nothing: no slot stays taken by a request nobody will hear about
            for seq, _ in done.values():
                self.release(seq)
            raise
        return [done[i] for i in range(len(reqs))]

    def _prefill(self, reqs) -> list[tuple[Seq, Delta]]:
        """One target forward over right-padded prompts (padding sits past each row's end and is overwritten)."""
        dev = self.device
        seqs = []
        try:
            for req_id, prompt, params in reqs:
                if params.seed is not None:  # the request's own random stream, whatever else is in the batch
                    params = dataclasses.replace(params, generator=torch.Generator(device=dev).manual_seed(params.seed))
                seqs.append(Seq(req_id, list(prompt), params, self._take_slot(),
                                Detokenizer(self.tok, params.stop, prompt[-4:])))
            return self._prefill_rows(seqs)
        except BaseException:
            for s in seqs:
                self.release(s)
            raise

    def _take_slot(self) -> int:
        if not self.free_slots:
            raise RuntimeError("every slot is taken: admit at most len(engine.free_slots) requests at a time")
        return self.free_slots.pop()

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
            s.start = lens[row]
            self.stats.prompt_tokens += lens[row]
            out.append((s, self._commit(s, [toks[row]], logits[row : row + 1])))
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
            drafts, q = self._draft(seqs, params)
            logits, feats = self.target.forward(torch.cat([anchors, drafts], 1), starts, slots)
            acc, bonus = accept(logits, drafts, q, params)
            self.proposer.commit(seqs, feats, starts)
        host = torch.cat([acc[:, None], bonus[:, None], drafts], 1).tolist()  # one device-to-host copy a step
        deltas = []
        for row, s in enumerate(seqs):
            a, b, d = host[row][0], host[row][1], host[row][2:]
            self._count(a)
            s.start += a + 1
            s.steps += 1
            s.accepted += a
            deltas.append(self._commit(s, d[:a] + [b], logits[row, : a + 1]))
        return deltas

    def _draft(self, seqs, params):
        tokens, draft_logits = self.proposer.propose(seqs)
        if tokens is not None:
            return tokens.to(self.device), None
        return sample_drafts(draft_logits, params)

    def _count(self, a: int) -> None:
        st = self.stats
        if self.B > 1:
            st.drafts += 1
            st.draft_tokens += self.B - 1
            st.accepted += a
            for i in range(a):
                st.accepted_per_pos[i] += 1

    def _commit(self, s: Seq, tokens: list[int], logits: torch.Tensor) -> Delta:
        """Append a step's tokens, stopping at EOS, stop ids, max_tokens or stop strings."""
        p, base = s.params, len(s.out)
        finish = None
        for i, tok in enumerate(tokens):  # cheap id checks first
            n = base + i + 1
            if (tok in self.eos_ids and not p.ignore_eos or tok in p.stop_token_ids) and n > p.min_tokens:
                tokens, finish = tokens[: i + 1], "stop"
                break
            if n >= p.max_tokens:
                tokens, finish = tokens[: i + 1], "length"
                break
        if s.detok.stop:  # stop strings need the text after every token
            for i, tok in enumerate(tokens):
                if s.detok.add([tok]):
                    tokens, finish = tokens[: i + 1], "stop"
                    break
        else:
            s.detok.add(tokens)
        s.out.extend(tokens)
        s.finish = finish
        if finish:
            s.detok.flush()
            self.stats.requests += 1
        self.stats.generation_tokens += len(tokens)
        lps = _logprobs(logits[: len(tokens)], tokens, p.logprobs) if p.logprobs is not None else None
        return Delta(s.req_id, tokens, s.detok.delta(finish is not None), len(s.prompt), len(s.out), finish, lps,
                     s.steps, s.accepted)

    def release(self, s: Seq) -> None:
        """Give the sequence's slot back (after it finished or was aborted)."""
        if s.slot >= 0:
            self.free_slots.append(s.slot)
            s.slot = -1


def _logprobs(logits: torch.Tensor, tokens: list[int], top: int):
    lp = torch.log_softmax(logits.float(), -1)
    chosen = lp.gather(-1, torch.tensor(tokens, device=lp.device)[:, None])[:, 0].tolist()
    out = []
    if top > 0:
        vals, idx = lp.topk(top, -1)
        tops = [list(zip(i, v)) for i, v in zip(idx.tolist(), vals.tolist())]
    else:
        tops = [[] for _ in tokens]
    for t, c, tp in zip(tokens, chosen, tops):
        out.append((t, c, tp))
    return out


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
