"""The builtin engine's fast path (gpt-fast / nano-vllm style): one GPU, or a few with tensor parallelism.

- `family.py`: the model families (the one registry keyed by model type) and the Target / Drafter protocols;
  `model.py`: what every target's forward shares (one QKV and one gate/up matmul per layer over a static slot
  KV cache, where batch row == slot); `dense.py` (Qwen3/Qwen2/Llama/Mistral) and `gemma.py` (Gemma 4): the
  families' targets.
- `triton_gemm.py`, `triton_ops.py`, `triton_attn.py`: on a GPU, every decode-step kernel in Triton (the
  skinny matmuls of 1-32 rows; residual add + RMSNorm, q/k norm + RoPE + KV write, silu * up, the
  vocabulary argmax, the step's commit; split-K attention over each row's valid keys).
- `draft.py`: the DFlash drafter's forward with the same layout.
- `core.py`: `EngineCore`, the scheduler and the runner side by side (nano-vllm's LLMEngine): it asks the
  scheduler for each decision and hands it to the runner; `engine.py`: `FastEngine`, a core and the requests'
  bookkeeping; `make.py`: a core over a loaded pair; `ranks.py` + `shard.py`: tensor parallelism.
- `scheduler.py`: every decision of a step (rows, buckets, verify width, the cache bound, step-ahead, the
  prompts that ride, prefill groups, the graph shapes to capture), emitted as a `StepPlan`.
- `runner.py`: executes plans and nothing else: fixed-shape draft / verify / AR steps captured as CUDA graphs per (batch
  bucket, KV-length bucket) over device state (`slots.py`), their bodies in `steps.py` (greedy acceptance and
  the step's commit inside the graphs, an opt-in synthetic-acceptance mode for benchmarking random weights),
  prompts by `prefill.py`; steps can run one ahead of the host. `timer.py`: what benchmarks attach to time it.
- `kernels.py`: which kernels a step runs; `cpu_kernels.py` + `cpu_kernels.c`: on a CPU the same calls in C
  (built with the machine's C compiler at first use), the torch ops where none builds.
- `width.py`: the verify width chosen by load.

Eager (no graphs) on the CPU, so the tests check losslessness of exactly this code, on the C kernels and on
torch ops; they run the Triton kernels in Triton's interpreter.
"""
