"""Metric definitions (written once), Prometheus snapshots, acceptance length, statistics helpers."""

from dflash_bench.metrics.acceptance import cell_acceptance
from dflash_bench.metrics.definitions import e2e_ms, failure_reasons, summarize, tpot_ms, ttft_ms
from dflash_bench.metrics.stats import describe, percentile

__all__ = ["cell_acceptance", "describe", "e2e_ms", "failure_reasons", "percentile", "summarize", "tpot_ms", "ttft_ms"]
