"""GPU telemetry through NVML: power, energy, utilisation, clocks, memory, temperature, throttling.

The public surface (everything a cell runner, the store or the manifest needs):

    status = probe(gpus)                     # once per sweep: print status.message, keep status.as_manifest()
    gpus = resolve_gpus(devices, cuda_visible_devices)   # the server's GPUs as physical NVML indices
    inventory = gpu_inventory(gpus)          # names, driver, power limits, clocks: for the manifest
    sampler = TelemetrySampler(gpus, interval_s=0.1)
    with sampler.window():                   # the cell's measured window
        ...
    sampler.write_csv(cell_dir / "telemetry.csv")
    energy = summarize(sampler.samples, output_tokens, interval_s=0.1, window_s=sampler.window_s)
    summary_kwargs = energy.summary_fields() # energy_j, energy_source, energy_valid, ... of CellSummary

Without NVML or a GPU nothing raises: the status says why, the sampler records nothing, and
`summarize([])` returns an EnergySummary with energy_j None and valid False.
"""

from dflash_bench.telemetry.energy import EnergySummary, GpuEnergy, default_max_gap, find_gaps, summarize, trapezoid
from dflash_bench.store.telemetry_csv import SAMPLE_COLUMNS, Sample, samples_to_csv
from dflash_bench.telemetry.nvml import (
    TelemetryStatus,
    gpu_inventory,
    probe,
    resolve_gpus,
    scheduler_gpus,
    throttle_names,
)
from dflash_bench.telemetry.sampler import TelemetrySampler, write_csv

__all__ = [
    "EnergySummary",
    "GpuEnergy",
    "SAMPLE_COLUMNS",
    "Sample",
    "TelemetrySampler",
    "TelemetryStatus",
    "default_max_gap",
    "find_gaps",
    "gpu_inventory",
    "probe",
    "resolve_gpus",
    "scheduler_gpus",
    "samples_to_csv",
    "summarize",
    "throttle_names",
    "trapezoid",
    "write_csv",
]
