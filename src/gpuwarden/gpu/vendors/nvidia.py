"""NVIDIA: read through NVML (gpu/nvidia.py) where [gpu] nvml allows it and the library is there, which also
reports Xids and which process runs on which GPU; /dev/nvidiaN is a GPU a process holds."""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwarden.config.settings import GpuConfig
from gpuwarden.core.model import normalize_pci
from gpuwarden.gpu import nvidia
from gpuwarden.gpu.vendors.base import DeviceNode, GpuVendor, Opened, Reader

if TYPE_CHECKING:
    from gpuwarden.gpu.discovery import Gpu

_PROCESS_LISTS = threading.Lock()  # at most one engine look waits inside NVML; the others skip it


def _open(config: GpuConfig) -> Opened | None:
    if not config.nvml or not (library := nvidia.load()):
        return None
    return opened(library)


def opened(library) -> Opened:
    """NVML's readers and Xid events, from a loaded library (tests hand a stand-in at the library boundary)."""
    handles = nvidia.handles(library)

    def reader(gpu: Gpu) -> Reader | None:
        handle = handles.get(gpu.pci)
        return partial(nvidia.read, library, handle, gpu.pci) if handle is not None else None

    xids = partial(nvidia.xid_events, library) if handles else None
    return Opened(reader, xids, len(handles), "NVML")


def _process_gpus():
    library = nvidia.load()
    if not library:
        return None

    def lookup() -> Mapping[int, str]:
        if not _PROCESS_LISTS.acquire(blocking=False):
            return {}
        try:
            return nvidia.gpus_of_processes(library)
        finally:
            _PROCESS_LISTS.release()

    return lookup


def _minor(proc_root: Path, match: re.Match[str]) -> set[str]:
    """The GPU of /dev/nvidia<minor>: the driver's /proc/driver/nvidia/gpus/<pci>/information names its minor."""
    minor = int(match.group(1))
    for info in (proc_root / "driver/nvidia/gpus").glob("*/information"):
        try:
            if re.search(rf"^Device Minor:\s*{minor}\s*$", info.read_text(), re.M):
                return {normalize_pci(info.parent.name)}
        except (OSError, ValueError):
            continue
    return set()


VENDOR = GpuVendor("nvidia", frozenset({"0x10de"}), open=_open,
                   throttle_reasons=tuple(nvidia.THROTTLE_BITS.values()),
                   device_nodes=(DeviceNode(re.compile(r"^/dev/nvidia(\d+)$"), _minor),),
                   process_gpus=_process_gpus)
