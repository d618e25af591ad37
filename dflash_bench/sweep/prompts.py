"""A sweep's prompts: every suite loaded once up front (bad data fails before any server starts), then
handed out per (suite, concurrency) with the cell's max_tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from dflash_bench.errors import UserError
from dflash_bench.store import SweepSettings
from dflash_bench.tokenizer import has_tokenizer
from dflash_bench.sweep.context import PromptLoader

if TYPE_CHECKING:
    from dflash_bench.suites import Prompt

LONG_MAX_TOKENS = 256  # new tokens per request on the long-<N> suites unless --max-tokens says otherwise


def prompt_loader(settings: SweepSettings, data_dir: Path | None) -> PromptLoader:
    """(suite, concurrency) -> (prompts, max_tokens). Suites load once up front so bad data fails fast.

    The --input-len suites (long-<N>) are built from real text by longctx.build_prompts, counted with the
    target's tokenizer when it is a local folder (else about 4 characters a token, as each prompt records)."""
    from dflash_bench.longctx import build_prompts
    from dflash_bench.suites import get_suite, load_prompts
    from dflash_bench.sweep.plan import long_suite

    for suite in settings.suites:
        get_suite(suite)
    long = {long_suite(n): n for n in settings.input_lens}
    tokenizer = _local_target(settings.model)
    check_context(settings, tokenizer)
    cache: dict[tuple[str, int], tuple[list[Prompt], int]] = {}

    def load(suite: str, concurrency: int) -> tuple[list[Prompt], int]:
        if (suite, concurrency) not in cache:
            n = prompts_per_cell(settings, concurrency)
            if suite in long:
                prompts = build_prompts(long[suite], data_dir=data_dir, num_prompts=n, tokenizer=tokenizer,
                                        seed=settings.seed)
                cache[(suite, concurrency)] = (prompts, settings.max_tokens or LONG_MAX_TOKENS)
            else:
                prompts = load_prompts(suite, data_dir=data_dir, num_prompts=n, seed=settings.seed)
                cache[(suite, concurrency)] = (prompts, settings.max_tokens or get_suite(suite).default_max_tokens)
        return cache[(suite, concurrency)]

    for suite in [*settings.suites, *long]:  # fail before any server starts when a dataset is missing or malformed
        load(suite, settings.concurrency[0])
    return load


def prompts_per_cell(settings: SweepSettings, concurrency: int) -> int:
    """How many prompts a cell at `concurrency` sends: --waves W x the concurrency (at least --num-prompts), else
    --num-prompts, else max(16, 4 x concurrency); never fewer than the concurrency."""
    if settings.waves:
        return max(settings.waves * concurrency, settings.num_prompts or 0)
    return max(settings.num_prompts or max(16, 4 * concurrency), concurrency)


def _local_target(model: str) -> Path | None:
    """The target's folder when it is one on this machine (its tokenizer counts the long prompts)."""
    path = Path(model)
    return path if (path / "config.json").is_file() and has_tokenizer(path) else None


def check_context(settings: SweepSettings, target: Path | None) -> None:
    """Refuse an --input-len the target cannot hold, where its config says how many positions it has."""
    if not settings.input_lens or target is None:
        return
    try:
        config = json.loads((target / "config.json").read_text())
    except (OSError, ValueError):
        return
    limit = config.get("max_position_embeddings") or (config.get("text_config") or {}).get("max_position_embeddings")
    if not isinstance(limit, int):
        return
    new = settings.max_tokens or LONG_MAX_TOKENS
    too_long = [n for n in settings.input_lens if n + new > limit]
    if too_long:
        raise UserError(f"--input-len {too_long[0]} plus {new} new tokens passes the target's {limit} positions "
                        f"({settings.model}): use lengths up to {limit - new}, or a target with a longer context")
