"""llama.cpp's slots follow the cell's concurrency: the plan launches it once per concurrency, its cells of one
concurrency together, and each slot gets the context its cells' conversations need (sweep/slots.py)."""

from __future__ import annotations

from types import SimpleNamespace

from dflash_bench.models import resolve
from dflash_bench.profiles import get
from dflash_bench.store import SweepSettings
from dflash_bench.sweep.plan import launches, plan_cells
from dflash_bench.sweep.run import server_groups
from dflash_bench.sweep.slots import ROUND, TEMPLATE_TOKENS, slot_context


def _settings(**kw) -> SweepSettings:
    return SweepSettings(model="Qwen3-8B", engines=["llamacpp", "builtin"], suites=["gsm8k", "mt-bench"],
                         concurrency=[1, 4], **kw)


def test_llamacpp_launches_once_per_concurrency_and_the_builtin_engine_once_per_mode():
    ls = launches(plan_cells(_settings()))
    llama = [(x.mode, x.slots, {c.concurrency for c in x.cells}) for x in ls if x.engine == "llamacpp"]
    assert llama == [("ar", 1, {1}), ("ar", 4, {4}), ("dflash", 1, {1}), ("dflash", 4, {4})]
    assert all(len(x.cells) == 2 for x in ls if x.engine == "llamacpp")  # both suites on each server
    assert [(x.mode, x.slots, len(x.cells)) for x in ls if x.engine == "builtin"] == [("ar", None, 4), ("dflash", None, 4)]


def test_paired_llamacpp_runs_its_two_servers_per_concurrency():
    groups = server_groups(launches(plan_cells(_settings(paired=True)), paired=True), paired=True)
    llama = [[(x.mode, x.slots) for x in g] for g in groups if g[0].engine == "llamacpp"]
    assert llama == [[("ar", 1), ("dflash", 1)], [("ar", 4), ("dflash", 4)]]


def test_a_slot_holds_the_longest_conversation_and_a_draft_block():
    prompts = [SimpleNamespace(turns=["x" * 100]), SimpleNamespace(turns=["é" * 50, "y" * 10])]  # 100 and 110 bytes
    need = (100 + 10) + 2 * (TEMPLATE_TOKENS + 64) + 16 + 1
    assert slot_context(prompts, 64, 16) == -(-need // ROUND) * ROUND


def test_the_command_carries_the_slots_and_a_context_per_slot():
    pair = resolve("Qwen3-8B")
    argv = get("llamacpp").command(pair, "dflash", 8080, "generic", slots=(4, 512))
    assert argv[argv.index("--parallel") + 1] == "4" and argv[argv.index("-c") + 1] == "2048"
    assert "--no-kv-unified" in argv and "--kv-unified" not in argv
