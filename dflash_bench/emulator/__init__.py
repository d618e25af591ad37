"""A timing emulator of an AR or DFlash LLM server with known ground truth (`dflash-bench emulate`).

Files, one job each: `model.py` (what a request produces and when, and the vLLM-style counters),
`server.py` (the asyncio HTTP server and its vLLM/SGLang routes), `process.py` (`EmulatorProcess`: one in
a child process, for tests and benchmarks).
"""

from dflash_bench.emulator.model import EmulatorModel, EmulatorConfig, Plan
from dflash_bench.emulator.process import EmulatorProcess

__all__ = ["EmulatorModel", "EmulatorConfig", "EmulatorProcess", "Plan"]
