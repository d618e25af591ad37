"""NVML access: is it there, which GPUs, what they are, and one sample of one GPU.

Everything NVML-specific lives here; the sampler and the energy arithmetic see only `Sample` rows.
Without the NVML library or without a GPU every function degrades to "telemetry off" with a reason;
none of them raises for that.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from dflash_bench.errors import UserError
from dflash_bench.store.telemetry_csv import Sample


@dataclass
class TelemetryStatus:
    """Whether telemetry runs, on which GPUs, and if not, why (shown once and kept in the manifest)."""

    enabled: bool
    reason: str = ""  # empty when enabled
    gpus: list[int] = field(default_factory=list)
    driver: str | None = None

    @property
    def message(self) -> str:
        if self.enabled:
            ids = ",".join(str(g) for g in self.gpus)
            return f"GPU telemetry on: NVML, GPU {ids}, driver {self.driver}"
        return f"GPU telemetry off: {self.reason}"

    def as_manifest(self) -> str:
        """The one-line value of the manifest's and the cell summary's `telemetry` field."""
        return "on" if self.enabled else f"off: {self.reason}"


def _nvml() -> Any:
    import pynvml  # nvidia-ml-py; the import itself works without a driver

    return pynvml


def init() -> str | None:
    """Initialise NVML (reference-counted by NVML itself). Returns None, or why it cannot run."""
    try:
        nv = _nvml()
    except ImportError:
        return "the nvidia-ml-py package is not installed"
    try:
        nv.nvmlInit()
    except nv.NVMLError_LibraryNotFound:
        return "no NVIDIA driver (NVML library not found)"
    except nv.NVMLError as err:
        return f"NVML failed to start ({err})"
    try:
        if nv.nvmlDeviceGetCount() == 0:
            nv.nvmlShutdown()
            return "NVML found no GPU"
    except nv.NVMLError as err:
        nv.nvmlShutdown()
        return f"NVML could not count GPUs ({err})"
    return None


def shutdown() -> None:
    try:
        _nvml().nvmlShutdown()
    except Exception:  # noqa: BLE001 - shutting down must never fail a run
        pass


def probe(gpus: list[int] | None = None) -> TelemetryStatus:
    """Check once whether telemetry can run on `gpus` (None: every GPU)."""
    why = init()
    if why:
        return TelemetryStatus(False, why)
    nv = _nvml()
    try:
        count = nv.nvmlDeviceGetCount()
        chosen = list(range(count)) if gpus is None else list(gpus)
        missing = [g for g in chosen if not 0 <= g < count]
        if missing:
            return TelemetryStatus(False, f"GPU {missing[0]} does not exist (NVML sees {count})")
        if not chosen:
            return TelemetryStatus(False, "no GPU assigned to the server")
        return TelemetryStatus(True, "", chosen, _text(nv.nvmlSystemGetDriverVersion()))
    finally:
        shutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ------------------------------------------------------------------ which GPUs


def scheduler_gpus(environ: dict[str, str] | None = None) -> str | None:
    """The GPUs a batch scheduler gave this job, as a CUDA_VISIBLE_DEVICES-style list, or None outside one.

    Slurm names them in SLURM_STEP_GPUS (inside srun) or SLURM_JOB_GPUS (the batch script): node-wide
    indices, which are NVML's numbering where no device cgroup renumbers them. A container launched from
    the job bypasses the job's cgroup, so it must be given this list rather than every GPU of the node.
    """
    env = os.environ if environ is None else environ
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        value = (env.get(name) or "").strip()
        if value and value.lower() not in ("none", "n/a"):
            return value
    return None


def resolve_gpus(
    devices: list[int | str] | str | None = None,
    cuda_visible_devices: str | None = None,
    *,
    uuids: list[str] | None = None,
) -> list[int]:
    """Physical NVML indices of the GPUs a server uses.

    `cuda_visible_devices` is the CUDA_VISIBLE_DEVICES the server runs under (for a container, its device
    list), None meaning every GPU; entries are indices or GPU UUIDs (prefixes allowed, as CUDA does).
    `devices` are the server's own device numbers (e.g. 0,1 for TP=2), indices into that visible list;
    None means all of them. `uuids` lists the physical GPUs' UUIDs in NVML order (read from NVML when
    None; without NVML there are no GPUs). Assumes CUDA numbers GPUs in PCI order as NVML does (true
    on machines of one GPU model, or with CUDA_DEVICE_ORDER=PCI_BUS_ID).
    """
    if uuids is None:
        uuids = _physical_uuids()
    if cuda_visible_devices is None:
        physical = list(range(len(uuids)))
    else:
        entries = _split(cuda_visible_devices)
        if "-1" in entries:  # CUDA stops at -1: "-1" alone hides every GPU
            entries = entries[: entries.index("-1")]
        physical = [_physical_index(e, uuids) for e in entries]
    if devices is None:
        return physical
    out = []
    for d in _split(devices) if isinstance(devices, str) else devices:
        try:
            i = int(d)
        except ValueError:
            raise UserError(f"device '{d}' is not a GPU number; use numbers such as 0,1.") from None
        if not 0 <= i < len(physical):
            raise UserError(f"device {i} is not visible: the server sees {len(physical)} GPU(s).")
        out.append(physical[i])
    return out


def _split(value: str | list) -> list[str]:
    if isinstance(value, list):
        return [str(v).strip() for v in value]
    return [e.strip() for e in value.split(",") if e.strip()]


def _physical_index(entry: str, uuids: list[str]) -> int:
    if entry.isdigit():
        i = int(entry)
        if i >= len(uuids):
            raise UserError(f"CUDA_VISIBLE_DEVICES names GPU {i}, but this machine has {len(uuids)}.")
        return i
    if entry.startswith("MIG-"):
        raise UserError("GPU telemetry does not support MIG devices; name whole GPUs in CUDA_VISIBLE_DEVICES.")
    want = entry if entry.startswith("GPU-") else f"GPU-{entry}"
    hits = [i for i, u in enumerate(uuids) if u.startswith(want)]
    if len(hits) != 1:
        raise UserError(f"CUDA_VISIBLE_DEVICES entry '{entry}' matches {len(hits)} GPUs; give an index or a full UUID.")
    return hits[0]


def _physical_uuids() -> list[str]:
    if init():
        return []
    nv = _nvml()
    try:
        return [_text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i))) for i in range(nv.nvmlDeviceGetCount())]
    finally:
        shutdown()


# ------------------------------------------------------------------ what they are


def gpu_inventory(gpus: list[int] | None = None) -> list[dict[str, Any]]:
    """Name, UUID, driver, power limits and clocks of each GPU, for the manifest. [] without NVML."""
    if init():
        return []
    nv = _nvml()
    try:
        ids = range(nv.nvmlDeviceGetCount()) if gpus is None else gpus
        return [_describe(nv, i) for i in ids]
    finally:
        shutdown()


def _describe(nv: Any, index: int) -> dict[str, Any]:
    try:
        h = nv.nvmlDeviceGetHandleByIndex(index)
    except nv.NVMLError as err:
        return {"index": index, "error": str(err)}
    get = lambda fn, *a: _maybe(nv, fn, h, *a)  # noqa: E731
    mem = get(nv.nvmlDeviceGetMemoryInfo)
    pci = get(nv.nvmlDeviceGetPciInfo)
    limits = get(nv.nvmlDeviceGetPowerManagementLimitConstraints)
    return {
        "index": index,
        "name": _text(get(nv.nvmlDeviceGetName)),
        "uuid": _text(get(nv.nvmlDeviceGetUUID)),
        "pci_bus_id": _text(pci.busId) if pci else None,
        "driver_version": _text(_maybe(nv, nv.nvmlSystemGetDriverVersion)),
        "cuda_driver_version": _maybe(nv, nv.nvmlSystemGetCudaDriverVersion),
        "memory_total_mib": mem.total / 2**20 if mem else None,
        "power_limit_w": _w(get(nv.nvmlDeviceGetEnforcedPowerLimit)),
        "power_default_limit_w": _w(get(nv.nvmlDeviceGetPowerManagementDefaultLimit)),
        "power_max_limit_w": _w(limits[1]) if limits else None,
        "sm_clock_max_mhz": get(nv.nvmlDeviceGetMaxClockInfo, nv.NVML_CLOCK_SM),
        "mem_clock_max_mhz": get(nv.nvmlDeviceGetMaxClockInfo, nv.NVML_CLOCK_MEM),
        "sm_clock_app_mhz": get(nv.nvmlDeviceGetApplicationsClock, nv.NVML_CLOCK_SM),
        "persistence_mode": get(nv.nvmlDeviceGetPersistenceMode),
        "energy_counter": get(nv.nvmlDeviceGetTotalEnergyConsumption) is not None,
        "power_instant": _instant_power_w(nv, h) is not None,
    }


def _w(mw: int | None) -> float | None:
    return mw / 1000.0 if mw is not None else None


def _maybe(nv: Any, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except nv.NVMLError:
        return None


def _instant_power_w(nv: Any, handle: Any) -> float | None:
    try:
        v = nv.nvmlDeviceGetFieldValues(handle, [nv.NVML_FI_DEV_POWER_INSTANT])[0]
    except nv.NVMLError:
        return None
    if v.nvmlReturn != nv.NVML_SUCCESS or not 0 <= v.valueType < 7:
        return None
    kind = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")[v.valueType]
    return getattr(v.value, kind) / 1000.0  # mW


# ------------------------------------------------------------------ one sample


class Reader:
    """Reads samples of a fixed set of GPUs. Fields a GPU does not support are probed once and skipped."""

    def __init__(self, gpus: list[int]):
        nv = self._nv = _nvml()
        self.gpus = gpus
        self._handles = [nv.nvmlDeviceGetHandleByIndex(g) for g in gpus]
        self._reads: list[tuple[str, Callable[[Any], Any]]] = [
            ("power_w", lambda h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
            ("power_instant_w", lambda h: _instant_power_w(nv, h)),
            ("energy_mj", nv.nvmlDeviceGetTotalEnergyConsumption),
            ("_util", nv.nvmlDeviceGetUtilizationRates),
            ("sm_clock_mhz", lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            ("mem_clock_mhz", lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
            ("mem_used_mib", lambda h: nv.nvmlDeviceGetMemoryInfo(h).used / 2**20),
            ("temp_c", lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            ("throttle_reasons", self._throttle),
        ]
        # Probe each field once per GPU; keep only those that answer.
        self._supported = [[(n, fn) for n, fn in self._reads if _maybe(nv, fn, h) is not None] for h in self._handles]

    def field_cost_ms(self, repeats: int = 20) -> dict[str, float]:
        """CPU milliseconds of one read of each supported field of the first GPU (for the benchmark)."""
        costs = {}
        for name, fn in self._supported[0] if self._supported else []:
            t = time.thread_time()
            for _ in range(repeats):
                _maybe(self._nv, fn, self._handles[0])
            costs[name.lstrip("_")] = 1000 * (time.thread_time() - t) / repeats
        return costs

    def _throttle(self, h: Any) -> int:
        nv = self._nv
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        return fn(h)

    def read(self, t0: float) -> list[Sample]:
        """One sample of every GPU; `t0` is the window's start on time.perf_counter's clock."""
        out = []
        for gpu, h, reads in zip(self.gpus, self._handles, self._supported):
            s = Sample(t_s=time.perf_counter() - t0, gpu=gpu, time_unix=time.time())
            for name, fn in reads:
                value = _maybe(self._nv, fn, h)
                if name == "_util":
                    if value is not None:
                        s.gpu_util_pct, s.mem_util_pct = value.gpu, value.memory
                else:
                    setattr(s, name, value)
            out.append(s)
        return out


THROTTLE_NAMES = {
    0x1: "gpu_idle",
    0x2: "app_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
# Reasons that mean the GPU ran slower than it could under load (idle, app and display clocks do not).
SLOWDOWN_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


def throttle_names(mask: int) -> list[str]:
    """Names of the bits set in a clocks-event-reason mask, lowest bit first."""
    return [name for bit, name in THROTTLE_NAMES.items() if mask & bit]
