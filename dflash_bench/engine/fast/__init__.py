"""The builtin engine's fast path (gpt-fast / nano-vllm style): one GPU, or a few with tensor parallelism.

By role, bottom up (each imports only those above it in this list):
- `kernels/`: every decode-step kernel: Triton's on a GPU (`triton_gemm`, `triton_ops`, `triton_attn`,
  `triton_gemma`), the same calls in C on a CPU (`cpu_kernels`), and which of them a step runs (`selector`).
- `models/`: the families (`family.py`, the one registry keyed by model type), what every target's forward
  shares (`decoder.py`: one QKV and one gate/up matmul per layer over a static slot KV cache, batch row ==
  slot), the families' targets (`dense.py`, `gemma.py`), the drafter's forward (`draft.py`), a slot's caches
  (`cache_layout.py`) and a tensor-parallel rank's part of each weight (`shard.py`).
- `parallel/`: the processes of a tensor-parallel engine (`ranks.py`).
- `scheduling/`: every decision of a step (`scheduler.py`: rows, buckets, verify width, the cache bound,
  step-ahead, the prompts that ride, prefill groups, the graph shapes to capture), emitted as a `StepPlan`;
  the verify width by load (`width.py`).
- `running/`: executes plans and nothing else (`runner.py`): fixed-shape draft / verify / AR steps captured as
  CUDA graphs over device state (`device_state.py`), their bodies (`steps.py`, the commit and synthetic
  acceptance in `accept.py`), prefills (`prefill.py`); the KV pool's size (`pool.py`); what a benchmark
  attaches to time it (`timer.py`).
- here: `core.py` (`EngineCore`, nano-vllm's LLMEngine: the only caller of the scheduler and the runner),
  `probe.py` (what benchmarks and tests read of a core), `make.py` (a core over a loaded pair, on every rank), `engine.py` (`FastEngine`: a core and the requests'
  bookkeeping), `drive.py` (decode a core without a server).

Eager (no graphs) on the CPU, so the tests check losslessness of exactly this code, on the C kernels and on
torch ops; they run the Triton kernels in Triton's interpreter.
"""
