"""PCI facts from sysfs for the doctor: the chain of links from a GPU up to its root port, BAR sizes, and
what the PCI Express capability in config space says (port type, AtomicOp routing and completion).

Config-space layout (PCI Express Base Specification; Linux include/uapi/linux/pci_regs.h): the status
register's bit 4 says a capability list exists, its head is at 0x34, each entry is (id, next); the PCI
Express capability has id 0x10, its type in bits 7:4 of the word at +2, Device Capabilities 2 at +0x24.
An unprivileged reader gets only the first 64 bytes of `config`: then the capability is unknown (None).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpuwarden.core.plain import compared, plain

_SPEED = re.compile(r"^(\d+(?:\.\d+)?)\s*GT/s")
_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")

PORT_TYPES = {0x0: "endpoint", 0x1: "legacy_endpoint", 0x4: "root_port", 0x5: "upstream_port",
              0x6: "downstream_port", 0x7: "pcie_to_pci_bridge", 0x8: "pci_to_pcie_bridge",
              0x9: "rc_integrated_endpoint", 0xA: "rc_event_collector"}
CAP_PCIE = 0x10
DEVCAP2_ATOMIC_ROUTING, DEVCAP2_ATOMIC32, DEVCAP2_ATOMIC64 = 1 << 6, 1 << 7, 1 << 8
IORESOURCE_MEM, IORESOURCE_PREFETCH = 0x200, 0x2000


@compared
class PcieCap:
    """What a device's PCIe capability says of AtomicOps."""

    port_type: str
    atomic_routing: bool  # a switch port passes AtomicOps on
    atomic_completer: bool  # completes 32- and 64-bit AtomicOps (what ROCm needs of the root port)


@plain
class PciNode:
    """One device on the path from a GPU up to its root port, and its link."""

    bdf: str
    vendor: int | None
    device: int | None
    pci_class: int | None
    speed_gts: float | None  # the link this device sits on (for a bridge's downstream port: the link below)
    max_speed_gts: float | None
    width: int | None
    max_width: int | None
    pcie: PcieCap | None  # None: config space not readable past the header (not root), or not PCI Express

    @property
    def is_bridge(self) -> bool:
        return self.pci_class is not None and self.pci_class >> 8 == 0x0604


def link_speed(text: str | None) -> float | None:
    """GT/s from sysfs text such as `16.0 GT/s PCIe`; None for `Unknown` or garbage."""
    m = _SPEED.match(text or "")
    return float(m.group(1)) if m else None


def link_width(text: str | None) -> int | None:
    """Lanes from sysfs text such as `16`; None for garbage."""
    return int(text) if text and text.isdigit() else None


def pcie_capability(config: bytes) -> PcieCap | None:
    """The PCI Express capability of a config-space dump, or None when it is not there (or not readable)."""
    if len(config) < 0x40 or not _u16(config, 0x06) & 0x10:
        return None
    pointer, seen = config[0x34] & 0xFC, set()
    while 0x40 <= pointer <= len(config) - 2 and pointer not in seen:  # `seen`: a looped list ends the walk
        seen.add(pointer)
        if config[pointer] == CAP_PCIE and pointer + 0x28 <= len(config):
            flags = _u16(config, pointer + 2)
            devcap2 = _u32(config, pointer + 0x24) if flags & 0xF >= 2 else 0
            atomics = DEVCAP2_ATOMIC32 | DEVCAP2_ATOMIC64
            return PcieCap(PORT_TYPES.get(flags >> 4 & 0xF, f"type {flags >> 4 & 0xF}"),
                           bool(devcap2 & DEVCAP2_ATOMIC_ROUTING), devcap2 & atomics == atomics)
        pointer = config[pointer + 1] & 0xFC
    return None


def bar_sizes(resource: str) -> list[tuple[int, int, bool]]:
    """(index, size in bytes, prefetchable) of each memory BAR (0-5) in a device's `resource` file."""
    bars = []
    for index, line in enumerate(resource.splitlines()[:6]):
        try:
            start, end, flags = (int(field, 16) for field in line.split())
        except ValueError:
            continue
        if flags & IORESOURCE_MEM and end > start:
            bars.append((index, end - start + 1, bool(flags & IORESOURCE_PREFETCH)))
    return bars


def read_node(path: Path) -> PciNode:
    return PciNode(path.name, _hex(path / "vendor"), _hex(path / "device"), _hex(path / "class"),
                   link_speed(_text(path / "current_link_speed")), link_speed(_text(path / "max_link_speed")),
                   link_width(_text(path / "current_link_width")), link_width(_text(path / "max_link_width")),
                   pcie_capability(_bytes(path / "config")))


def device_dir(sysfs_root: Path, bdf: str) -> Path:
    """The device's real directory, /sys/devices/pciDDDD:BB/<root port>/.../<bdf>."""
    return Path(os.path.realpath(sysfs_root / "bus/pci/devices" / bdf))


def upstream(sysfs_root: Path, bdf: str) -> list[PciNode]:
    """The device and every bridge above it, nearest first: the last one is the root port."""
    path, chain = device_dir(sysfs_root, bdf), []
    while _BDF.match(path.name):
        chain.append(read_node(path))
        path = path.parent
    return chain


def bars(sysfs_root: Path, bdf: str) -> list[tuple[int, int, bool]]:
    return bar_sizes(_text(device_dir(sysfs_root, bdf) / "resource") or "")


def numa_node(sysfs_root: Path, bdf: str) -> int | None:
    """The device's NUMA node; None where the kernel says -1 (unknown)."""
    text = _text(device_dir(sysfs_root, bdf) / "numa_node") or ""
    return int(text) if text.isdigit() else None


def root_complex(sysfs_root: Path, bdf: str) -> str:
    """`pci0000:00`: the host bridge the device hangs under."""
    return next((p.name for p in device_dir(sysfs_root, bdf).parents if p.name.startswith("pci")), "?")


def iommu_type(sysfs_root: Path, bdf: str) -> str | None:
    """The default domain type of the device's IOMMU group (identity = passthrough, DMA, DMA-FQ), or None."""
    return _text(device_dir(sysfs_root, bdf) / "iommu_group" / "type")


def _u16(data: bytes, offset: int) -> int:
    return int.from_bytes(data[offset:offset + 2], "little")


def _u32(data: bytes, offset: int) -> int:
    return int.from_bytes(data[offset:offset + 4], "little")


def _bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _hex(path: Path) -> int | None:
    try:
        return int(_text(path) or "", 16)
    except ValueError:
        return None

