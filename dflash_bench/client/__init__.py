"""Async streaming load generator and the request protocols (chat, completions, SGLang /generate).

Entry point: `measure_cell(url, prompts, concurrency=..., cell_dir=...)` -> CellSummary.
"""

from dflash_bench.client.cell import measure_cell, measure_cell_async

__all__ = ["measure_cell", "measure_cell_async"]
