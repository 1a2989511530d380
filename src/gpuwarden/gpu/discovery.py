"""Find GPUs by PCI address in sysfs: display-class devices (PCI class 0x03xxxx) of known vendors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

VENDORS = {"0x1002": "amd", "0x10de": "nvidia", "0x8086": "intel"}


@dataclass(frozen=True, slots=True)
class Gpu:
    pci: str  # normalised address, the only stable key (card and hwmon indices are not)
    vendor: str
    driver: str | None


def discover(sysfs_root: Path = Path("/sys")) -> list[Gpu]:
    gpus = []
    for device in sorted((sysfs_root / "bus/pci/devices").glob("*")):
        try:
            pci_class = (device / "class").read_text().strip()
            vendor = (device / "vendor").read_text().strip()
        except OSError:
            continue  # gone while we looked
        if not pci_class.startswith("0x03") or vendor not in VENDORS:
            continue
        driver = device / "driver"
        gpus.append(Gpu(device.name, VENDORS[vendor], driver.resolve().name if driver.exists() else None))
    return gpus
