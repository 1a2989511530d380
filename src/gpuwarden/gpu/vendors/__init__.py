"""The GPU vendors gpuwarden knows, registered in one place: discovery's PCI vendor IDs, the telemetry readers,
the throttle reasons exported, a process's device files, the doctor's AtomicOps check are all read from here
when they are used. Adding a vendor is one module holding its `GpuVendor` (base.py says what each field means)
and one line below (README, "Contributing")."""

from __future__ import annotations

from gpuwarden.gpu.vendors import amd, intel, nvidia
from gpuwarden.gpu.vendors.base import GpuVendor

_VENDORS: dict[str, GpuVendor] = {}
_BY_PCI_ID: dict[str, GpuVendor] = {}


def register(vendor: GpuVendor) -> GpuVendor:
    """One vendor more; a name or a PCI ID another vendor holds is refused (a GPU has one vendor)."""
    if vendor.name in _VENDORS:
        raise ValueError(f"GPU vendor {vendor.name!r} is registered already")
    if taken := sorted(i for i in vendor.pci_ids if i in _BY_PCI_ID):
        raise ValueError(f"GPU vendor {vendor.name!r}: PCI ID {', '.join(taken)} belongs to "
                         f"{_BY_PCI_ID[taken[0]].name!r} already")
    _VENDORS[vendor.name] = vendor
    _BY_PCI_ID.update(dict.fromkeys(vendor.pci_ids, vendor))
    return vendor


def unregister(name: str) -> None:
    """For a test's own vendor: the built-in ones stay."""
    vendor = _VENDORS.pop(name)
    for pci_id in vendor.pci_ids:
        del _BY_PCI_ID[pci_id]


def all_vendors() -> tuple[GpuVendor, ...]:
    return tuple(_VENDORS.values())


def named(name: str) -> GpuVendor | None:
    return _VENDORS.get(name)


def of_pci_id(pci_id: str) -> GpuVendor | None:
    """The vendor of a sysfs `vendor` value ("0x1002"); None: not a GPU vendor gpuwarden knows."""
    return _BY_PCI_ID.get(pci_id)


for _module in (amd, nvidia, intel):
    register(_module.VENDOR)
