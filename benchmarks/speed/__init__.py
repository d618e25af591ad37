"""The builtin engine's speed: in process and served, per step, per kernel, on a GPU and on a CPU."""
