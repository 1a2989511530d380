import pytest

from gpuwarden.core.model import Event, Severity, normalize_pci


@pytest.mark.parametrize(("raw", "want"), [
    ("0000:03:00.0", "0000:03:00.0"),
    ("00000000:3B:00.0", "0000:3b:00.0"),  # NVML
    ("0000:01:00", "0000:01:00.0"),  # NVRM short form
    ("3b:00.1", "0000:3b:00.1"),
    ("0001:c1:00.0", "0001:c1:00.0"),
    ("10000:e1:00.0", "10000:e1:00.0"),  # Intel VMD domain
])
def test_normalize_pci(raw, want):
    assert normalize_pci(raw) == want


@pytest.mark.parametrize("bad", ["", "gpu0", "0000:03:00.9", "card1"])
def test_normalize_rejects_non_addresses(bad):
    with pytest.raises(ValueError):
        normalize_pci(bad)


def test_dedupe_key_is_kind_and_subject():
    e = Event("xid", Severity.WARNING, "m", 1.0, gpu="0000:01:00.0", evidence={"xid": 13})
    assert e.dedupe_key == "xid:0000:01:00.0:xid13"
    assert Event("kernel_oops", Severity.WARNING, "m", 2.0).dedupe_key == "kernel_oops:host"


def test_severity_order_and_names():
    assert Severity.INFO < Severity.WARNING < Severity.CRITICAL
    assert str(Severity.parse("critical")) == "critical"
