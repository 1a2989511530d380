"""AMD: amdgpu GPUs, read from sysfs and hwmon (gpu/amd.py); ROCm needs PCIe AtomicOps; a process's GPUs are its
DRM nodes (shared by every vendor), /dev/kfd alone names none."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuwarden.config.settings import GpuConfig
from gpuwarden.gpu import amd
from gpuwarden.gpu.vendors.base import GpuVendor, Opened, Reader

if TYPE_CHECKING:
    from gpuwarden.gpu.discovery import Gpu


def _open(config: GpuConfig) -> Opened:
    def reader(gpu: Gpu) -> Reader | None:
        if gpu.driver != "amdgpu":  # radeon (or no driver) has none of amdgpu's files
            return None
        return amd.AmdReader(config.sysfs_root / "bus/pci/devices" / gpu.pci, gpu.pci).read

    return Opened(reader)


VENDOR = GpuVendor("amd", frozenset({"0x1002"}), open=_open, needs_atomics=True)
