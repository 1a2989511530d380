"""The GPU inventory: which GPUs are here now, which were seen since start, and which sit behind a PCIe port.

Discovery reads sysfs, so it runs off the loop; what it finds (each GPU's path through the PCIe tree included)
is kept, and every question on the loop is a look-up in it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from gpuwarden.gpu import pci
from gpuwarden.gpu.discovery import Gpu, discover
from gpuwarden.runtime.offloop import OffLoop

log = logging.getLogger(__name__)

REDISCOVER_SECONDS = 5.0  # a GPU can vanish without a uevent reaching us
_SCANS = OffLoop("gpu discovery", limit=1)
_SCAN_DEADLINE = 30.0


def _scan(sysfs_root: Path, known: dict[str, tuple[str, ...]]) -> tuple[list[Gpu], dict[str, tuple[str, ...]]]:
    """The GPUs, and each one's path through the PCIe tree: resolved for a GPU the last scan did not find, kept
    for one it did (a device does not move while it stays; one that goes and comes back is resolved again)."""
    gpus = discover(sysfs_root)
    return gpus, {g.pci: known.get(g.pci) or pci.device_dir(sysfs_root, g.pci).parts for g in gpus}


class GpuInventory:
    def __init__(self, sysfs_root: Path) -> None:
        self.sysfs_root = sysfs_root
        self.gpus: list[Gpu] = []
        self.seen: set[str] = set()  # every GPU discovered since start: a fault may kill only for these
        self._paths: dict[str, tuple[str, ...]] = {}  # GPU -> the parts of its resolved sysfs path
        self._at = -1e9  # monotonic time of the last discovery
        self._refreshing: asyncio.Future | None = None

    def start_refresh(self) -> asyncio.Future:
        """Discover again, off the loop; one discovery at a time: while one runs, this is that one."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(_SCANS.run("gpus", _SCAN_DEADLINE, _scan, self.sysfs_root,
                                                                  dict(self._paths)))
            self._refreshing.add_done_callback(self._found)
        return self._refreshing

    async def refresh(self) -> list[Gpu]:
        await asyncio.shield(self.start_refresh())
        return self.gpus

    def _found(self, task: asyncio.Future) -> None:
        self._at = time.monotonic()
        if task.cancelled():
            return
        if error := task.exception():
            log.warning("looking for GPUs failed (the last list stays): %s", error)
            return
        self.gpus, self._paths = task.result()
        self.seen.update(self._paths)

    def current(self) -> list[Gpu]:
        """The GPUs as last found; a discovery starts in the background when that is more than a few seconds
        old (the caller gets the fresh list on its next round)."""
        if time.monotonic() - self._at > REDISCOVER_SECONDS:
            self.start_refresh()
        return self.gpus

    def behind(self, port: str) -> list[str]:
        """The GPUs that are `port` or hang below it in the PCIe tree."""
        return [gpu for gpu, parts in self._paths.items() if port in parts]
