"""One event per Xid: the kernel log's copy (with the driver's attribution) and NVML's (none) merge. NVML is
mocked at the library boundary (no NVIDIA GPU here; tests/unit/test_nvidia_reader.py's stand-in)."""

import asyncio

from test_nvidia_reader import _Events, _nvml_with_xids

from gpuwarden.config.settings import GpuConfig
from gpuwarden.core.model import Event, Severity
from gpuwarden.gpu.recorder import FlightRecorder
from gpuwarden.gpu.vendors import nvidia
from gpuwarden.gpu.watch import GpuWatch
from gpuwarden.gpu.xidmerge import XidMerge

GPU = "0000:3b:00.0"


def nvml_copy(xid=31):
    return Event("xid", Severity.CRITICAL, f"Xid {xid} (NVML)", 0.0, gpu=GPU, evidence={"xid": xid, "source": "nvml"})


def test_the_kernel_copy_first_drops_nvmls():
    merge = XidMerge(window=3)
    merge.kernel(GPU, 31, 10.0)
    merge.nvml(GPU, 31, nvml_copy(), 11.0)
    assert merge.due(100.0) == [] and merge.merged == 1


def test_nvmls_copy_waits_for_the_kernels_and_goes_when_it_comes():
    merge = XidMerge(window=3)
    merge.nvml(GPU, 31, nvml_copy(), 10.0)
    assert merge.due(12.0) == []  # still within its window
    merge.kernel(GPU, 31, 12.5)
    assert merge.due(100.0) == [] and merge.merged == 1


def test_nvmls_copy_alone_is_recorded_once_its_window_passed():
    merge = XidMerge(window=3)
    merge.kernel(GPU, 13, 10.0)  # another Xid
    merge.kernel("0000:3c:00.0", 31, 10.0)  # another GPU
    merge.nvml(GPU, 31, event := nvml_copy(), 10.0)
    assert merge.due(12.0) == [] and merge.due(13.5) == [event] and merge.due(20.0) == []
    merge.kernel(GPU, 31, 1.0)
    merge.nvml(GPU, 31, late := nvml_copy(), 10.0)  # the kernel copy is older than the window: another Xid
    assert merge.due(20.0) == [late]


def test_the_kernel_tap_notes_live_kernel_xids_and_passes_everything_on():
    merge, sink = XidMerge(window=3), _Events()
    tap = merge.tap(sink, lambda: 5.0)
    kernel = Event("xid", Severity.CRITICAL, "Xid 31", 0.0, gpu=GPU, evidence={"xid": 31, "process": {"pid": 7}})
    tap.record([kernel, kernel.as_history()])
    assert sink.events == [kernel, kernel.as_history()]
    merge.nvml(GPU, 31, nvml_copy(), 6.0)
    assert merge.due(100.0) == []
    assert tap.events is sink.events  # the rest of the sink is the sink's


def test_the_gpu_watch_records_nvmls_copy_only_when_the_kernel_had_none():
    sink, merge = _Events(), XidMerge(window=3)
    watch = GpuWatch(GpuConfig(), list, sink, FlightRecorder(), xid_merge=merge)
    opened = nvidia.opened(_nvml_with_xids(31, 79))
    merge.kernel(GPU, 31, __import__("time").monotonic())  # the kernel log printed Xid 31 just now
    asyncio.run(watch._watch_xids(opened))
    assert [e.evidence["xid"] for e in sink.events] == [79] and merge.merged == 1
