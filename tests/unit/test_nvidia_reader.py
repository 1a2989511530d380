"""The NVML reader at the library boundary: a stand-in for the `pynvml` module (no NVIDIA GPU here; the real
one was read on an H200, see the README). Return shapes and error classes follow nvidia-ml-py 13."""

from types import SimpleNamespace

import pytest

from gpuwarden.gpu import nvidia


class NVMLError(Exception):
    pass


class NotSupported(NVMLError):
    pass


class GpuIsLost(NVMLError):
    pass


class Timeout(NVMLError):
    pass


def fake_nvml(fan_supported=True, lost=False):
    def unless_lost(value):
        def call(handle, *args):
            if lost:
                raise GpuIsLost("GPU is lost")
            return value(*args) if callable(value) else value
        return call

    def fan(handle):
        if not fan_supported:
            raise NotSupported("Not Supported")
        return 41

    def memory(handle, version=None):  # nvidia-ml-py 13: v2 leaves the driver's reserve out of `used`
        if lost:
            raise GpuIsLost("GPU is lost")
        if version is None:
            return SimpleNamespace(total=150 * 2**30, used=120 * 2**30)
        return SimpleNamespace(total=150 * 2**30, reserved=616 * 2**20, used=120 * 2**30 - 616 * 2**20)

    fields = {186: 401000, 82: 48}  # NVML_FI_DEV_POWER_INSTANT (mW), NVML_FI_DEV_MEMORY_TEMP (°C)
    # what NVML answered on the device machine's H200 (driver 580.159.04): slowdown 89, shutdown 95, memory max 95 °C
    thresholds = {0: 95, 1: 89, 2: 95}

    return SimpleNamespace(
        NVMLError=NVMLError, NVMLError_NotSupported=NotSupported, NVMLError_GpuIsLost=GpuIsLost,
        NVMLError_Timeout=Timeout, NVML_TEMPERATURE_GPU=0, NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2,
        NVML_FI_DEV_POWER_INSTANT=186, NVML_FI_DEV_MEMORY_TEMP=82, nvmlMemory_v2="v2",
        NVML_TEMPERATURE_THRESHOLD_SHUTDOWN=0, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN=1,
        NVML_TEMPERATURE_THRESHOLD_MEM_MAX=2,
        nvmlDeviceGetTemperatureThreshold=unless_lost(lambda which: thresholds[which]),
        nvmlDeviceGetCount=lambda: 1, nvmlDeviceGetHandleByIndex=lambda i: "h0",
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=b"00000000:3B:00.0"),
        nvmlDeviceGetName=unless_lost("NVIDIA H200"),
        nvmlDeviceGetPowerUsage=unless_lost(123456), nvmlDeviceGetEnforcedPowerLimit=unless_lost(700000),
        nvmlDeviceGetPowerManagementLimitConstraints=unless_lost([200000, 700000]),
        nvmlDeviceGetTemperature=unless_lost(lambda sensor: 36), nvmlDeviceGetFanSpeed=fan,
        nvmlDeviceGetClockInfo=unless_lost(lambda clock: {1: 1980, 2: 3201}[clock]),
        nvmlDeviceGetMaxClockInfo=unless_lost(lambda clock: 1980),
        nvmlDeviceGetUtilizationRates=unless_lost(SimpleNamespace(gpu=87, memory=40)),
        nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetCurrPcieLinkGeneration=unless_lost(5), nvmlDeviceGetCurrPcieLinkWidth=unless_lost(16),
        nvmlDeviceGetMaxPcieLinkGeneration=unless_lost(5), nvmlDeviceGetMaxPcieLinkWidth=unless_lost(16),
        nvmlDeviceGetCurrentClocksEventReasons=unless_lost(0x4 | 0x40),
        nvmlDeviceGetFieldValues=lambda h, ids: [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(uiVal=fields[i]))
                                                 for i in ids],
        nvmlDeviceGetComputeRunningProcesses=lambda h: [SimpleNamespace(pid=4242, usedGpuMemory=2**30)],
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [],
    )


def test_a_passive_h200_reads_fully():
    nvml = fake_nvml(fan_supported=False)
    [(pci, handle)] = nvidia.handles(nvml).items()
    s = nvidia.read(nvml, handle, pci, 1.0)
    assert pci == "0000:3b:00.0" and s.model == "NVIDIA H200" and s.state == "ok" and s.problems == {}
    assert (s.power_watts, s.power_instant_watts, s.power_cap_watts, s.power_cap_max_watts) == (
        pytest.approx(123.456), 401.0, 700.0, 700.0)
    assert s.temperatures == {"gpu": 36.0, "mem": 48.0} and s.fan_state == "passive" and s.fan_pwm_ratio is None
    assert s.temperature_limits == {"gpu": (89, 95), "mem": (95, None)}  # the card's own, not a table's
    assert (s.vram_used_bytes, s.vram_reserved_bytes) == (120 * 2**30 - 616 * 2**20, 616 * 2**20)
    assert (s.sclk_hz, s.mclk_hz, s.busy_ratio) == (1980e6, 3201e6, 0.87)
    assert (s.pcie_speed_gts, s.pcie_width, s.pcie_max_speed_gts) == (32.0, 16, 32.0)
    assert s.throttle == ("sw_power_cap", "hw_thermal")


def test_a_fan_is_read_where_there_is_one():
    s = nvidia.read(fake_nvml(), "h0", "0000:3b:00.0", 1.0)
    assert s.fan_pwm_ratio == 0.41 and s.fan_state is None


def test_a_lost_gpu_is_gone_not_a_crash():
    s = nvidia.read(fake_nvml(lost=True), "h0", "0000:3b:00.0", 1.0)
    assert s.state == "gone" and s.power_watts is None and "nvmlDeviceGetPowerUsage" in s.problems
    assert s.fan_state is None  # not "passive": we do not know


def test_no_library_means_the_reader_is_off(monkeypatch):
    import pynvml

    def missing():
        raise pynvml.NVMLError_LibraryNotFound(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", missing)
    assert nvidia.load() is None


def test_processes_map_to_their_gpu():
    assert nvidia.gpus_of_processes(fake_nvml()) == {4242: "0000:3b:00.0"}


class _Events:
    """A sink that keeps what GpuWatch records."""

    def __init__(self):
        self.events = []

    def record(self, events, cursor=None):
        self.events += events
        return list(range(len(events)))


def _nvml_with_xids(*xids):
    """fake_nvml plus NVML's event API delivering `xids` on the one GPU, then failing (which ends the watch)."""
    nvml, pending = fake_nvml(), list(xids)

    def wait(event_set, timeout_ms):
        if not pending:
            raise NVMLError("Unknown Error")
        return SimpleNamespace(device="h0", eventData=pending.pop(0))

    nvml.nvmlEventTypeXidCriticalError = 8
    nvml.nvmlEventSetCreate, nvml.nvmlDeviceRegisterEvents = lambda: "set", lambda handle, kinds, event_set: None
    nvml.nvmlEventSetWait_v2 = wait
    return nvml


@pytest.mark.parametrize(("xid", "overrides", "severity"), [
    (13, {}, "warning"), (13, {13: "critical"}, "critical"), (79, {}, "critical"), (79, {79: "info", 13: "critical"},
                                                                                    "info"),
])
def test_an_nvml_xid_honours_the_xid_overrides_as_a_kernel_log_xid_does(xid, overrides, severity):
    """NVML mocked at the library boundary (no NVIDIA GPU here); the kernel-log path runs the real classifier."""
    import asyncio

    from gpuwarden.config.settings import GpuConfig
    from gpuwarden.core.model import Severity
    from gpuwarden.gpu.recorder import FlightRecorder
    from gpuwarden.gpu.vendors import nvidia as vendor
    from gpuwarden.gpu.watch import GpuWatch
    from gpuwarden.kernel.classifier import Classifier
    from gpuwarden.kernel.records import KernelRecord

    parsed = {code: Severity.parse(s) for code, s in overrides.items()}
    sink = _Events()
    watch = GpuWatch(GpuConfig(), list, sink, FlightRecorder(), xid_overrides=parsed)
    asyncio.run(watch._watch_xids(vendor.opened(_nvml_with_xids(xid))))
    [nvml_event] = sink.events
    kernel, *_implied = Classifier(xid_overrides=parsed).feed(
        KernelRecord(f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=1, name=python", 1.0), 1.0)
    assert nvml_event.severity == kernel.event.severity == Severity.parse(severity)
    assert (nvml_event.gpu, nvml_event.evidence["xid"]) == (kernel.event.gpu, xid) == ("0000:3b:00.0", xid)
    assert nvml_event.message == f"{kernel.event.message} (NVML)"
