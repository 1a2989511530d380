"""Uevent classification on recorded uevent properties (as pyudev hands them over)."""

from gpuwarden.core.model import Severity
from gpuwarden.gpu.uevents import classify

AMD_UNBIND = {"ACTION": "unbind", "DEVPATH": "/devices/pci0000:00/0000:00:01.1/0000:03:00.0", "SUBSYSTEM": "pci",
              "PCI_CLASS": "30000", "PCI_ID": "1002:744C", "PCI_SLOT_NAME": "0000:03:00.0", "SEQNUM": "5123"}
MI300_REMOVE = {"ACTION": "remove", "DEVPATH": "/devices/pci0000:80/0000:80:01.1/0000:83:00.0", "SUBSYSTEM": "pci",
                "PCI_CLASS": "120000", "PCI_SLOT_NAME": "0000:83:00.0", "SEQNUM": "6001"}
NIC_UNBIND = {"ACTION": "unbind", "SUBSYSTEM": "pci", "PCI_CLASS": "20000", "PCI_SLOT_NAME": "0000:00:03.0"}
WEDGED = {"ACTION": "change", "DEVPATH": "/devices/pci0000:00/0000:00:01.1/0000:03:00.0/drm/card1",
          "SUBSYSTEM": "drm", "WEDGED": "rebind", "DEVNAME": "dri/card1"}


def test_unbind_of_a_gpu_is_an_unbind_attempt():
    event = classify(AMD_UNBIND, 1.0)
    assert (event.kind, event.severity, event.gpu) == ("unbind_attempt", Severity.CRITICAL, "0000:03:00.0")
    assert "reboot and wait 10 minutes instead" in event.message
    assert classify({**AMD_UNBIND, "ACTION": "bind"}, 1.0).kind == "unbind_attempt"


def test_removal_of_an_accelerator_class_gpu():
    event = classify(MI300_REMOVE, 1.0)
    assert (event.kind, event.gpu) == ("device_removed", "0000:83:00.0")


def test_other_devices_and_actions_are_ignored_unless_known():
    assert classify(NIC_UNBIND, 1.0) is None
    assert classify(NIC_UNBIND, 1.0, known={"0000:00:03.0"}).kind == "unbind_attempt"
    assert classify({**AMD_UNBIND, "ACTION": "change"}, 1.0) is None


def test_wedged_drm_device():
    event = classify(WEDGED, 1.0)
    assert (event.kind, event.severity, event.gpu) == ("gpu_wedged", Severity.CRITICAL, "0000:03:00.0")
    assert classify({**WEDGED, "WEDGED": "none"}, 1.0).severity == Severity.WARNING
