"""The GPU vendor registry refuses a second vendor of a name or a PCI ID: a GPU found by its PCI vendor ID must
have one reader, one set of throttle reasons, one doctor's check."""

import pytest

from gpuwarden.gpu import vendors
from gpuwarden.gpu.vendors.base import GpuVendor


def test_a_vendor_whose_name_or_pci_id_is_taken_is_refused_and_leaves_the_registry_as_it_was():
    before = vendors.all_vendors()
    with pytest.raises(ValueError, match="'amd' is registered already"):
        vendors.register(GpuVendor("amd", frozenset({"0xacee"})))
    with pytest.raises(ValueError, match="PCI ID 0x10de belongs to 'nvidia' already"):
        vendors.register(GpuVendor("acme", frozenset({"0xacee", "0x10de"})))
    assert vendors.all_vendors() == before and vendors.of_pci_id("0xacee") is None and not vendors.named("acme")


def test_a_vendor_registered_is_found_by_name_and_pci_id_and_goes_when_unregistered():
    acme = vendors.register(GpuVendor("acme", frozenset({"0xacee"})))
    try:
        assert vendors.named("acme") is acme and vendors.of_pci_id("0xacee") is acme
    finally:
        vendors.unregister("acme")
    assert vendors.named("acme") is None and vendors.of_pci_id("0xacee") is None
