"""The store's health, as the store says it: writing started failing, or works again. The store calls it on the
loop; it reports through its own sink, so the store says nothing to the layers above it but through a port."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from gpuwarden.core import conditions, families
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.core.model import Event, Severity, Sink

log = logging.getLogger("gpuwarden")


class StoreHealth:
    """The store's reports (called on the loop): writing started failing, or works again. `changed` wakes the
    STATUS line (Health), which says it at once."""

    def __init__(self, sink: Sink, metrics: SelfMetrics, path: Path) -> None:
        self.sink, self.metrics, self.path = sink, metrics, path
        self.error: str | None = None  # why the store cannot be written now; None while it can
        self.changed = asyncio.Event()

    def __call__(self, error: str | None) -> None:
        was, self.error = self.error, error
        if error and not was:
            self.sink.record([Event("store_unwritable", Severity.WARNING,
                                    f"events cannot be stored: {error}. They are logged, alerted and acted on, kept "
                                    "in memory and written when the store works again", time.time(),
                                    evidence={"error": error, "store": str(self.path)})])
        elif was and not error:
            log.info("the store is written again")
            self.sink.resolve(conditions.STORE, f"the store is written again ({self.path.parent})")
        self.metrics.set(families.STORE_WRITABLE, 0 if error else 1)
        self.changed.set()
