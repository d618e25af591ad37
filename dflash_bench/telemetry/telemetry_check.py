"""`dflash-bench telemetry`: check GPU telemetry on this machine before a sweep relies on it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from dflash_bench.console import new_console
from dflash_bench.errors import UserError
from dflash_bench.telemetry.nvml import gpu_inventory, probe, resolve_gpus
from dflash_bench.telemetry.sampler import TelemetrySampler


def run_check(devices: str | None, seconds: float, interval_s: float, out: Path | None) -> int:
    """List the GPUs; with `seconds` > 0 also sample them and print power and energy. 0 when telemetry
    works, 1 when it is off (the reason is printed)."""
    if seconds < 0 or interval_s <= 0:
        raise UserError(f"--seconds must be 0 or more and --interval above 0 (got {seconds:g} and {interval_s:g}).")
    if out is not None and seconds <= 0:
        raise UserError("--out writes samples: give --seconds too, how long to sample.")
    console = new_console(highlight=False)
    status = probe()
    if not status.enabled:
        console.print(escape(status.message))
        return 1
    gpus = resolve_gpus(devices, os.environ.get("CUDA_VISIBLE_DEVICES"))
    console.print(_inventory_table(gpu_inventory(gpus)))
    if seconds <= 0:
        return 0
    sampler = TelemetrySampler(gpus, interval_s=interval_s)
    with sampler.window():
        time.sleep(seconds)
    if out is not None:
        sampler.write_csv(out)
        console.print(f"samples: {escape(str(out))}")
    e = sampler.summarize(output_tokens=0)
    state = "valid" if e.valid else f"NOT valid: {e.reason}"
    console.print(
        f"{len(sampler.samples)} samples in {sampler.window_s:.1f} s; average power {_num(e.avg_power_w)} W, "
        f"peak {_num(e.peak_power_w)} W; energy {_num(e.energy_j)} J from the {e.source} ({escape(state)}); "
        f"counter {_num(e.energy_counter_j)} J vs integrated power {_num(e.energy_integrated_j)} J; "
        f"sampler CPU {100 * sampler.cpu_s / (sampler.window_s or seconds):.2f}% of one core"
    )
    return 0


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _inventory_table(inv: list[dict]) -> Table:
    t = Table("GPU", "name", "driver", "power limit W", "max SM MHz", "energy counter", "instant power")
    for g in inv:
        if "error" in g:
            t.add_row(str(g["index"]), escape(f"NVML error: {g['error']}"), "", "", "", "", "")
            continue
        t.add_row(str(g["index"]), escape(str(g["name"])), escape(str(g["driver_version"])), _num(g["power_limit_w"]),
                  str(g["sm_clock_max_mhz"]), "yes" if g["energy_counter"] else "no", "yes" if g["power_instant"] else "no")
    return t
