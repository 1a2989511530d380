"""The GPUs the recovery guard keeps, and what a PCI change asks of the inventory and the guard: the uevent watch
and the guard watch are handed these, of their own layer or below (tests/integration/test_upward_calls.py)."""

from __future__ import annotations

import asyncio

from gpuwarden.config.settings import GuardConfig
from gpuwarden.gpu.inventory import GpuInventory


class Guarded:
    """The GPUs the recovery guard keeps: the configured ones, else every GPU found."""

    def __init__(self, config: GuardConfig, inventory: GpuInventory) -> None:
        self.config, self.inventory = config, inventory

    def devices(self) -> set[str]:
        return set(self.config.devices or (g.pci for g in self.inventory.gpus))

    def listed(self) -> list[str]:
        return list(self.devices())


class PciChanged:
    """A GPU came, went, or was (un)bound: look for GPUs again and re-check the guard at once. `recheck`: the
    guard watch's (act/guard_watch.py) event, set here, so nothing here calls the layer above; None: no guard."""

    def __init__(self, inventory: GpuInventory, recheck: asyncio.Event | None) -> None:
        self.inventory, self.recheck = inventory, recheck

    def changed(self) -> None:
        self.inventory.start_refresh().add_done_callback(self._recheck)

    def _recheck(self, _) -> None:
        if self.recheck:
            self.recheck.set()
