"""The sweep's GPU telemetry: one sampler over the GPUs its servers use, started before the first launch."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from dflash_bench.store import GpuInfo, Manifest, SweepSettings
from dflash_bench.sweep.progress import SweepProgress

if TYPE_CHECKING:
    from dflash_bench.models import ModelPair
    from dflash_bench.telemetry import TelemetrySampler


def start_telemetry(manifest: Manifest, progress: SweepProgress, settings: SweepSettings,
                    pair: ModelPair) -> TelemetrySampler | None:
    """One sampler for the whole sweep (each cell is one window) over the server's own GPUs, or None
    when NVML has no GPU to watch."""
    from dflash_bench.telemetry import TelemetrySampler, gpu_inventory, probe, resolve_gpus, scheduler_gpus

    status = probe(None)
    gpus = None
    if status.enabled:  # devices 0..tp-1 of what the server sees (a container launched here sees every GPU)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES") if settings.runner == "process" else scheduler_gpus()
        devices = server_devices(settings, pair)
        gpus = resolve_gpus([*devices], visible) if devices is not None else None
    sampler = TelemetrySampler(gpus)
    manifest.telemetry = sampler.status.as_manifest()
    if sampler.enabled:
        manifest.hardware.gpus = [GpuInfo.model_validate(g) for g in gpu_inventory(sampler.status.gpus)]
    else:
        progress.note(sampler.status.message)
    return sampler if sampler.enabled else None


def server_devices(settings: SweepSettings, pair: ModelPair) -> list[int] | None:
    """The device numbers a launched server uses (profiles.server_gpus; one GPU when nothing says): every one
    is sampled, so telemetry and energy cover all of a tensor-parallel server's GPUs. None for servers the
    user runs: which GPUs is unknown."""
    if settings.url_ar:
        return None
    from dflash_bench import profiles

    return list(range(max(profiles.server_gpus(e, pair, settings) for e in settings.engines) or 1))
