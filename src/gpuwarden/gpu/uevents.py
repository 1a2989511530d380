"""Kernel uevents for GPUs, through pyudev's kernel netlink source (it works with no udevd).

Uevents come after the fact: an `unbind` uevent cannot stop the unbind, it only reports it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Mapping

from gpuwarden.core import families
from gpuwarden.core.model import Event, Severity, Sink, normalize_pci
from gpuwarden.gpu.discovery import is_gpu_class

log = logging.getLogger(__name__)

REOPEN = 60.0  # seconds between tries to open the uevent socket when it cannot be opened

_PCI_IN_PATH = re.compile(r"/([0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])(?=/|$)")
REBOOT_INSTEAD = ("after a device lost, unbind/bind is a known way to a kernel panic: reboot and wait 10 minutes "
                  "instead")


def is_gpu(props: Mapping[str, str], known: set[str]) -> bool:
    return is_gpu_class(props.get("PCI_CLASS", "")) or _address(props) in known


def _address(props: Mapping[str, str]) -> str | None:
    slot = props.get("PCI_SLOT_NAME")
    if slot:
        return normalize_pci(slot)
    found = _PCI_IN_PATH.findall(props.get("DEVPATH", ""))
    return normalize_pci(found[-1]) if found else None


def classify(props: Mapping[str, str], now: float, known: set[str] = frozenset()) -> Event | None:
    """The event a uevent means, or None. Pure: tested on recorded uevent properties."""
    subsystem, action = props.get("SUBSYSTEM"), props.get("ACTION")
    evidence = {"uevent": dict(props)}
    if subsystem == "pci" and action in ("unbind", "bind", "remove") and is_gpu(props, known):
        gpu = _address(props)
        if action == "remove":
            return Event("device_removed", Severity.CRITICAL, f"GPU {gpu} was removed from the PCI bus; "
                         f"{REBOOT_INSTEAD}", now, gpu=gpu, evidence=evidence)
        what = "unbound from its driver" if action == "unbind" else "bound to a driver again"
        return Event("unbind_attempt", Severity.CRITICAL, f"GPU {gpu} was {what}; {REBOOT_INSTEAD}", now, gpu=gpu,
                     evidence=evidence)
    if subsystem == "drm" and action == "change" and "WEDGED" in props:
        gpu = _address(props)
        method = props["WEDGED"]
        severity = Severity.WARNING if method == "none" else Severity.CRITICAL
        return Event("gpu_wedged", severity, f"GPU {gpu or '?'} reported itself wedged (recovery: {method})", now,
                     gpu=gpu, evidence={**evidence, "runbook": "reset"} if method == "none" else evidence)
    return None


class UeventWatch:
    name = "uevents"

    def __init__(self, sink: Sink, known: Callable[[], set[str]], on_pci_change: Callable[[], None]) -> None:
        self.sink, self.known, self.on_pci_change = sink, known, on_pci_change
        self.unavailable: str | None = None  # why uevents cannot be read now

    def state(self) -> dict:
        """Its state for the registry (core/registry.py): netlink, or why uevents cannot be read."""
        return {"detail": self.unavailable or "netlink"}

    async def _open(self):
        """The kernel's uevent socket, once it opens. When it cannot (pyudev finds no libudev in a /dev without
        /dev/null; netlink refused) that is reported once and tried again every REOPEN seconds: the daemon runs
        on, degraded, and keeps its watchdog (a restart cannot cure it)."""
        while True:
            try:
                monitor = _monitor()
                self.sink.metric(families.SOURCE_UP, 1, "uevents")
                return monitor
            except (OSError, ImportError) as exc:
                self.sink.metric(families.SOURCE_UP, 0, "uevents")
                if self.unavailable is None:
                    self.unavailable = f"{type(exc).__name__}: {exc}"
                    self.sink.record([Event(
                        "watchdog_error", Severity.WARNING, f"kernel uevents cannot be read ({self.unavailable}): "
                        f"GPU unbinds and removals are seen only in the kernel log; trying again every "
                        f"{REOPEN:.0f} s", time.time(), evidence={"component": self.name, "error": self.unavailable})])
                    log.warning("uevents unavailable (%s); trying again every %.0f s", self.unavailable, REOPEN)
            await asyncio.sleep(REOPEN)

    async def run(self) -> None:
        monitor = await self._open()
        if self.unavailable:
            log.info("uevents readable again after: %s", self.unavailable)
            self.unavailable = None
        loop = asyncio.get_running_loop()
        loop.add_reader(monitor.fileno(), self._drain, monitor)
        try:
            await asyncio.Future()  # runs until cancelled; the reader does the work
        finally:
            loop.remove_reader(monitor.fileno())

    def _drain(self, monitor) -> None:
        while (device := monitor.poll(timeout=0)) is not None:
            props = dict(device.properties)
            self.sink.count(families.UEVENTS, props.get("SUBSYSTEM", "?"), props.get("ACTION", "?"))
            event = classify(props, time.time(), self.known())
            if event:
                self.sink.record([event])
            if props.get("SUBSYSTEM") == "pci" and props.get("ACTION") in ("add", "bind", "remove", "unbind"):
                self.on_pci_change()


def _monitor():
    import pyudev

    monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source="kernel")
    monitor.filter_by("pci")
    monitor.filter_by("drm")
    monitor.start()
    return monitor
