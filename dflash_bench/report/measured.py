"""What a sweep measured, in the words the report puts above its numbers: engine, device, model sizes, max
tokens, thinking and repeats; whether its target is a toy model, whose text is not meant to read well; and what
an empty quality cell lacks, with the command that fills it."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from dflash_bench.report.views import SweepView, gpu_names

# Below this many parameters a target is a toy (the embedded demo pair has about 6M): its answers show that
# AR and DFlash agree, not what a real model would say.
TOY_PARAMETERS = 100_000_000


def size(parameters: int | None) -> str:
    """6.2M, 1.3B; "size not recorded" when the sweep could not count them (a model not on the machine)."""
    if not parameters:
        return "size not recorded"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if parameters >= scale:
            return f"{parameters / scale:.1f}{unit} parameters"
    return f"{parameters} parameters"


def name(model: Any) -> str:
    """A hub id as it is; a local folder by its last two parts (the machine's path says nothing to a reader)."""
    ident = str(getattr(model, "id", "") or "") if model is not None else ""
    if not ident:
        return "not recorded"
    path = Path(ident)
    return "/".join(path.parts[-2:]) if path.is_absolute() else ident


def _parameters(model: Any) -> int | None:
    """As the sweep recorded it; for a folder written before it did, counted now if the model is still here."""
    if model is None:
        return None
    value = getattr(model, "parameters", None)
    if isinstance(value, int):
        return value
    from dflash_bench.store.provenance import parameter_count

    folder = Path(str(model.id))
    return parameter_count(folder) if folder.is_dir() else None


def device(view: SweepView) -> str:
    gpus = gpu_names(view.manifest.hardware)
    if gpus:
        return gpus
    host = view.manifest.hardware.host
    if host is None or not host.cpu_count:
        return "CPU (no GPU recorded)"
    return f"CPU ({host.cpu_count} cores{', ' + host.machine if host.machine else ''}; no GPU)"


def thinking(view: SweepView) -> str:
    """As the cells' rendered prompts showed it (thinking.record), not as a flag asked."""
    settings = view.manifest.settings
    if settings is not None and settings.thinking_both:
        return "thinking off and on (--thinking both)"
    seen = {str(t) for t in view.frame.get("thinking", []) if isinstance(t, str) and t} if not view.frame.empty else set()
    if seen == {"on"} or seen == {"off"}:
        return f"thinking {seen.pop()}"
    if settings is not None and settings.thinking is not None:
        return f"thinking {'on' if settings.thinking else 'off'} (asked)"
    return "thinking not recorded" if not seen else f"thinking {', '.join(sorted(seen))}"


def describe(view: SweepView) -> dict[str, Any]:
    """{"line": what was measured, in one line; "toy": the target's size when it is a toy model, else None}."""
    m = view.manifest
    settings = m.settings
    engines = sorted(set(view.frame["engine"])) if not view.frame.empty else (settings.engines if settings else [])
    target, drafter = _parameters(m.models.target), _parameters(m.models.drafter)
    parts = [f"{'engines' if len(engines) > 1 else 'engine'} {', '.join(map(str, engines)) or 'none'}",
             device(view), f"target {name(m.models.target)} ({size(target)})",
             f"drafter {name(m.models.drafter)} ({size(drafter)})"]
    if settings is not None:
        parts.append(f"max tokens {settings.max_tokens}" if settings.max_tokens else "max tokens: each suite's default")
    parts.append(thinking(view))
    if settings is not None and settings.repeats > 1:
        parts.append(f"{settings.repeats} repeats per cell")
    if settings is not None and settings.interleave:
        parts.append("concurrency 1: AR and DFlash requests interleaved one by one")
    ready = [f"{key} {server.ready_s:.0f} s" for key, server in m.servers.items() if server.ready_s is not None]
    if ready:  # what a start costs: loading, compiling, graphs (DFlash's server loads and compiles a drafter too)
        parts.append(f"servers ready after {', '.join(ready)}")
    toy = size(target) if target is not None and target < TOY_PARAMETERS else None
    return {"line": " · ".join(parts), "toy": toy}


def quality_hint(view: SweepView) -> str:
    """The command that fills the quality table's empty cells of this sweep (its folder as seen from here)."""
    where = str(view.path)
    try:
        rel = os.path.relpath(view.path)
        where = rel if not rel.startswith("..") else where
    except ValueError:  # another drive
        pass
    return f"dflash-bench quality {shlex.quote(where)}"
