"""What an alert knows besides its events (the host, its GPUs and engines, the reader's clock), and the plain
questions the title, the body and the steps ask of an incident's events."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import tzinfo

from gpuwarden.alert.runbooks import OFF_THE_BUS_XIDS
from gpuwarden.alert.storm import FOLLOW_UP_KINDS
from gpuwarden.kinds import GPU_LOST_KINDS
from gpuwarden.model import Event


@dataclass(frozen=True, eq=False, repr=False)
class Context:
    """What the daemon knows that the events do not say: the host, its GPUs and engines, the reader's clock."""

    host: str
    gpus: Mapping[str, tuple[int, str | None]] = field(default_factory=dict)  # PCI address -> (index, model)
    engines: Mapping[str, frozenset[str] | None] = field(default_factory=dict)  # engine -> its GPUs (None: any)
    tz: tzinfo | None = None  # the reader's local time zone; None: the machine's

    def gpu(self, pci: str | None) -> str:
        if pci is None:
            return "a GPU"
        if pci not in self.gpus:
            return f"GPU {pci}"
        index, model = self.gpus[pci]
        return f"GPU {index} ({pci}{', ' + model if model else ''})"

    def engines_on(self, pci: str) -> list[str]:
        """The engines known to run on the GPU."""
        return sorted(name for name, gpus in self.engines.items() if gpus is not None and pci in gpus)

    def engines_maybe_on(self, pci: str) -> list[str]:
        """The engines whose GPUs are unknown: they may be on any (the policy counts them too)."""
        return sorted(name for name, gpus in self.engines.items() if gpus is None)


def first(events: list[Event], *kinds: str) -> Event | None:
    return next((e for e in events if e.kind in kinds), None)


def first_fault(events: list[Event]) -> Event | None:
    return next((e for e in events if e.kind not in FOLLOW_UP_KINDS), None)


def is_lost(e: Event) -> bool:
    """A GPU gone until a reboot (an Xid counts only when it says the GPU fell off the bus)."""
    return (e.kind in GPU_LOST_KINDS and e.kind != "xid") or e.evidence.get("xid") in OFF_THE_BUS_XIDS
