"""Does a plan fit its GPUs? The context limit it needs, the engines' sizing flags, weights + KV against memory.

With `--gpu h100` / `h200` / ... (a GPU whose memory is known), `size()`:
- derives the context limit from the plan: the longest conversation (its turns, the answers between them and
  `--max-tokens`), plus the block, rounded up to 256 tokens (`SweepSettings.context_len`);
- checks, before anything launches, that the target's weights (and the drafter's, where the engine's DFlash
  server will launch) plus the KV cache of `max concurrency` sequences of that length fit the server's GPUs
  (`profiles.server_gpus`: --tensor-parallel-size, else the flag in its command) at the engine's memory
  fraction, and refuses in one sentence what does not, saying what would fit.
`server_args()` gives each engine's sizing flags (vLLM `--max-model-len --gpu-memory-utilization
--max-num-seqs --tensor-parallel-size`, SGLang `--context-length --mem-fraction-static --max-running-requests
--tp-size`, the builtin engine `--max-model-len --max-slots --tensor-parallel-size`) ahead of the user's
`--engine-arg`s, which win.

The geometry comes from the target's config.json (a local folder) or, for a known pair named by its short
name, from `model_shapes.py`, through `geometry.py` (weights, a mixture's experts all counted, and KV per
layer kind). The builtin engine's KV is its own pool's slot
(`engine/fast/pool.slot_bytes`, from the layout its caches are allocated from: Gemma 4's rings, the drafter's
layers, the logits), a rank's share of it on each of its `--tensor-parallel-size` GPUs (the fast path shards; the
logits are gathered whole on every rank); where a plan does not fit, more GPUs are named for the engines that
shard, else one GPU with more memory. A model the formulas do not cover (latent attention) is not checked.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from dflash_bench.errors import UserError
from dflash_bench.geometry import BYTES, Geometry, geometry, text_config
from dflash_bench.store import SweepSettings
from dflash_bench.tokenizer import has_tokenizer

if TYPE_CHECKING:
    from dflash_bench.models import ModelPair
    from dflash_bench.suites import Prompt

GIB = 1 << 30
# Memory of one GPU as the driver reports it (nvidia-smi's total; H100 80GB HBM3: 81559 MiB, H200: 143771 MiB).
GPU_MEMORY_GIB = {"h100": 79.6, "h200": 140.4, "h20": 95.0, "b200": 178.0, "b300": 268.0, "gb200": 184.0,
                  "gb300": 278.0}
ROUND = 256


def gpu_memory_gib(gpu: str | None) -> float | None:
    return GPU_MEMORY_GIB.get((gpu or "").lower())


# ------------------------------------------------------------------ the plan's lengths


class PromptsUnavailable(UserError):
    """The plan's prompts could not be read, so its context limit cannot be derived (a dry run goes on
    without it; a run stops here, as it would at its first cell)."""


def conversation_tokens(prompt: Prompt, max_tokens: int, count: Callable[[str], int]) -> int:
    """Tokens of a prompt's longest context: every turn (with a chat template's few tokens around each), the
    answers before the last turn, and the last answer."""
    turns = prompt.turns or [""]
    return sum(count(t) + 16 for t in turns) + len(turns) * max_tokens


def token_counter(target: str | None) -> Callable[[str], int]:
    """Token counts with the target's tokenizer where it is a local folder, else about 3 characters a token
    (an over-estimate for English text, so a plan is not passed on an optimistic guess)."""
    if has_tokenizer(target):
        from dflash_bench.longctx import token_counter as exact  # a tokenizer that does not load: one sentence

        return exact(str(target))[0]
    return lambda text: math.ceil(len(text) / 3)


def longest_context(settings: SweepSettings, pair: ModelPair, data_dir: Path | None) -> int:
    """The longest context any request of the plan can reach, in the target's tokens."""
    from dflash_bench.sweep.prompts import LONG_MAX_TOKENS, prompts_per_cell
    from dflash_bench.suites import get_suite, load_prompts

    count = token_counter(pair.target)
    n = prompts_per_cell(settings, max(settings.concurrency))
    longest = 0
    for suite in settings.suites:
        new = settings.max_tokens or get_suite(suite).default_max_tokens
        try:
            prompts = load_prompts(suite, data_dir=data_dir, num_prompts=n, seed=settings.seed)
        except UserError as err:
            raise PromptsUnavailable(str(err)) from None
        longest = max([longest] + [conversation_tokens(p, new, count) for p in prompts])
    for n_in in settings.input_lens:
        longest = max(longest, n_in + 64 + (settings.max_tokens or LONG_MAX_TOKENS))
    return longest


def round_up(tokens: int) -> int:
    return -(-tokens // ROUND) * ROUND


# ------------------------------------------------------------------ the check


@dataclass(frozen=True)
class Fit:
    """Memory of a plan on its GPUs, in bytes (all GPUs of one server together)."""

    budget: int  # what the engine may fill with weights and KV
    weights: int  # target + drafter
    kv_per_seq: int  # one sequence at the context limit
    concurrency: int

    @property
    def needed(self) -> int:
        return self.weights + self.concurrency * self.kv_per_seq

    @property
    def fits(self) -> bool:
        return self.needed <= self.budget


def usable_gib(engine: str, gpu_gib: float) -> float:
    """What one GPU gives an engine for weights and KV: its memory fraction less what it reserves inside it."""
    from dflash_bench import profiles

    profile = profiles.get(engine)
    return gpu_gib * (profile.memory_fraction or 0.9) - profile.reserved_gib


def kv_of(target: Geometry, drafter: Geometry | None) -> Callable[[int], int]:
    """KV bytes of one sequence at a context by the configs' formula (a sliding layer keeps at most its window)."""
    return lambda tokens: target.kv_bytes(tokens) + (drafter.kv_bytes(tokens) if drafter else 0)


def builtin_kv(target_cfg: dict[str, Any], drafter_cfg: dict[str, Any] | None, *,
               fast: bool, tp: int = 1) -> Callable[[int], int] | None:
    """The builtin server's bytes a sequence at a context: one slot of its KV pool as the engine lays its caches
    out (`engine/fast/pool.slot_bytes`: the fast path's with --fast, Gemma 4's rings included; else the reference
    engine's), in bf16, on all `tp` ranks together (each holds its share of the KV heads, and the logits whole);
    None where the engine's code cannot read the configs here (no torch, or a transformers that does not know the
    target's type, or KV heads `tp` does not divide): then the configs' formula."""
    try:
        from transformers import AutoConfig

        from dflash_bench.engine.reference.drafter import DrafterConfig
        from dflash_bench.engine.fast.running.pool import slot_bytes

        c = dict(text_config(target_cfg))
        cfg = AutoConfig.for_model(c.pop("model_type"), **c)
        dc = DrafterConfig.from_dict(drafter_cfg) if drafter_cfg else None
    except (ImportError, ValueError, KeyError, TypeError, UserError):
        return None
    block = dc.block_size if dc is not None else 1
    try:
        slot_bytes(cfg, dc, max_len=1, dtype_bytes=BYTES, block=block, fast=fast, tp=tp)
    except UserError:
        return None
    return lambda tokens: tp * slot_bytes(cfg, dc, max_len=tokens, dtype_bytes=BYTES, block=block, fast=fast, tp=tp)


def _builtin_kv_at(target_cfg: dict[str, Any], drafter_cfg: dict[str, Any] | None, fast: bool,
                   tp: int) -> Callable[[int], int] | None:
    return builtin_kv(target_cfg, drafter_cfg, fast=fast, tp=tp)


def fit(target: Geometry, drafter: Geometry | None, *, usable: float, gpus: int, context: int,
        concurrency: int, kv: Callable[[int], int] | None = None) -> Fit:
    """`kv`: one sequence's bytes at a context, where the engine's own layout says (`builtin_kv`); else
    `kv_of(target, drafter)`."""
    budget = int(gpus * usable * GIB)
    weights = target.weight_bytes + (drafter.weight_bytes if drafter else 0)
    return Fit(budget, weights, (kv or kv_of(target, drafter))(context), concurrency)


def refusal(f: Fit, *, gpu: str, gpus: int, context: int, max_tokens: int | None,
            target: Geometry, drafter: Geometry | None, usable: float, kv: Callable[[int], int] | None = None,
            engine: str | None = None, kv_at: Callable[[int], Callable[[int], int] | None] | None = None,
            held: int = 0) -> str:
    """The one sentence for a plan that does not fit, with what would: more GPUs where the engine shards a model
    (else one GPU with more memory), a lower concurrency, shorter contexts. `kv_at(n)`: a sequence's bytes on n
    GPUs, where the engine's own layout says (`builtin_kv`); `held`: bytes of each GPU a speculative server's
    sampler holds back, already out of `usable` (`sampler_fraction`)."""
    kv = kv or kv_of(target, drafter)
    have, need = f.budget / GIB, f.needed / GIB
    where = f"{gpus} {gpu.upper()}{'s' if gpus > 1 else ''}"
    beside = f" beside {held / GIB:.1f} GiB a GPU its verify's logits hold" if held else ""
    head = (f"the plan does not fit {where}: {f.weights / GIB:.1f} GiB of weights plus the KV cache of "
            f"{f.concurrency} sequences of {context} tokens ({f.concurrency * f.kv_per_seq / GIB:.1f} GiB) need "
            f"{need:.1f} GiB, and the engine may fill {have:.1f} GiB{beside}")
    ways = []
    shards = engine is None or _shards(engine)
    for tp in (2, 4, 8) if shards else ():
        if tp > gpus and fit(target, drafter, usable=usable, gpus=tp, context=context,
                             concurrency=f.concurrency, kv=kv_at(tp) if kv_at is not None else kv).fits:
            ways.append(f"--tensor-parallel-size {tp}")
            break
    bigger = "" if shards or engine is None else _bigger_gpu(engine, gpu, f.concurrency, context, target, drafter, kv)
    if f.weights >= f.budget:
        return f"{head}; the weights alone do not fit: use " + (ways[0] if ways else bigger or "more GPUs") + "."
    room = f.budget - f.weights
    c_max = room // f.kv_per_seq if f.kv_per_seq else f.concurrency
    if c_max >= 1:
        ways.append(f"a concurrency of at most {c_max}")
    per_seq = room // f.concurrency
    tokens = max((t for t in range(ROUND, context, ROUND) if kv(t) <= per_seq), default=0)
    if tokens:
        cut = context - tokens
        ways.append(f"contexts of at most {tokens} tokens (--max-tokens {max_tokens - cut})"
                    if max_tokens and max_tokens > cut else f"contexts of at most {tokens} tokens (shorter prompts)")
    if bigger:
        ways.append(bigger)
    return f"{head}: use {' or '.join(ways)}." if ways else f"{head}."


def _shards(engine: str) -> bool:
    """Does the engine shard a model over GPUs (its sizing flags take a tensor-parallel size)?"""
    from dflash_bench import profiles

    try:
        profiles.get(engine).sizing_flags(None, 1, 2)
    except UserError:
        return False
    return True


def _bigger_gpu(engine: str, gpu: str, concurrency: int, context: int, target: Geometry, drafter: Geometry | None,
                kv: Callable[[int], int]) -> str:
    """The GPU with the least memory above `gpu`'s on which the plan fits one of them, as the words of a refusal."""
    have = gpu_memory_gib(gpu) or 0.0
    for name, gib in sorted(GPU_MEMORY_GIB.items(), key=lambda g: g[1]):
        if gib > have and fit(target, drafter, usable=usable_gib(engine, gib), gpus=1, context=context,
                              concurrency=concurrency, kv=kv).fits:
            return f"one {name.upper()} (--gpu {name}, {gib:.0f} GiB)"
    return ""


def size(settings: SweepSettings, pair: ModelPair, data_dir: Path | None) -> SweepSettings:
    """The settings with the derived context limit, after refusing a plan that cannot fit; unchanged where the
    GPU's memory is unknown (--gpu generic) or no launched engine is sized (the user's own servers)."""
    gpu_gib = gpu_memory_gib(settings.gpu)
    engines = [e for e in settings.engines if _sized(e)]
    if gpu_gib is None or not engines or settings.url_ar:
        return settings
    context = round_up(longest_context(settings, pair, data_dir) + pair.block_size)
    from dflash_bench.model_shapes import pair_configs

    target_cfg, drafter_cfg = pair_configs(pair)
    target, drafter = geometry(target_cfg), geometry(drafter_cfg, drafter=True) if pair.drafter else None
    sized = settings.model_copy(update={"context_len": context})
    if target is not None:
        from dflash_bench import profiles
        from dflash_bench.store import SPECULATIVE

        for engine in engines:
            gpus = profiles.server_gpus(engine, pair, settings)  # --tensor-parallel-size, else the command's flag
            if target.heads and target.heads % gpus:
                fits_heads = ", ".join(str(n) for n in range(1, target.heads + 1) if target.heads % n == 0 and n <= 8)
                raise UserError(f"{engine}: a tensor-parallel size of {gpus} does not divide the target's "
                                f"{target.heads} attention heads, so no server can shard it; use {fits_heads}")
            usable = usable_gib(engine, gpu_gib)
            draft = drafter if runs_dflash(engine, pair, settings) else None
            fast = "--fast" in settings.engine_args
            if engine == "builtin" and gpus > 1 and not fast:
                raise UserError(f"builtin: --tensor-parallel-size {gpus} runs on the fast path: add --engine-arg=--fast")
            kv_at = None
            if engine == "builtin" and target_cfg is not None:
                kv_at = functools.partial(_builtin_kv_at, target_cfg, drafter_cfg if draft else None, fast)
            kv = kv_at(gpus) if kv_at is not None else None
            held = max([sampler_fraction(sized, pair, engine, m)[1] for m in settings.modes
                        if m in SPECULATIVE and (m != "dflash" or draft)] or [0])
            usable -= held / GIB  # a speculative server's sampler, beyond the engine's own profile
            f = fit(target, draft, usable=usable, gpus=gpus, context=context, concurrency=max(settings.concurrency),
                    kv=kv)
            if not f.fits:
                raise UserError(f"{engine}: " + refusal(f, gpu=settings.gpu, gpus=gpus, context=context,
                                                        max_tokens=settings.max_tokens, target=target,
                                                        drafter=draft, usable=usable, kv=kv, engine=engine,
                                                        kv_at=kv_at, held=held))
    return sized


def runs_dflash(engine: str, pair: ModelPair, settings: SweepSettings) -> bool:
    """Will this engine's DFlash server launch (a drafter, and no refusal of its known version)?"""
    from dflash_bench import profiles

    profile = profiles.get(engine)
    return bool(pair.drafter) and not profile.refusal(pair, "dflash", profile.version(settings.runner, settings.image))


def _sized(engine: str) -> bool:
    from dflash_bench import profiles

    return profiles.get(engine).memory_fraction is not None


def server_args(settings: SweepSettings, engine: str, pair: ModelPair | None = None,
                mode: str | None = None) -> list[str]:
    """The server's extra arguments: the engine's sizing flags for this plan, then the user's --engine-args. With
    `pair` and `mode`, that server's own: its memory fraction less what its sampler holds beyond the engine's
    memory profile (`sampler_fraction`)."""
    from dflash_bench import profiles

    fraction = sampler_fraction(settings, pair, engine, mode)[0] if pair is not None and mode else None
    flags = profiles.get(engine).sizing_flags(settings.context_len, max(settings.concurrency),
                                              settings.tensor_parallel, fraction)
    return flags + list(settings.engine_args)


def _command(settings: SweepSettings, pair: ModelPair, engine: str, mode: str) -> list[str]:
    """The command line of the mode's server at the engine's own memory fraction, as the sweep plans it."""
    from dflash_bench.launch import plan_server

    return plan_server(engine, pair, mode, preset=settings.gpu, extra_args=server_args(settings, engine),
                       runner=settings.runner)[2]


def sampler_fraction(settings: SweepSettings, pair: ModelPair, engine: str, mode: str) -> tuple[float | None, int]:
    """(the memory fraction the mode's server is launched with, the bytes of each GPU it holds back): the engine's
    fraction less what its sampler holds beyond the engine's own memory profile (profiles' `sampler_reserve`),
    rounded down to a hundredth; (None, 0) where nothing is held back, the GPU's memory is unknown or the plan is
    not sized yet."""
    from dflash_bench import profiles

    profile, gpu_gib = profiles.get(engine), gpu_memory_gib(settings.gpu)
    if gpu_gib is None or settings.context_len is None or profile.memory_fraction is None:
        return None, 0
    reserve = profile.sampler_reserve(pair, mode, _command(settings, pair, engine, mode))
    if not reserve:
        return None, 0
    return math.floor((profile.memory_fraction - reserve / (gpu_gib * GIB)) * 100) / 100, reserve


def sampler_note(settings: SweepSettings, pair: ModelPair, engine: str, mode: str) -> str | None:
    """The memory a speculative server holds back for its sampler (`sampler_fraction`), in words; None: none."""
    from dflash_bench import profiles
    from dflash_bench.store import mode_name

    fraction, reserve = sampler_fraction(settings, pair, engine, mode)
    if fraction is None:
        return None
    return (f"{mode_name(mode)} holds back {reserve / GIB:.1f} GiB of each GPU for its verify's logits at "
            f"{max(settings.concurrency)} rows, which {engine}'s memory profile leaves out: it serves at a memory "
            f"fraction of {fraction:g} (the AR server's {profiles.get(engine).memory_fraction:g})")


def verify_budget(settings: SweepSettings, pair: ModelPair, engine: str, mode: str) -> tuple[str | None, str | None]:
    """(refusal, note) for a speculative server's tokens a step (profiles' `verify_budget` over the command the
    sweep launches): a budget the drafting slots use up is refused (the engine would refuse it after loading the
    model); one too small for a verify of every row of a cell is noted, for those rows wait a step."""
    from dflash_bench import profiles
    from dflash_bench.store import mode_name

    argv = _command(settings, pair, engine, mode)
    got = profiles.get(engine).verify_budget(pair, mode, argv)
    if got is None:
        return None, None
    budget, aside, per_row = got
    left, top = budget - aside, max(settings.concurrency)
    fits_all = f"--engine-arg=--max-num-batched-tokens={aside + top * per_row}"
    if left <= 0:
        return (f"{engine}: its {mode_name(mode)} server would have no tokens to schedule: it sets aside {aside:,} of "
                f"--max-num-batched-tokens {budget:,} for drafting ({top} rows), and would refuse to start after "
                f"loading the model; pass {fits_all} (every row's verify in one step) or a lower concurrency."), None
    short = [c for c in sorted(settings.concurrency) if c * per_row > left]
    if not short:
        return None, None
    return None, (f"{mode_name(mode)} verifies {per_row} tokens a row, and --max-num-batched-tokens {budget:,} less "
                  f"the {aside:,} set aside for drafting leaves {left:,} a step: at c = {', '.join(map(str, short))} "
                  f"rows beyond {left // per_row} wait a step ({fits_all} fits them all)")
