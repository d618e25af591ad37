"""The fast path's kernels: Triton's on a GPU, C on a CPU, and which of them a step runs."""
