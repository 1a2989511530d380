"""Types shared across the package: events, severities, PCI addresses."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any


class Severity(enum.IntEnum):
    INFO = 0
    WARNING = 1
    CRITICAL = 2

    def __str__(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        return cls[text.upper()]


KINDS = frozenset(
    """sq_intr ring_timeout gpu_reset reset_failed device_lost page_fault ras_error pcie_aer xid gsp_error
    kernel_oops gpu_unresponsive gpu_missing thermal power fan clock pcie_link config_asymmetry engine_stall
    engine_unresponsive engine_exited engine_crash_loop engine_killed unbind_attempt device_removed gpu_wedged
    guard_lost cache_poisoned watchdog_error kmsg_overrun smu_error kill_refused""".split()
)


@dataclass(frozen=True, slots=True)
class Event:
    """Something gpuwarden noticed. `time` is wall-clock seconds since the epoch."""

    kind: str
    severity: Severity
    message: str
    time: float
    gpu: str | None = None
    engine: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    count: int = 1

    @property
    def dedupe_key(self) -> str:
        """Stable across restarts: what the event is about, not when."""
        subject = self.gpu or self.engine or "host"
        xid = self.evidence.get("xid")
        return f"{self.kind}:{subject}" + (f":xid{xid}" if xid is not None else "")


_PCI = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?$")


def normalize_pci(address: str) -> str:
    """`00000000:3B:00.0`, `0000:01:00` (NVRM short form) and `3b:00.0` all become `0000:3b:00.0`.

    Domains above 0xffff (Intel VMD) keep their extra digits.
    """
    m = _PCI.match(address.strip())
    if not m:
        raise ValueError(f"not a PCI address: {address!r}")
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn or '0')}"
