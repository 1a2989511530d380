"""Read NVIDIA GPUs through NVML (nvidia-ml-py, module `pynvml`). No driver, no NVML: the reader is off.

Synchronous: the caller runs it off the event loop with a deadline. The module is passed in so that tests can
hand over a stand-in at the library boundary.
"""

from __future__ import annotations

import ctypes
import logging
from types import ModuleType

from gpuwarden.core.model import GpuSample, normalize_pci

log = logging.getLogger(__name__)
_LIBRARY = "libnvidia-ml.so.1"  # the driver's library, as pynvml's nvmlInit loads it on Linux

# nvmlClocksEventReasons bits (nvml.h), the ones that mean "slowed down"
THROTTLE_BITS = {0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal",
                 0x40: "hw_thermal", 0x80: "hw_power_brake"}


def load() -> ModuleType | None:
    """pynvml, initialised; None when there is no NVIDIA driver (or no nvidia-ml-py)."""
    try:
        ctypes.CDLL(_LIBRARY)  # first: importing pynvml costs 10 ms of CPU that a host without the driver never needs
    except OSError:
        log.info("NVML not available (NVML Shared Library Not Found): the NVIDIA reader is off")  # pynvml's words
        return None
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.info("NVML not available (%s): the NVIDIA reader is off", exc)
        return None
    return pynvml


def handles(nvml: ModuleType) -> dict[str, object]:
    """PCI address -> device handle, for every NVIDIA GPU."""
    out = {}
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        bus_id = nvml.nvmlDeviceGetPciInfo(handle).busId
        out[normalize_pci(bus_id.decode() if isinstance(bus_id, bytes) else bus_id)] = handle
    return out


def read(nvml: ModuleType, handle: object, pci: str, now: float) -> GpuSample:
    problems: dict[str, str] = {}
    lost = False

    def call(name: str, *args):
        nonlocal lost
        try:
            return getattr(nvml, name)(handle, *args)
        except nvml.NVMLError as exc:
            if isinstance(exc, nvml.NVMLError_GpuIsLost):
                lost = True
                problems[name] = "gone"
            elif not isinstance(exc, nvml.NVMLError_NotSupported):
                problems[name] = str(exc)
            return None

    name = call("nvmlDeviceGetName")
    power = call("nvmlDeviceGetPowerUsage")  # mW; a 1 s average on Ampere and newer
    limit = call("nvmlDeviceGetEnforcedPowerLimit")
    limit_max = call("nvmlDeviceGetPowerManagementLimitConstraints")
    temp = call("nvmlDeviceGetTemperature", nvml.NVML_TEMPERATURE_GPU)
    slowdown = call("nvmlDeviceGetTemperatureThreshold", nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    shutdown = call("nvmlDeviceGetTemperatureThreshold", nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
    mem_max = call("nvmlDeviceGetTemperatureThreshold", nvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX)
    hbm = _field(nvml, handle, "NVML_FI_DEV_MEMORY_TEMP")  # °C; HBM cards (H100, H200) report it
    fan = call("nvmlDeviceGetFanSpeed")  # NotSupported on passive cards (H100/H200): not a failure
    sm = call("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_SM)
    mem = call("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_MEM)
    sm_max = call("nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_SM)
    util = call("nvmlDeviceGetUtilizationRates")
    memory = _memory(nvml, handle) or call("nvmlDeviceGetMemoryInfo")
    gen, width = call("nvmlDeviceGetCurrPcieLinkGeneration"), call("nvmlDeviceGetCurrPcieLinkWidth")
    gen_max, width_max = call("nvmlDeviceGetMaxPcieLinkGeneration"), call("nvmlDeviceGetMaxPcieLinkWidth")
    reasons = call("nvmlDeviceGetCurrentClocksEventReasons") or 0
    instant = _instant_power(nvml, handle)
    return GpuSample(
        gpu=pci, vendor="nvidia", model=name.decode() if isinstance(name, bytes) else name, time=now,
        state="gone" if lost else "ok",
        power_watts=power / 1000 if power is not None else None,
        power_source="nvml" if power is not None else None,
        power_instant_watts=instant,
        power_cap_watts=limit / 1000 if limit is not None else None,
        power_cap_max_watts=limit_max[1] / 1000 if limit_max else None,
        temperatures={k: float(v) for k, v in (("gpu", temp), ("mem", hbm)) if v is not None},
        temperature_limits={k: v for k, v in (("gpu", (slowdown, shutdown)), ("mem", (mem_max, None)))
                            if v != (None, None)},
        fan_pwm_ratio=fan / 100 if fan is not None else None,
        fan_state=None if fan is not None or lost else "passive",
        sclk_hz=sm * 1e6 if sm is not None else None,
        mclk_hz=mem * 1e6 if mem is not None else None,
        sclk_max_hz=sm_max * 1e6 if sm_max is not None else None,
        busy_ratio=util.gpu / 100 if util is not None else None,
        vram_total_bytes=float(memory.total) if memory is not None else None,
        vram_used_bytes=float(memory.used) if memory is not None else None,
        vram_reserved_bytes=float(memory.reserved) if getattr(memory, "reserved", None) is not None else None,
        pcie_speed_gts=_GEN_GTS.get(gen), pcie_width=width,
        pcie_max_speed_gts=_GEN_GTS.get(gen_max), pcie_max_width=width_max,
        throttle=tuple(label for bit, label in THROTTLE_BITS.items() if reasons & bit),
        problems=problems)


_GEN_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}


def _instant_power(nvml: ModuleType, handle: object) -> float | None:
    """NVML_FI_DEV_POWER_INSTANT (mW), where the driver has it: the 1 s average hides spikes."""
    milliwatts = _field(nvml, handle, "NVML_FI_DEV_POWER_INSTANT")
    return milliwatts / 1000 if milliwatts is not None else None


def _field(nvml: ModuleType, handle: object, name: str) -> int | None:
    """One NVML field value (unsigned), where the library and the driver have it."""
    field_id = getattr(nvml, name, None)
    if field_id is None:
        return None
    try:
        [value] = nvml.nvmlDeviceGetFieldValues(handle, [field_id])
    except nvml.NVMLError:
        return None
    if getattr(value, "nvmlReturn", 1) != 0:
        return None
    return value.value.uiVal


def _memory(nvml: ModuleType, handle: object):
    """NVML's v2 memory info: its `used` leaves out the driver's reserve (v1's includes it: 616 MiB on an H200
    with no process); None where the driver or the library has no v2."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is None:
        return None
    try:
        return nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
    except (nvml.NVMLError, TypeError):
        return None


def xid_events(nvml: ModuleType, timeout_ms: int = 1000) -> list[tuple[str, int]]:
    """Wait up to `timeout_ms` for critical Xid events: [(pci, xid)]. Blocking: run it in its own thread.

    The event set is made once and kept on the module (NVML event sets are per process)."""
    event_set = getattr(nvml, "_gpuwarden_event_set", None)
    if event_set is None:
        event_set = nvml.nvmlEventSetCreate()
        for handle in handles(nvml).values():
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
            except nvml.NVMLError as exc:
                log.info("NVML Xid events not available for a GPU: %s", exc)
        nvml._gpuwarden_event_set = event_set
    try:
        data = nvml.nvmlEventSetWait_v2(event_set, timeout_ms)
    except nvml.NVMLError_Timeout:
        return []
    bus_id = nvml.nvmlDeviceGetPciInfo(data.device).busId
    return [(normalize_pci(bus_id.decode() if isinstance(bus_id, bytes) else bus_id), int(data.eventData))]


def gpus_of_processes(nvml: ModuleType) -> dict[int, str]:
    """pid -> PCI address of the NVIDIA GPU it runs on (NVML's compute and graphics process lists)."""
    out = {}
    for pci, handle in handles(nvml).items():
        for call in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                out.update({p.pid: pci for p in getattr(nvml, call)(handle)})
            except nvml.NVMLError:
                continue
    return out
