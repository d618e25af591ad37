"""Tensor parallelism's processes: rank 0's followers, the process group, the replay of rank 0's runner calls."""
