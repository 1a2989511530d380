"""Reports on one queue (node-problem-detector's `Status{Events, Conditions}` on one channel, drained by one loop).

Every component reports through its own `Outbox` (the `model.Sink` it was built with): what it saw in one step
of the loop (its events with their cursor, the conditions it saw end, storms that grew, the kernel lines, the
engines it watches) becomes one `Report` on the one queue the hub drains. Nothing a component does waits for the
hub or needs an answer from it; its metrics go straight to its own handles (`SelfMetrics`), not through the hub.

Back-pressure: none, on purpose. The queue is unbounded and `put` never waits: a kernel fault must never be
dropped, and a producer on the event loop must never block it. The producers bound themselves (a kernel storm is
one burst, each watch reports once per poll), and the hub drains everything queued each time it runs without
awaiting anything else (the store queues its own writes), so the queue holds at most what arrived during one
pass of the loop."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

from gpuwarden.core import families
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.core.model import ConditionKey, Event
from gpuwarden.core.plain import plain
from gpuwarden.core.policy import EngineView


@plain
class Resolution:
    """A condition to end, and why."""

    key: ConditionKey
    message: str
    cures: frozenset[str] | None = None


@dataclass(slots=True, eq=False, repr=False)
class Report:
    """One step of one component, handled by the hub in this order: lines, events (with `refs`, the outbox's
    own numbers for them, and the cursor), recounts (a stored event's storm grew: its ref and its final
    event), resolutions. `engines`/`samples`: the views and last scrapes of the engines the engine watch
    looked at (each poll its own engine); `whole`: they are all the engines watched, the others are gone."""

    source: str
    lines: list[tuple[float, str]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    refs: list[tuple[str, int]] = field(default_factory=list)
    cursor: tuple[str, str] | None = None
    recounts: list[tuple[tuple[str, int], Event]] = field(default_factory=list)
    resolved: list[Resolution] = field(default_factory=list)
    engines: list[EngineView] | None = None
    samples: dict[str, dict] | None = None
    whole: bool = False


# the hub's order of a report's parts: a component's later call of an earlier part starts a new report
_LINES, _EVENTS, _RECOUNTS, _RESOLVED = range(4)


class Outbox:
    """One component's `model.Sink`: its calls of one loop step are gathered into one report, put on the queue
    at the loop's next turn (or at once, outside a loop). Order is kept: a call of a part the hub handles before
    one already gathered starts a new report."""

    def __init__(self, source: str, queue: asyncio.Queue[Report], metrics: SelfMetrics) -> None:
        self.source, self._queue, self._metrics = source, queue, metrics
        self._numbers = itertools.count(1)
        self._pending: Report | None = None
        self._stage = _LINES

    def _report(self, stage: int) -> Report:
        if self._pending is not None and stage < self._stage:
            self.flush()
        if self._pending is None:
            self._pending = Report(self.source)
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop (a tool, a test): flushed by the caller's next call or flush()
                pass
        self._stage = stage
        return self._pending

    def flush(self) -> None:
        if self._pending is not None:
            self._queue.put_nowait(self._pending)  # unbounded: never waits, never drops
            self._pending, self._stage = None, _LINES

    # --- model.Sink --------------------------------------------------------------------------------

    def record(self, events: list[Event], cursor: tuple[str, str] | None = None) -> list[tuple[str, int]]:
        """Returns this outbox's own numbers for the events (for `set_count`): no answer from the hub."""
        report = self._report(_EVENTS)
        refs = [(self.source, next(self._numbers)) for _ in events]
        report.events += events
        report.refs += refs
        report.cursor = cursor or report.cursor
        return refs

    def set_count(self, ref: tuple[str, int], event: Event) -> None:
        self._report(_RECOUNTS).recounts.append((ref, event))

    def resolve(self, key: ConditionKey, message: str, cures: frozenset[str] | None = None) -> None:
        self._report(_RESOLVED).resolved.append(Resolution(key, message, cures))

    def kernel_lines(self, now: float, texts: list[str]) -> None:
        if texts:  # a quiet tick's empty batch is no report (the hub would wake for nothing)
            self._report(_LINES).lines += [(now, text) for text in texts]

    def engines(self, views: list[EngineView], samples: dict[str, dict], whole: bool) -> None:
        """Several engines' polls in one loop step make one report; a whole set replaces what came before."""
        report = self._report(_LINES)
        if whole or report.engines is None:
            report.engines, report.samples, report.whole = list(views), dict(samples), whole or report.whole
        else:
            named = {v.name for v in views}
            report.engines = [v for v in report.engines if v.name not in named] + list(views)
            report.samples |= samples

    # its own metric handles: not through the hub

    def count(self, family: families.Family, *labels: str, by: float = 1) -> None:
        if by:
            self._metrics.inc(family, *labels, by=by)

    def metric(self, family: families.Family, value: float, *labels: str) -> None:
        self._metrics.set(family, value, *labels)

    def replace_series(self, family: families.Family, series: dict[tuple[str, ...], float]) -> None:
        self._metrics.replace(family, series)

    def polled(self, source: str) -> None:
        self._metrics.set(families.SOURCE_LAST_SUCCESS, time.time(), source)
