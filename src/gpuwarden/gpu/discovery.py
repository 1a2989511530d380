"""Find GPUs by PCI address in sysfs: display-class devices (PCI class 0x03xxxx) of known vendors."""

from __future__ import annotations

from pathlib import Path

from gpuwarden.plain import plain

VENDORS = {"0x1002": "amd", "0x10de": "nvidia", "0x8086": "intel"}
GPU_CLASSES = ("03", "12")  # display controllers; processing accelerators (some Instinct and data-centre cards)


def is_gpu_class(pci_class: str) -> bool:
    """`0x030000` (sysfs) or `30000` (uevent PCI_CLASS, hex without leading zeros)."""
    return pci_class.removeprefix("0x").rjust(6, "0")[:2] in GPU_CLASSES


@plain
class Gpu:
    """A GPU found in sysfs."""

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
        if not is_gpu_class(pci_class) or vendor not in VENDORS:
            continue
        driver = device / "driver"
        gpus.append(Gpu(device.name, VENDORS[vendor], driver.resolve().name if driver.exists() else None))
    return gpus
