"""Config-space and `resource` parsing, on byte layouts built from the PCI Express specification."""

from fakesysfs import ATOMIC_COMPLETER, ATOMIC_ROUTING, ROOT_PORT, UPSTREAM, config_space, resource_file
from gpuwarden.gpu.pci import PcieCap, bar_sizes, link_speed, pcie_capability


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
