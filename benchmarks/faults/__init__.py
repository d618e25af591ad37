"""Fault cases played against the harness: `python -m benchmarks.faults`."""
