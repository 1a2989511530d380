"""Faithful fake amdgpu sysfs trees (as amdgpu_pm.c and the PCI core make them), since no Radeon is here.

Layout as the kernel makes it: /sys/devices/pci0000:00/<bdf>/ with class, vendor, device, uevent, the driver
symlink into /sys/bus/pci/drivers/amdgpu, hwmon/hwmonN/ (name "amdgpu"), and /sys/bus/pci/devices/<bdf> as a
symlink. Units as amdgpu writes them: millidegrees, microwatts, Hz, mV, bytes, "16.0 GT/s PCIe".
"""

from __future__ import annotations

import os
from pathlib import Path

GiB = 1 << 30

CARDS = {
    # RDNA3 (SMU 13.0.0): power1_average only, three temperatures, a fan, indexed OD_SCLK
    "rdna3": {
        "device": "0x744c", "class": "0x030000", "product_name": "Radeon RX 7900 XTX",
        "hwmon": {"temp1_label": "edge", "temp1_input": 54000, "temp2_label": "junction", "temp2_input": 67000,
                  "temp3_label": "mem", "temp3_input": 60000, "power1_average": 272000000,
                  "power1_cap": 327000000, "power1_cap_max": 402000000, "fan1_input": 1480, "pwm1": 96,
                  "freq1_label": "sclk", "freq1_input": 2482000000, "freq2_label": "mclk", "freq2_input": 1249000000,
                  "in0_label": "vddgfx", "in0_input": 1012},
        "files": {"gpu_busy_percent": 97, "mem_info_vram_total": 24 * GiB, "mem_info_vram_used": 21 * GiB,
                  "mem_info_vis_vram_total": 24 * GiB, "current_link_speed": "16.0 GT/s PCIe",
                  "max_link_speed": "16.0 GT/s PCIe", "current_link_width": 16, "max_link_width": 16,
                  "power_dpm_force_performance_level": "auto",
                  "pp_dpm_sclk": "0: 500Mhz \n1: 2482Mhz *\n2: 2950Mhz \n",
                  "pp_od_clk_voltage": "OD_SCLK:\n0: 500Mhz\n1: 2950Mhz\nOD_MCLK:\n0: 97Mhz\n1: 1250MHz\n"
                                       "OD_VDDGFX_OFFSET:\n0mV\nOD_RANGE:\nSCLK:     500Mhz       3000Mhz\n"},
    },
    # MI300 class (SMU 13.0.6): power1_input only, no edge temperature (hidden on GC 9.4.3), no fan
    "mi300": {
        "device": "0x74a1", "class": "0x120000", "product_name": "AMD Instinct MI300X",
        "hwmon": {"temp2_label": "junction", "temp2_input": 45000, "temp3_label": "mem", "temp3_input": 41000,
                  "power1_input": 138000000, "power1_cap": 750000000, "power1_cap_max": 750000000,
                  "freq1_label": "sclk", "freq1_input": 132000000},
        "files": {"gpu_busy_percent": 0, "mem_info_vram_total": 192 * GiB, "mem_info_vram_used": 300 << 20,
                  "mem_info_vis_vram_total": 192 * GiB, "current_link_speed": "32.0 GT/s PCIe",
                  "max_link_speed": "32.0 GT/s PCIe", "current_link_width": 16, "max_link_width": 16,
                  "pp_dpm_sclk": "0: 500Mhz\n1: 132Mhz *\n2: 2100Mhz\n"},
    },
    # An APU (Phoenix): edge only, no cap, no fan, sclk only, vddgfx and vddnb
    "apu": {
        "device": "0x15bf", "class": "0x030000",
        "hwmon": {"temp1_label": "edge", "temp1_input": 48000, "power1_average": 21000000,
                  "freq1_label": "sclk", "freq1_input": 800000000, "in0_label": "vddgfx", "in0_input": 780,
                  "in1_label": "vddnb", "in1_input": 650},
        "files": {"gpu_busy_percent": 12, "mem_info_vram_total": 512 << 20, "mem_info_vram_used": 200 << 20,
                  "mem_info_vis_vram_total": 512 << 20, "current_link_speed": "Unknown", "max_link_speed": "Unknown"},
    },
    # RDNA4 (SMU 14.0.2) with the 2025 un-indexed OD_SCLK_OFFSET
    "rdna4": {
        "device": "0x7550", "class": "0x030000", "product_name": "Radeon RX 9070 XT",
        "hwmon": {"temp1_label": "edge", "temp1_input": 50000, "temp2_label": "junction", "temp2_input": 60000,
                  "temp3_label": "mem", "temp3_input": 58000, "power1_average": 250000000,
                  "power1_cap": 304000000, "power1_cap_max": 334000000, "fan1_input": 1200, "pwm1": 80,
                  "freq1_label": "sclk", "freq1_input": 2900000000, "freq2_label": "mclk", "freq2_input": 1258000000},
        "files": {"gpu_busy_percent": 95, "current_link_speed": "32.0 GT/s PCIe", "max_link_speed": "32.0 GT/s PCIe",
                  "current_link_width": 16, "max_link_width": 16,
                  "pp_od_clk_voltage": "OD_SCLK_OFFSET:\n-150Mhz\nOD_MCLK:\n0: 97Mhz\n1: 1258MHz\nOD_RANGE:\n"
                                       "SCLK_OFFSET:    -500Mhz       1000Mhz\n"},
    },
}


# PCI config space (PCI Express Base Specification; include/uapi/linux/pci_regs.h)
ENDPOINT, ROOT_PORT, UPSTREAM, DOWNSTREAM = 0x0, 0x4, 0x5, 0x6  # PCI Express capability: device/port type
ATOMIC_ROUTING, ATOMIC_COMPLETER = 1 << 6, 1 << 7 | 1 << 8  # Device Capabilities 2: routing; 32 + 64-bit completer
MEM64_PREFETCH, MEM = 0x14220C, 0x40200  # `resource` flags: IORESOURCE_MEM | PREFETCH | MEM_64 ..., plain MEM


def config_space(vendor: int, device: int, port_type: int, devcap2: int = 0) -> bytes:
    """256 bytes as root reads them: header, a power-management capability, then PCI Express (version 2)."""
    data = bytearray(256)
    data[0:4] = vendor.to_bytes(2, "little") + device.to_bytes(2, "little")
    data[0x06] = 0x10  # status: has a capability list
    data[0x34] = 0x50
    data[0x50:0x52] = bytes([0x01, 0x64])  # power management, next at 0x64
    data[0x64:0x66] = bytes([0x10, 0x00])  # PCI Express, last
    data[0x66:0x68] = (0x2 | port_type << 4).to_bytes(2, "little")
    data[0x64 + 0x24:0x64 + 0x28] = devcap2.to_bytes(4, "little")
    return bytes(data)


def resource_file(bars: dict[int, tuple[int, int]]) -> str:
    """A device's `resource`: one `start end flags` line per resource, {index: (size, flags)} for the BARs."""
    lines, base, unused = [], 0x7000000000, " ".join(["0x" + "0" * 16] * 3)
    for index in range(13):
        size, flags = bars.get(index, (0, 0))
        lines.append(f"0x{base:016x} 0x{base + size - 1:016x} 0x{flags:016x}" if size else unused)
        base += max(size, 1 << 20)
    return "\n".join(lines) + "\n"


def add_bridge(root: Path, parent: str, bdf: str, vendor: int, device: int, port_type: int, speed: str = "16.0",
               max_speed: str = "16.0", width: int = 16, max_width: int = 16, devcap2: int = 0) -> str:
    """A root port or switch port at /sys/devices/<parent>/<bdf>; returns the new parent path for what is below."""
    dev = root / "devices" / parent / bdf
    dev.mkdir(parents=True)
    for name, value in (("vendor", f"0x{vendor:04x}"), ("device", f"0x{device:04x}"), ("class", "0x060400"),
                        ("current_link_speed", f"{speed} GT/s PCIe"), ("max_link_speed", f"{max_speed} GT/s PCIe"),
                        ("current_link_width", width), ("max_link_width", max_width)):
        (dev / name).write_text(f"{value}\n")
    (dev / "config").write_bytes(config_space(vendor, device, port_type, devcap2))
    (root / "bus/pci/devices").mkdir(parents=True, exist_ok=True)
    os.symlink(dev, root / "bus/pci/devices" / bdf)
    return f"{parent}/{bdf}"


def add_gpu(root: Path, bdf: str, card: str, overrides: dict | None = None, hwmon_index: int = 0,
            parent: str = "pci0000:00", bar0: int | None = None) -> Path:
    """One amdgpu GPU under `root` (a fake /sys) at /sys/devices/<parent>/<bdf>; `overrides` replaces or (with
    None) removes files; `bar0` is the VRAM BAR's size (default: all of the CPU-visible VRAM)."""
    spec = CARDS[card]
    dev = root / "devices" / parent / bdf
    hw = dev / "hwmon" / f"hwmon{hwmon_index}"
    hw.mkdir(parents=True)
    (hw / "name").write_text("amdgpu\n")
    driver = root / "bus/pci/drivers/amdgpu"
    driver.mkdir(parents=True, exist_ok=True)
    for name in ("bind", "unbind"):
        (driver / name).touch()
    os.symlink(driver, dev / "driver")
    (root / "bus/pci/devices").mkdir(parents=True, exist_ok=True)
    os.symlink(dev, root / "bus/pci/devices" / bdf)
    for cls, name, target in (("hwmon", hw.name, hw), ("drm", f"card{hwmon_index}", dev)):
        (root / "class" / cls).mkdir(parents=True, exist_ok=True)
        if cls == "drm":
            (dev / "drm" / name).mkdir(parents=True)
            os.symlink(dev, dev / "drm" / name / "device")
            target = dev / "drm" / name
        os.symlink(target, root / "class" / cls / name)
    files = {"numa_node": 0, "vendor": "0x1002", "device": spec["device"], "class": spec["class"],
             "uevent": f"DRIVER=amdgpu\nPCI_CLASS={int(spec['class'], 16):X}\nPCI_SLOT_NAME={bdf}\n",
             **({"product_name": spec["product_name"]} if "product_name" in spec else {}), **spec["files"]}
    hwmon = dict(spec["hwmon"])
    for name, value in (overrides or {}).items():
        target = hwmon if name in hwmon or name.startswith(("temp", "power", "fan", "pwm", "freq", "in")) else files
        target[name] = value
    for folder, entries in ((dev, files), (hw, hwmon)):
        for name, value in entries.items():
            if value is not None:
                (folder / name).write_text(f"{value}\n" if not str(value).endswith("\n") else str(value))
    (dev / "config").write_bytes(config_space(0x1002, int(spec["device"], 16), ENDPOINT))
    bar0 = bar0 or int(files.get("mem_info_vis_vram_total") or 256 << 20)
    (dev / "resource").write_text(resource_file({0: (bar0, MEM64_PREFETCH), 2: (2 << 20, MEM64_PREFETCH),
                                                 5: (1 << 20, MEM)}))
    return dev


def build(root: Path, gpus: dict[str, str]) -> Path:
    """A fake /sys with these GPUs ({bdf: card}); returns `root`."""
    for index, (bdf, card) in enumerate(gpus.items()):
        add_gpu(root, bdf, card, hwmon_index=index * 2 + 1)  # hwmon numbers that do not follow the card order
    return root
