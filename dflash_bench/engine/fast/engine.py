"""`FastEngine`: the `interface.Engine` (admit, step, release, counters) on the fast path, over an `EngineCore` (its
scheduler and runner side by side) and a `Bookkeeping`.

The server, `EngineLoop` and /metrics use it as they use the reference engine; `step` launches the next step before it reads this
one's tokens (see there), so it may return no delta for a request admitted since the last call. Greedy
only: a request with temperature > 0 is refused with one sentence (serve without --fast for sampling).
Synthetic acceptance is for benchmarking: it makes every response wrong on purpose, so it is only built
when the caller says it is a benchmark.
"""

from __future__ import annotations

import atexit
from typing import Any, Iterable, Iterator, Sequence

import torch

from dflash_bench.engine.bookkeeping import Bookkeeping, Delta, Seq, Stats, eos_ids, step_logprobs
from dflash_bench.engine.config import EngineConfig
from dflash_bench.engine.fast.make import load_pair, make_core, rank_core
from dflash_bench.engine.fast.parallel.ranks import Followers
from dflash_bench.engine.fast.models.shard import Shard
from dflash_bench.engine.fast.scheduling.scheduler import Row
from dflash_bench.engine.sampling_params import SamplingParams



class FastEngine:
    """The `interface.Engine` over an `EngineCore`; requests are kept by a `Bookkeeping`, as in the reference."""

    greedy_only = True  # the server answers 400 to sampling requests

    def __init__(self, model: Any, tokenizer: Any, drafter: Any, config: EngineConfig, *, eos_ids: list[int],
                 max_slots: int, consume: bool = False, shard: Shard | None = None, followers: Followers | None = None) -> None:
        """`model`: the loaded Hugging Face target (`target.load_model`; with `consume` its layers are dropped once
        copied); `drafter`: a `DFlashDrafter` or None; `config`: serve's engine (its `step`: how the scheduler and
        runner step; `kernels` False: plain torch ops instead of the step's kernels, to compare); `max_slots`: the
        KV pool's slots (`pool.pool_slots`). `shard`, `followers`: rank 0 of a tensor-parallel engine, and the other
        ranks (`ranks.py`)."""
        max_len = config.max_model_len  # the caches' positions per slot
        self.config = config
        self.core = make_core(model, drafter, config.step, max_slots=max_slots, max_len=max_len,
                              kernels=config.kernels, shard=shard, consume=consume,
                              graphs=False if config.enforce_eager else None,
                              watch=followers.watch if followers is not None else None)
        self.followers = followers
        if followers is not None:  # from here on, each runner call is replayed by the other ranks
            followers.on_stop.append(self.core.drop_graphs)  # they hold the group's communicator
            followers.wait_ready()
            self.core.lead(followers)
        assert self.core.logits is not None
        self.logits: torch.Tensor = self.core.logits  # per slot the last step's target logits (for logprobs)
        self.tok, self.B = tokenizer, self.core.B
        self.max_model_len, self.vocab_size = max_len, self.core.vocab_size
        drawn = self.core.synthetic
        self.synthetic_acceptance = drawn.tau if drawn is not None else None  # the profile's tau at full width
        self.book = Bookkeeping(tokenizer, eos_ids=eos_ids, block_size=self.B, slots=max_slots, max_len=max_len,
                                vocab_size=self.core.vocab_size)
        self.book.width_policy = self.core.width_policy

    @property
    def stats(self) -> Stats:
        return self.book.stats

    @property
    def mixed_prefills(self) -> int:
        """Prompts prefilled by the forward of a decode step (`mixed`)."""
        return self.core.rode

    @property
    def free_slots(self) -> list[int]:
        return self.book.free_slots

    def check(self, n_prompt: int, max_tokens: int) -> str | None:
        return self.book.check(n_prompt, max_tokens)

    def admission(self, prompts: Iterable[Sequence[int]]) -> int:
        """How many of the waiting prompts, oldest first, the next `add_many` takes: the scheduler's cut
        (`Scheduler.admission`: the free slots, one prefill forward) over what each leaves to prefill (`_left`)."""
        return self.core.admission(self._left(prompts), len(self.free_slots))

    def _left(self, prompts: Iterable[Sequence[int]]) -> Iterator[tuple[int, bool]]:
        """The tokens each prompt leaves to prefill and whether it resumes a kept prefix, its slot taken as `add_many`
        takes it: the one whose kept prefix it resumes, else the lowest free one (so 32 second turns of a chat, each
        resuming its slot, go into one prefill forward as their new messages, not one a forward as whole
        conversations)."""
        free = list(self.free_slots)
        for p in prompts:
            if not free:
                return
            slot, cached = self._place(p, free)
            free.remove(slot)
            yield len(p) - cached, cached > 0

    def _place(self, prompt: Sequence[int], free: Sequence[int]) -> tuple[int, int]:
        """The free slot a prompt takes and the tokens of it that slot holds: the slot whose kept prefix it resumes
        (`EngineCore.match`), else the lowest free one and none (the batch bucket covers slots 0..highest)."""
        hit = self.core.match(prompt, free)
        return hit if hit is not None else (min(free), 0)

    def add(self, req_id: str, prompt: list[int], params: SamplingParams) -> tuple[Seq, Delta | None]:
        return self.add_many([(req_id, prompt, params)])[0]

    @torch.inference_mode()
    def add_many(self, reqs: list[tuple[str, list[int], SamplingParams]]) -> list[tuple[Seq, Delta | None]]:
        """Prefill several requests, batched by the core (`EngineCore.add_many`); results in input order.

        With `mixed`, prompts admitted while other rows decode wait to ride in their steps: their delta is None
        here, and their first token comes from a later `step`.
        All or nothing, like `ReferenceEngine.add_many`: when it fails, every slot taken here goes back.
        """
        if any(not params.greedy for _, _, params in reqs):
            raise ValueError("the fast path decodes greedily: use temperature 0, or serve without --fast to sample")
        seqs: list[Seq] = []
        try:
            for req_id, prompt, params in reqs:
                slot, cached = self._place(prompt, self.free_slots) if self.free_slots else (None, 0)
                s = self.book.open(req_id, prompt, params, slot)  # no free slot: its sentence
                s.cached = cached
                self.core.claim(s.slot)
                seqs.append(s)
            if not any(s.cached for s in seqs) and self.core.wait_to_ride(
                    [s.slot for s in seqs], [s.prompt for s in seqs], any(s.params.logprobs is not None for s in seqs)):
                return [(s, None) for s in seqs]
            toks = self.core.add_many([s.slot for s in seqs], [s.prompt for s in seqs], [s.cached for s in seqs])
        except BaseException:  # the slots go back, keeping nothing: nobody will hear about these requests
            for s in seqs:
                s.out.clear()
                self.release(s)
            raise
        return [(s, self.book.prefilled(s, tok, self.logits[s.slot, :1])) for s, tok in zip(seqs, toks)]

    def _rode(self, seqs: list[Seq]) -> list[Delta]:
        """The first tokens of the prompts that rode in the step collected last."""
        by_slot = {s.slot: s for s in seqs}
        return [self.book.prefilled(by_slot[slot], tok, None) for slot, tok in self.core.took.items()
                if slot in by_slot]

    def _no_rows(self, seqs: list[Seq]) -> list[Delta]:
        """Nothing left to step while prompts wait to ride: collect the steps they ride in, prefill the rest."""
        core, out = self.core, []
        while core.inflight:
            core.collect()
            out += self._rode(seqs)
        wait = core.unridden()
        if wait:
            by_slot = {s.slot: s for s in seqs}
            toks = core.add_many([slot for slot, _ in wait], [p for _, p in wait])
            out += [self.book.prefilled(by_slot[slot], tok, self.logits[slot, :1]) for (slot, _), tok in zip(wait, toks)]
        return out

    @torch.inference_mode()
    def step(self, seqs: list[Seq]) -> list[Delta]:
        """The tokens of one decode step, for the requests it stepped (not always all of `seqs`).

        Pipelined, the step of this batch was launched on the previous call, so the next one is launched
        before its tokens are read and the GPU does not wait for the host between steps. A request admitted
        since joins the step launched now and gets its tokens on the next call; one that finished early
        leaves a wasted row in the step ahead. What runs is the scheduler's decision (`Scheduler.schedule`:
        step-ahead, logprobs, max_tokens, the cache bound, the prompts that ride); this executes it.
        """
        core = self.core
        stepping = set(core.rows([s.slot for s in seqs]))
        rows = [s for s in seqs if s.slot in stepping]
        if not rows:
            return self._no_rows(seqs)
        core.schedule([Row(s.slot, s.params.logprobs is not None, s.params.max_tokens - len(s.out)) for s in rows])
        got = core.collect()
        firsts = self._rode(seqs)
        stepped = [s for s in rows if s.slot in got]
        want = [s for s in stepped if s.params.logprobs is not None]
        lps = dict(zip([s.slot for s in want], step_logprobs([(self.logits[s.slot], got[s.slot], s.params.logprobs or 0)
                                                             for s in want])))
        # no logits row per request: the logprobs of those that want them are computed above, for the whole step
        return firsts + [self.book.stepped(s, got[s.slot], None, core.width, lps.get(s.slot)) for s in stepped]

    def release(self, s: Seq) -> None:
        """Free the request's slot, which keeps its tokens (the prompt and all of the output but the last token,
        whose K/V no step wrote yet) for a later prompt that starts with them: a chat's next turn."""
        if s.slot >= 0:
            self.core.release(s.slot, s.prompt + s.out[:-1] if s.out else None)
        self.book.release(s)

    def reset_prefix_cache(self) -> None:
        """Forget every slot's kept tokens: the next prompts are prefilled whole."""
        self.core.forget()

    def close(self) -> None:
        """Stop the other ranks of a tensor-parallel engine (nothing otherwise)."""
        if self.followers is not None:
            self.followers.stop()


def fast_engine(config: EngineConfig, tokenizer: Any) -> FastEngine:
    """The fast path's engine `config` asks for, as `build.build` resolved it (CUDA graphs on a GPU, eager on the
    CPU). `config.max_slots` None: as many as the memory budget holds (`pool.py`: `config.utilization` of a GPU, or
    `kv_cache_memory_bytes`, a rank's). `tensor_parallel_size` N > 1: N processes, a GPU each (gloo ranks on the
    CPU), `parallel/ranks.py`, each given this config. `enforce_eager`: no CUDA graphs."""
    from dflash_bench.engine.reference.target import resolve_dtype

    device, size = config.device, config.tensor_parallel_size
    dt = resolve_dtype(config.dtype, device)
    followers, shard = None, None
    if size > 1:  # refused in one sentence before any process starts
        from dflash_bench.engine.fast.parallel.ranks import check_parallel

        check_parallel(config.model, config.draft, size, device=device)
        followers = Followers(config, rank_core).start()
        atexit.register(followers.stop)
    try:
        if followers is not None:
            shard = followers.join()
        hf, drafter = load_pair(config.model, config.draft, dtype=dt, device=device, dummy=config.dummy)
        if shard is not None:
            shard = shard.cut(hf, drafter)  # this rank's part only, before the pool is sized from what is left
        if drafter is not None:
            config.step.synthetic(drafter.config.block_size)  # a mean or rates the block cannot take: one sentence
        from dflash_bench.engine.fast.running.pool import pool_slots

        max_slots = pool_slots(hf.config.get_text_config(), drafter, asked=config.slots, device=device, dtype=dt,
                               max_len=config.max_model_len, utilization=config.utilization,
                               nbytes=config.kv_cache_memory_bytes, tp=size)
        if followers is not None:
            followers.slots(max_slots)
        return FastEngine(hf, tokenizer, drafter, config, eos_ids=eos_ids(hf, tokenizer), max_slots=max_slots,
                          consume=True, shard=shard, followers=followers)
    except BaseException:
        if followers is not None:
            followers.stop()
        raise
