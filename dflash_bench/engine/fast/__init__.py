"""The builtin engine's fast path for one GPU (gpt-fast / nano-vllm style).

- `model.py`: a fused Qwen3/Llama forward (one QKV and one gate/up matmul per layer) over a static slot KV
  cache, where batch row == slot, so attention reads a plain view of the first `L` cached positions.
- `draft.py`: the DFlash drafter's forward with the same layout.
- `runner.py`: state on the device, fixed-shape draft / verify / AR steps captured as CUDA graphs per
  (batch bucket, KV-length bucket), greedy acceptance on the device, one host sync per step, and an opt-in
  synthetic-acceptance mode for benchmarking random weights.

Eager (no graphs) on the CPU, so the tests check losslessness of exactly this code.
"""
