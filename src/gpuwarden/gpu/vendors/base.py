"""What a GPU vendor is to gpuwarden, as one record: which PCI devices are its GPUs, how to read them, what its
readings can name, which device files a process holds when it uses one, and what its compute stack asks of the
PCIe path. Each vendor is one module of this package holding one `GpuVendor`; the registry (`__init__.py`) is
the only list of them, and every caller asks it (never `if vendor == "amd"`).

The kernel log's knowledge of a vendor (its driver rules, the driver and module names a line or a stack frame
carries) stays in the kernel catalog (kernel/rules.py), with the rules it belongs to.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwarden.core.model import GpuSample
from gpuwarden.core.plain import plain

if TYPE_CHECKING:
    from gpuwarden.config.settings import GpuConfig
    from gpuwarden.gpu.discovery import Gpu

Reader = Callable[[float], GpuSample]  # one reading of one GPU at a wall-clock time; blocking, may hang


@plain
class Opened:
    """What a vendor opened to read its GPUs on this host: made once per watch, off the loop (opening a
    driver's library can hang on a hung driver)."""

    reader: Callable[[Gpu], Reader | None]  # a GPU's reader; None: this one cannot be read (no driver bound...)
    # waits up to N ms for the driver's own Xid reports: [(pci, xid)]; blocking, in its own thread
    xid_events: Callable[[int], list[tuple[str, int]]] | None = None
    gpus: int | None = None  # how many GPUs the library sees (logged), when it says
    library: str = ""  # the library it reads through ("NVML"): named in the Xid events it reports


@plain
class DeviceNode:
    """A device file that names one of the vendor's GPUs (`/dev/nvidia0`): `pattern` matches the path a process's
    fd links to, and `gpus(proc_root, match)` says which GPUs (PCI addresses) it is."""

    pattern: re.Pattern[str]
    gpus: Callable[[Path, re.Match[str]], set[str]]


@plain
class GpuVendor:
    """One GPU vendor: only `name` and `pci_ids` are needed; a vendor with no reader is found, guarded and named
    in events, and shown unread ("no reader")."""

    name: str  # the `vendor` label of every metric and event about its GPUs
    pci_ids: frozenset[str]  # the PCI vendor IDs its GPUs carry, as sysfs writes them ("0x1002")
    # opens its readers for this config (blocking, off the loop, with a deadline); None: none here
    open: Callable[[GpuConfig], Opened | None] | None = None
    throttle_reasons: tuple[str, ...] = ()  # every reason its reader can name: exported at 0 while not slowed
    needs_atomics: bool = False  # its compute stack needs PCIe AtomicOps completed at the root port (ROCm does)
    device_nodes: tuple[DeviceNode, ...] = ()  # device files beside the shared DRM nodes (/dev/dri/*)
    # pid -> GPU from the driver's library (NVML's process lists): opens the lookup, blocking; None: no library.
    # Only called where [gpu] nvml allows a vendor's library.
    process_gpus: Callable[[], Callable[[], Mapping[int, str]] | None] | None = None
