"""One event per Xid: NVML reports every Xid the kernel log also prints, and NVML's copy names no process. The
kernel's copy carries the driver's attribution (the pid that raised an application's Xid), so it wins: an NVML
Xid is held for WINDOW seconds and dropped when the kernel log has the same Xid on the same GPU within WINDOW
of it, before or after. Without a kernel log (a container with no /dev/kmsg), NVML's copy is recorded once its
window has passed. Pure but for the caller's clock (monotonic seconds)."""

from __future__ import annotations

from collections import deque

from gpuwarden.core.model import Event
from gpuwarden.core.plain import plain

WINDOW = 3.0  # NVRM prints the Xid from the same interrupt that NVML's event comes from; kmsg reads lag a little


@plain
class Held:
    """An NVML Xid held for a while: the kernel's line of the same Xid is the better event."""

    gpu: str
    xid: int
    at: float
    event: Event


class XidMerge:
    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self._kernel: deque[tuple[str, int, float]] = deque(maxlen=256)  # (gpu, xid, when) of kernel copies
        self._held: list[Held] = []
        self.merged = 0  # NVML copies dropped for the kernel's

    def kernel(self, gpu: str, xid: int, now: float) -> None:
        """The kernel log reported this Xid: a held NVML copy of it goes."""
        self._kernel.append((gpu, xid, now))
        kept = [h for h in self._held if not (h.gpu == gpu and h.xid == xid and abs(now - h.at) <= self.window)]
        self.merged += len(self._held) - len(kept)
        self._held = kept

    def nvml(self, gpu: str, xid: int, event: Event, now: float) -> None:
        """NVML reported this Xid: dropped if the kernel's copy came already, else held for the window."""
        if any(g == gpu and x == xid and now - t <= self.window for g, x, t in self._kernel):
            self.merged += 1
            return
        self._held.append(Held(gpu, xid, now, event))

    def due(self, now: float) -> list[Event]:
        """NVML copies whose window passed with no kernel copy: the only word there is of them."""
        due = [h.event for h in self._held if now - h.at > self.window]
        self._held = [h for h in self._held if now - h.at <= self.window]
        return due

    def tap(self, sink, clock):
        """`sink` as the kernel watch's: every live kernel Xid it records is noted here first."""
        return _KernelTap(sink, self, clock)


class _KernelTap:
    def __init__(self, sink, merge: XidMerge, clock) -> None:
        self._sink, self._merge, self._clock = sink, merge, clock

    def record(self, events: list[Event], cursor: tuple[str, str] | None = None) -> list[int]:
        for event in events:
            if event.kind == "xid" and event.live and event.gpu and isinstance(event.evidence.get("xid"), int):
                self._merge.kernel(event.gpu, event.evidence["xid"], self._clock())
        return self._sink.record(events, cursor)

    def __getattr__(self, name: str):
        return getattr(self._sink, name)
