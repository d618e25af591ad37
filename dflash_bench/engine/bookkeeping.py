"""Request bookkeeping, the same for both engines: slots, the commit of a step's tokens (stop rules), counters.

An engine (`decode.ReferenceEngine`, `fast.engine.FastEngine`) computes tokens; it hands them to its
`Bookkeeping`, which appends them to the request, stops it at EOS, a stop id, max_tokens or a stop string,
and counts them with vLLM's semantics for /metrics.
"""

from __future__ import annotations

from itertools import islice
from typing import Any, Callable, Iterable, Sequence

from dataclasses import dataclass, field

import torch

from dflash_bench.engine.detok import Detokenizer
from dflash_bench.engine.sampling_params import SamplingParams


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
    steps: int = 0  # verify steps as metrics/definitions.py's tau counts them (a draft in vLLM's counting)
    accepted: int = 0  # accepted draft tokens committed (none past EOS, a stop or max_tokens)
    drafted: int = 0  # draft positions verified inside the request (the adaptive fast path verifies fewer than B - 1)
    cached: int = 0  # prompt tokens whose K/V was found in the slot (a prefix cache's hit), not computed


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
    drafted: int = 0  # draft tokens verified so far
    cached_tokens: int = 0  # prompt tokens read from the prefix cache (usage.prompt_tokens_details.cached_tokens)


@dataclass
class Stats:
    """Counters with vLLM's speculative-decoding semantics (read by /metrics)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # [i]: drafts that accepted positions 0..i
    verified_per_pos: list[int] = field(default_factory=list)  # [i]: drafts that verified positions 0..i
    widths: dict[int, int] = field(default_factory=dict)  # tokens verified per row (anchor + drafts) -> row-steps
    generation_tokens: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of prompt_tokens, those read from the prefix cache
    requests: int = 0  # finished (stop or length); aborted ones are not counted, as in vLLM


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """The token ids that end a request: the model's (its generation config's and config's) and the tokenizer's."""
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        ids.update(e if isinstance(e, list) else [] if e is None else [e])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


def admission_cut(lengths: Iterable[int], free: int, fits: Callable[[int, int], bool]) -> int:
    """How many of the waiting prompts (`lengths`, oldest first; read no further than needed) the next prefill takes:
    the oldest ones, at most `free` (the free slots), while `fits(k, longest)` says k of them go into one prefill
    forward. The oldest is taken whatever its length: it is prefilled alone. Each engine brings its own `fits`."""
    k = longest = 0
    for n in islice(lengths, free):
        longest = max(longest, n)
        if k and not fits(k + 1, longest):
            break
        k += 1
    return k


def length_groups(lengths: Sequence[int], fits: Callable[[int, int], bool]) -> list[list[int]]:
    """The prompts of these lengths (their indices) in prefill groups: shortest first, similar lengths together, a
    group cut where `fits(k, longest)` says one more would not go into its forward (each engine brings its own)."""
    groups: list[list[int]] = [[]]
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):  # the newcomer is the longest of its group
        if groups[-1] and not fits(len(groups[-1]) + 1, lengths[i]):
            groups.append([])
        groups[-1].append(i)
    return [g for g in groups if g]


def request_refusal(n_prompt: int, max_tokens: int, max_len: int, block_size: int) -> str | None:
    """Why a request of `n_prompt` tokens asking for `max_tokens` cannot be served by an engine of `max_len`
    positions a slot and verify blocks of `block_size` (None when it can): the engine's rule, which a server whose
    engine runs in another process applies too."""
    room = max_len - block_size - 1
    if n_prompt < 1:
        return "the prompt is empty"
    if n_prompt + max_tokens > room:
        return (f"the prompt ({n_prompt} tokens) plus max_tokens ({max_tokens}) is longer than this server's "
                f"limit of {room} tokens")
    return None


def out_of_vocabulary(prompt: list[int], vocab_size: int) -> str | None:
    """Why a prompt's token ids cannot be fed to a model of `vocab_size` tokens (None when they can): the
    engine's admission and the server's 400 say the same."""
    for i, t in enumerate(prompt):
        if not 0 <= t < vocab_size:
            return (f"the prompt's token id {t} (position {i}) is outside the vocabulary of {vocab_size} tokens "
                    f"(0 to {vocab_size - 1})")
    return None


class Bookkeeping:
    """The requests of one engine: which slot each holds, what it has produced, when it stops."""

    def __init__(self, tokenizer: Any, *, eos_ids: list[int], block_size: int, slots: int, max_len: int,
                 vocab_size: int) -> None:
        self.tok, self.eos_ids, self.B, self.max_len = tokenizer, set(eos_ids), block_size, max_len
        self.vocab_size = vocab_size  # every prompt id is below it
        self.slots = slots  # the KV pool's rows (/metrics dflash_bench:max_slots)
        self.free_slots = list(range(slots - 1, -1, -1))  # popped from the end: lowest slot first
        n = max(block_size - 1, 0)
        self.stats = Stats(accepted_per_pos=[0] * n, verified_per_pos=[0] * n)
        # how each step's verify width is chosen: "full" (the whole block), "auto" (by load) or "w<N>" (fixed N)
        self.width_policy = "full"

    def check(self, n_prompt: int, max_tokens: int) -> str | None:
        """Why a request cannot be served (None when it can)."""
        return request_refusal(n_prompt, max_tokens, self.max_len, self.B)

    def open(self, req_id: str, prompt: list[int], params: SamplingParams, slot: int | None = None) -> Seq:
        """A new request in the lowest free slot (the fast path's batch bucket covers slots 0..highest), or in
        `slot`, a free one (a prefix cache's hit)."""
        if why := out_of_vocabulary(prompt, self.vocab_size):
            raise ValueError(f"request {req_id!r}: {why}")  # before any id reaches a kernel (the C ones do not check)
        if not self.free_slots:
            raise RuntimeError("every slot is taken: admit at most len(engine.free_slots) requests at a time")
        self.free_slots.sort(reverse=True)
        if slot is None:
            slot = self.free_slots.pop()
        else:
            self.free_slots.remove(slot)
        return Seq(req_id, list(prompt), params, slot, Detokenizer(self.tok, params.stop, prompt[-4:]))

    def release(self, s: Seq) -> None:
        """Give the sequence's slot back (after it finished, failed or was aborted)."""
        if s.slot >= 0:
            self.free_slots.append(s.slot)
            s.slot = -1

    def prefilled(self, s: Seq, token: int, logits: torch.Tensor | None) -> Delta:
        """The prompt is in the cache and `token` is the first generated one (`logits`: its row, needed only for
        logprobs)."""
        s.start = len(s.prompt)
        self.stats.prompt_tokens += len(s.prompt)
        self.stats.cached_prompt_tokens += s.cached
        return self.commit(s, [token], logits)

    def stepped(self, s: Seq, tokens: list[int], logits: torch.Tensor | None, width: int | None = None,
                lps: Logprobs | None = None) -> Delta:
        """One verify step: `tokens` are the accepted drafts, then the bonus token (AR: the one token);
        `logits`: their rows, needed only for logprobs the caller did not compute; `width`: tokens the step verified
        for this row (default: the whole block); `lps`: the tokens' logprobs when the caller computed them for the
        whole step (`step_logprobs`).

        Counted by metrics/definitions.py's tau: only draft positions inside the request (max_tokens) count as
        drafted, only committed tokens as accepted, and a step with no draft position left is no verify step."""
        verified, room = width or self.B, s.params.max_tokens - len(s.out)  # room: tokens the request may commit
        if self.B > 1:
            self.stats.widths[verified] = self.stats.widths.get(verified, 0) + 1
        s.start += len(tokens)
        drafted = min(verified - 1, max(room - 1, 0)) if self.B > 1 else 0
        return self.commit(s, tokens, logits, lps, drafted=drafted)

    def _count(self, s: Seq, a: int, drafted: int) -> None:
        st = self.stats
        if drafted:  # a step that verified the anchor alone drafted nothing: not a draft
            st.drafts += 1
            st.draft_tokens += drafted
            st.accepted += a
            for i in range(a):
                st.accepted_per_pos[i] += 1
            for i in range(drafted):
                st.verified_per_pos[i] += 1
            s.steps += 1
            s.accepted += a
            s.drafted += drafted

    def commit(self, s: Seq, tokens: list[int], logits: torch.Tensor | None, lps: Logprobs | None = None,
               drafted: int | None = None) -> Delta:
        """Append a step's tokens, stopping at EOS, stop ids, max_tokens or stop strings; a verify step
        (`drafted` given) counts as accepted the drafts committed, never one cut by a stop."""
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
        if drafted is not None:
            self._count(s, len(tokens) - 1, drafted)
        if finish:
            s.detok.flush()
            self.stats.requests += 1
        self.stats.generation_tokens += len(tokens)
        if p.logprobs is not None:
            if lps is None:
                assert logits is not None, "logprobs need the step's logits"
                lps = step_logprobs([(logits, tokens, p.logprobs)])[0]
            lps = lps[: len(tokens)]
        else:
            lps = None
        return Delta(s.req_id, tokens, s.detok.delta(finish is not None), len(s.prompt), len(s.out), finish, lps,
                     s.steps, s.accepted, s.drafted, s.cached)


Logprobs = list[tuple[int, float, list[tuple[int, float]]]]  # per token: (token, logprob, top (token, logprob))


def step_logprobs(rows: list[tuple[torch.Tensor, list[int], int]]) -> list[Logprobs]:
    """Logprobs of a step's tokens for many rows at once: per row its logits `[>= n, V]`, its n tokens and how
    many top alternatives it wants. One log-softmax, gather and top-k over every row, and one copy to the host
    (a copy per row and per kind was a host round trip each: most of a batched step's time with logprobs on)."""
    if not rows:
        return []
    n = [len(t) for _, t, _ in rows]
    lp = torch.log_softmax(torch.cat([lg[:k] for (lg, _, _), k in zip(rows, n)]).float(), -1)
    ids = torch.tensor([t for _, ts, _ in rows for t in ts], device=lp.device)
    top = max(k for _, _, k in rows)
    parts = [lp.gather(-1, ids[:, None])]
    if top > 0:
        vals, idx = lp.topk(top, -1)
        parts += [vals, idx.float()]  # token ids are exact in float32 below 2**24
    host = torch.cat(parts, 1).tolist()
    out, i = [], 0
    for (_, tokens, k), m in zip(rows, n):
        out.append([(t, r[0], [(int(j), v) for j, v in zip(r[1 + top: 1 + top + k], r[1: 1 + k])])
                    for t, r in zip(tokens, host[i: i + m])])
        i += m
    return out
