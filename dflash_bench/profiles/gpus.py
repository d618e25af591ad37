"""How many GPUs one server used, as a sweep folder records it (the report); `profiles.server_gpus` says it
for a server about to launch (telemetry, Slurm jobs, the record)."""

from __future__ import annotations

from typing import Any

from dflash_bench.profiles.base import tensor_parallel


def recorded_gpus(servers: dict[str, Any] | None, settings: dict[str, Any] | None) -> int | None:
    """GPUs per server as a sweep folder records them: the servers' `gpus` (the most of any), else the
    settings' tensor-parallel size, else one in a server's own command or in --engine-arg (folders written
    before servers recorded it); None when none of these says."""
    servers, settings = servers or {}, settings or {}
    typed = [info.get("gpus") for info in servers.values() if isinstance(info, dict)]
    if any(isinstance(g, int) and g > 0 for g in typed):
        return max(g for g in typed if isinstance(g, int))
    if isinstance(settings.get("tensor_parallel"), int) and settings["tensor_parallel"] > 0:
        return int(settings["tensor_parallel"])
    commands = [info.get("command") for info in servers.values() if isinstance(info, dict)]
    return tensor_parallel(settings.get("engine_args")) or max(
        (tensor_parallel(c) or 0 for c in commands if isinstance(c, list)), default=0) or None
