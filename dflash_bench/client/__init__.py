"""Async streaming load generator and the request protocols (chat, completions, SGLang /generate).

Entry points: `measure(url, prompts, RequestSettings, LoadSettings)` -> Measurement (nothing written);
`client.summary.summarize_cell` and `write_cell` turn it into a cell of the caller's SweepDir;
`measure_cell(url, prompts, concurrency=..., cell_dir=...)` does all three.
"""

from dflash_bench.client.cell import Measurement, measure, measure_async
from dflash_bench.client.summary import measure_cell

__all__ = ["Measurement", "measure", "measure_async", "measure_cell"]
