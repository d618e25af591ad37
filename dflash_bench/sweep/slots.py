"""The slots of a server whose slots follow the cell's concurrency (llama.cpp): how many, and the context each
needs, from the prompts its cells send.

A slot holds one conversation: every turn's prompt, the chat template around it and each reply up to
max_tokens, plus one draft block. Prompts are counted in UTF-8 bytes, which bound their tokens from above for
the byte-level tokenizers these models use (no token is shorter than a byte); TEMPLATE_TOKENS per turn covers
the template's own tokens. The context is rounded up to a multiple of ROUND.
"""

from __future__ import annotations

from typing import Sequence

from dflash_bench import profiles
from dflash_bench.suites import Prompt
from dflash_bench.sweep.context import SweepContext
from dflash_bench.sweep.plan import Launch

TEMPLATE_TOKENS = 64  # per turn: role markers, a system prompt's share, generation prompt
ROUND = 256


def slot_context(prompts: Sequence[Prompt], max_tokens: int, block_size: int) -> int:
    """Tokens one slot needs for the longest conversation of `prompts` at `max_tokens` a reply."""
    need = max((sum(len(t.encode()) + TEMPLATE_TOKENS + max_tokens for t in p.turns) for p in prompts), default=0)
    need += block_size + 1
    return -(-need // ROUND) * ROUND


def launch_slots(ctx: SweepContext, launch: Launch) -> tuple[int, int] | None:
    """(slots, per-slot context) for the launch's server, where its engine's slots follow the concurrency."""
    if launch.slots is None or not profiles.get(launch.engine).slots_per_cell:
        return None
    per_slot = 0
    for cell in launch.cells:
        prompts, max_tokens = ctx.prompts(cell.suite, cell.concurrency)
        per_slot = max(per_slot, slot_context(prompts, max_tokens, ctx.pair.block_size))
    return launch.slots, per_slot
