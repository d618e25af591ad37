"""A `FastRunner`'s prompts: prefilled into their slots, one graph per prompt or per group of 2-3, or a larger group
in one forward.

The runner's half that admits requests (its other half steps them). A prefill writes the prompt's K/V (and the
drafter's context) into its slot and leaves the first generated token as the slot's anchor.
"""

from __future__ import annotations

import torch

from dflash_bench.engine.fast.model import offsets

PREFILL_BUCKET = 64  # prompts are padded to a multiple of this: one prefill graph per multiple
# Prefilling k prompts (benchmarks/prefill_speed.py, H100, Qwen3-8B shape), ms per prompt at k = 1, 2, 4, 8, 32,
# one eager forward for k > 1: 128 tokens 7.7, 11.8, 6.8, 3.4, 3.3; 320 tokens 11.8, 13.7, 8.7, 8.7, 8.3 (one graph
# each: 7.7 and 11.5 at any k). Past ~1-2k tokens a forward is compute-bound: a larger group only delays its first
# tokens. Under 4 prompts the eager forward's launches (~20 ms of host time) cost more than the graphs.
PREFILL_TOKENS = 2048  # padded prompt tokens per batched prefill forward at most
BATCHED_PREFILL_ROWS = 4  # GPU: prompts from which a group is prefilled in one eager forward, not graph by graph
# GPU: groups of 2 or 3 prompts run one graph of k rows padded to the longest (its bucket): one forward reads the
# weights once and fills more of the GPU than k one-row graphs, without an eager forward's ~20 ms of launches
GRAPHED_ROWS = (2, 3)
PREFILL_LANE = 2  # split-K workspace of a prefill's one-row matmul (the head): the steps use 0 and 1


def stage(buf: torch.Tensor, slots: list[int], prompts: list[list[int]], P: int) -> int:
    """A prefill graph's inputs in `buf` (host memory): the k slots, the index of each prompt's last token in the
    k x P ids, and the ids, each prompt padded with zeros to P. Returns how many entries it wrote."""
    k = len(prompts)
    for i, (slot, prompt) in enumerate(zip(slots, prompts)):
        n, at = len(prompt), 2 * k + i * P
        buf[i], buf[k + i] = slot, i * P + n - 1
        buf[at:at + n] = torch.tensor(prompt, dtype=torch.long)
        buf[at + n:at + P] = 0
    return 2 * k + k * P


class Prefills:
    """The prefill methods of `FastRunner` (which holds the state they use: see there)."""

    @torch.inference_mode()
    def add(self, slot: int, prompt: list[int]) -> int:
        """Prefill `prompt` into `slot`; returns the first generated token.

        The prompt is padded to its length bucket (a multiple of PREFILL_BUCKET) and run by that bucket's
        graph, whatever the slot: eagerly, a prefill's ~400 kernel launches cost the host 3-4x the GPU's
        time. The padding's K/V lands past the prompt, where no query looks before a step rewrites it.
        """
        n = len(prompt)
        if not 0 < n <= self.max_len:
            raise IndexError(f"a prompt of {n} tokens does not fit the cache of {self.max_len} positions")
        return self._prefill_graphed([slot], [prompt])[0]

    def _prefill_graphed(self, slots: list[int], prompts: list[list[int]]) -> list[int]:
        """k prompts (k = 1 or in GRAPHED_ROWS) by the graph of k rows and their longest prompt's bucket."""
        k, n = len(prompts), [len(p) for p in prompts]
        P = self.stage_in(self.pre_host, slots, prompts)
        self.prefill_graph(P, k)
        toks = self.pre_tok[:k]
        for i, slot in enumerate(slots):
            self.admit(slot, n[i], toks[i])
        return toks.tolist()

    def stage_in(self, buf: torch.Tensor, slots: list[int], prompts: list[list[int]]) -> int:
        """Stage k prompts in `buf` (pinned host memory) and copy them into `pre_in` on the current stream, padded
        to their longest one's bucket, which it returns."""
        P = self.padded(max(map(len, prompts)))
        m = stage(buf, slots, prompts, P)
        self.pre_in[:m].copy_(buf[:m], non_blocking=True)
        return P

    def padded(self, n: int) -> int:
        """A prompt's length bucket: `n` up to a multiple of PREFILL_BUCKET (at most the cache)."""
        return min(-(-n // PREFILL_BUCKET) * PREFILL_BUCKET, self.max_len)

    def prefill_graph(self, P: int, k: int = 1) -> None:
        """Run the prefill of the k prompts `pre_in` holds, padded to P (their graph on a GPU), on the current
        stream."""
        self._run(("prefill", P) if k == 1 else ("prefill", P, k), lambda: self._prefill(P, k))

    def grouped_buckets(self) -> list[tuple[int, int]]:
        """(P, k) of every graph of several rows a group may need: k in GRAPHED_ROWS, k * P within a group's
        tokens (a group of k is cut at PREFILL_TOKENS before padding, so its bucket may pass it by < k buckets)."""
        out = []
        for k in GRAPHED_ROWS:
            top = self.padded(-(-PREFILL_TOKENS // k))
            out += [(P, k) for P in range(PREFILL_BUCKET, min(top, self.max_len) + 1, PREFILL_BUCKET)]
        return out

    @torch.inference_mode()
    def add_many(self, slots: list[int], prompts: list[list[int]]) -> list[int]:
        """Prefill `prompts[i]` into `slots[i]`; returns each one's first generated token, in input order.

        Prompts of similar length go together, right-padded to the longest of their group, in forwards of at
        most PREFILL_TOKENS padded tokens: the group reads the weights once, and the host launches one
        forward, not one per prompt. On a GPU a group of GRAPHED_ROWS prompts runs the captured graph of that
        many rows instead: an eager forward's launches cost the host more than such a group's GPU time.
        Nothing is run unless every prompt fits the cache.
        """
        for p in prompts:
            if not 0 < len(p) <= self.max_len:
                raise IndexError(f"a prompt of {len(p)} tokens does not fit the cache of {self.max_len} positions")
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        groups: list[list[int]] = [[]]
        for i in order:  # sorted: the newcomer is the longest of its group
            if groups[-1] and (len(groups[-1]) + 1) * len(prompts[i]) > PREFILL_TOKENS:
                groups.append([])
            groups[-1].append(i)
        toks: dict[int, int] = {}
        for g in groups:
            if len(g) == 1 or (self.graphs_on and len(g) in GRAPHED_ROWS):
                toks.update(zip(g, self._prefill_graphed([slots[i] for i in g], [prompts[i] for i in g])))
            else:
                toks.update(zip(g, self._prefill_rows([slots[i] for i in g], [prompts[i] for i in g])))
        return [toks[i] for i in range(len(prompts))]

    def _prefill_rows(self, slots: list[int], prompts: list[list[int]]) -> list[int]:
        """One eager forward over right-padded prompts (the padding's K/V lands past each prompt, as in `add`)."""
        k, n = len(prompts), [len(p) for p in prompts]
        P = max(n)
        ids = torch.zeros(k, P, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, : n[i]] = torch.tensor(p, dtype=torch.long)
        dev = self.dev
        ids = ids.to(dev, non_blocking=True)
        slot = torch.tensor(slots, device=dev)
        last = torch.tensor([i * P + m - 1 for i, m in enumerate(n)], device=dev)
        logits, feats = self.t.forward(ids, torch.zeros(k, dtype=torch.long, device=dev), 0, P, last_only=True,
                                       taps=self.taps, slot=slot, last=last)
        if self.d:
            self.d.write_context(feats, offsets(P, dev).expand(k, P), 0, slot=slot)
        if self.logits is not None:
            self.logits[:, 0].index_copy_(0, slot, logits[:, 0])
        tok = logits[:, 0].argmax(-1)
        for i, s in enumerate(slots):
            self.admit(s, n[i], tok[i])
        return tok.tolist()

    def admit(self, slot: int, n: int, tok: torch.Tensor) -> None:
        """A prefilled slot's state: its anchor is the first token, `n` positions are committed."""
        self.start[slot] = n
        self.anchor[slot] = tok
        self.active[slot] = 1
        self.host_start[slot] = n
        self.admitted[slot] += 1

    def _prefill(self, P: int, k: int = 1) -> None:
        """k prompts padded to P tokens into the slots `pre_in` holds (`stage`); their first tokens into
        `pre_tok`."""
        slot, last, ids = self.pre_in[0:k], self.pre_in[k:2 * k], self.pre_in[2 * k:2 * k + k * P].view(k, P)
        logits, feats = self.t.forward(ids, self.pre_start[:k], 0, P, last_only=True, taps=self.taps, slot=slot,
                                       last=last, lane=PREFILL_LANE)
        if self.d:
            self.d.write_context(feats, offsets(P, self.dev).expand(k, P), 0, slot=slot)
        if self.logits is not None:
            self.logits[:, 0].index_copy_(0, slot, logits[:, 0])
        self.pre_tok[:k].copy_(logits[:, -1].argmax(-1))
