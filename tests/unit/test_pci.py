"""Config-space and `resource` parsing on byte layouts built from the PCI Express specification, and which GPUs
sit behind a port (the GPU inventory, on a sysfs tree built like a real one)."""

import asyncio

from fakesysfs import (
    ATOMIC_COMPLETER,
    ATOMIC_ROUTING,
    DOWNSTREAM,
    ROOT_PORT,
    UPSTREAM,
    add_bridge,
    add_gpu,
    config_space,
    resource_file,
)
from gpuwarden.core.model import Event, Severity
from gpuwarden.gpu.inventory import GpuInventory
from gpuwarden.gpu.pci import PcieCap, bar_sizes, link_speed, pcie_capability
from gpuwarden.kernel.watch import behind_port


def test_the_capability_walk_finds_port_type_and_atomics():
    assert pcie_capability(config_space(0x1022, 0x1483, ROOT_PORT, ATOMIC_COMPLETER)) == PcieCap("root_port", False,
                                                                                                  True)
    assert pcie_capability(config_space(0x1002, 0x1478, UPSTREAM, ATOMIC_ROUTING)) == PcieCap("upstream_port", True,
                                                                                               False)
    only_32bit = config_space(0x1022, 0x1483, ROOT_PORT, 1 << 7)
    assert not pcie_capability(only_32bit).atomic_completer  # ROCm needs 32 and 64-bit completion


def test_unreadable_or_odd_config_space_is_unknown_not_a_crash():
    full = config_space(0x1022, 0x1483, ROOT_PORT, ATOMIC_COMPLETER)
    assert pcie_capability(full[:64]) is None  # what a non-root reader gets
    assert pcie_capability(b"") is None
    no_list = bytearray(full)
    no_list[0x06] = 0
    assert pcie_capability(bytes(no_list)) is None
    looped = bytearray(full)
    looped[0x51] = 0x50  # the list points at itself
    assert pcie_capability(bytes(looped)) is None
    version1 = bytearray(full)
    version1[0x66] = 0x41  # capability version 1: no Device Capabilities 2 register
    assert pcie_capability(bytes(version1)) == PcieCap("root_port", False, False)


def test_bar_sizes_from_the_resource_file():
    text = resource_file({0: (32 << 30, 0x14220C), 2: (2 << 20, 0x14220C), 4: (256, 0x40101), 5: (1 << 20, 0x40200)})
    assert bar_sizes(text) == [(0, 32 << 30, True), (2, 2 << 20, True), (5, 1 << 20, False)]  # I/O BAR 4 is no memory
    assert bar_sizes("garbage\n") == []


def test_link_speed_text():
    assert link_speed("32.0 GT/s PCIe") == 32.0 and link_speed("2.5 GT/s PCIe") == 2.5
    assert link_speed("Unknown") is None and link_speed(None) is None


def test_gpus_behind_a_port(tmp_path):
    port = add_bridge(tmp_path, "pci0000:00", "0000:00:01.1", 0x1022, 0x1483, ROOT_PORT)
    below = add_bridge(tmp_path, port, "0000:01:00.0", 0x1002, 0x1478, UPSTREAM)
    below = add_bridge(tmp_path, below, "0000:02:00.0", 0x1002, 0x1479, DOWNSTREAM)
    add_gpu(tmp_path, "0000:03:00.0", "rdna3", parent=below)
    add_gpu(tmp_path, "0000:83:00.0", "mi300", hwmon_index=5)
    inventory = GpuInventory(tmp_path)
    assert inventory.behind("0000:00:01.1") == []  # nothing discovered yet
    assert [g.pci for g in asyncio.run(inventory.refresh())] == ["0000:03:00.0", "0000:83:00.0"]
    assert inventory.behind("0000:00:01.1") == ["0000:03:00.0"]
    assert inventory.behind("0000:83:00.0") == ["0000:83:00.0"]  # a line from the GPU itself
    assert inventory.behind("0000:00:1c.4") == []


def test_a_gpu_that_went_stays_seen_but_is_no_longer_behind_its_port(tmp_path):
    """The policy lets a fault kill for a GPU seen since start, even one off the bus now."""
    port = add_bridge(tmp_path, "pci0000:00", "0000:00:01.1", 0x1022, 0x1483, ROOT_PORT)
    add_gpu(tmp_path, "0000:03:00.0", "rdna3", parent=port)
    inventory = GpuInventory(tmp_path)
    asyncio.run(inventory.refresh())
    assert inventory.behind("0000:00:01.1") == ["0000:03:00.0"]
    (tmp_path / "bus/pci/devices/0000:03:00.0").unlink()  # off the bus
    assert asyncio.run(inventory.refresh()) == []
    assert inventory.behind("0000:00:01.1") == [] and inventory.seen == {"0000:03:00.0"}


def test_an_event_at_a_port_names_the_gpu_behind_it():
    line = "pcieport 0000:00:1c.4: AER: Uncorrected (Fatal) error received: id=00e4"
    event = Event("pcie_aer", Severity.CRITICAL, "fatal uncorrected PCIe error at 0000:00:1c.4", 1.0,
                  evidence={"line": line, "pci": "0000:00:1c.4"})
    one = behind_port(event, lambda port: ["0000:06:00.0"])
    assert one.gpu == "0000:06:00.0" and one.evidence["gpus_behind"] == ["0000:06:00.0"]
    assert one.message.endswith("(GPU 0000:06:00.0 behind it)") and one.dedupe_key == "pcie_aer:0000:06:00.0"
    two = behind_port(event, lambda port: ["0000:06:00.0", "0000:07:00.0"])
    assert two.gpu is None and two.evidence["gpus_behind"] == ["0000:06:00.0", "0000:07:00.0"]
    assert behind_port(event, lambda port: []) is event


def test_a_gpu_that_comes_back_elsewhere_is_placed_anew(tmp_path):
    """A re-discovery keeps the path of a GPU it found last time, but one that went and came back (here below
    another port) is resolved again: the port a fault names must find it where it is now."""
    first = add_bridge(tmp_path, "pci0000:00", "0000:00:01.1", 0x1022, 0x1483, ROOT_PORT)
    second = add_bridge(tmp_path, "pci0000:00", "0000:00:03.1", 0x1022, 0x1483, ROOT_PORT)
    add_gpu(tmp_path, "0000:03:00.0", "rdna3", parent=first)
    inventory = GpuInventory(tmp_path)
    asyncio.run(inventory.refresh())
    asyncio.run(inventory.refresh())  # found again: its path is kept
    assert inventory.behind("0000:00:01.1") == ["0000:03:00.0"]
    (tmp_path / "bus/pci/devices/0000:03:00.0").unlink()
    asyncio.run(inventory.refresh())
    add_gpu(tmp_path, "0000:03:00.0", "rdna3", parent=second, hwmon_index=1)
    asyncio.run(inventory.refresh())
    assert inventory.behind("0000:00:01.1") == [] and inventory.behind("0000:00:03.1") == ["0000:03:00.0"]


def test_a_gpu_without_a_bound_driver(tmp_path):
    add_gpu(tmp_path, "0000:03:00.0", "rdna3")
    (tmp_path / "bus/pci/devices/0000:03:00.0/driver").unlink()  # unbound
    gpus = asyncio.run(GpuInventory(tmp_path).refresh())
    assert [(g.pci, g.driver) for g in gpus] == [("0000:03:00.0", None)]


def test_a_host_without_a_pci_bus_has_no_gpu(tmp_path):
    assert asyncio.run(GpuInventory(tmp_path / "no-sys").refresh()) == []
