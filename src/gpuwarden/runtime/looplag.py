"""How late the event loop is, as a value any thread reads (the metrics registry's live gauge); the health loop
(hub/health.py) probes and writes it."""

from __future__ import annotations

import time


class LoopLag:
    """How late the event loop is, readable from any thread: the lateness so far of the probe that is due (a
    block going on, which the blocked loop cannot say itself) or the last one measured, whichever is larger. The
    exporter computes it at each scrape (`SelfMetrics.live`): no thread of its own wakes to keep it current."""

    def __init__(self) -> None:
        self.last = 0.0  # the last probe's lateness, seconds
        self.due: float | None = None  # when the next probe is due (the loop's clock, monotonic); None: no probe

    def __call__(self) -> float:
        due = self.due
        return self.last if due is None else max(self.last, time.monotonic() - due)
