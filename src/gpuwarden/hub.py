"""The hub: where every component's events go (it is the `model.Sink`). Each event is stored first, then offered
to the incident bundles, alerted, counted, logged, and handed to the policy; the actuator carries out what the
policy returns. The hub decides nothing itself and never waits: the store keeps what it cannot write yet."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from gpuwarden import families, logsetup, policy, report
from gpuwarden.alert.alerter import Alerter
from gpuwarden.exporter import SelfMetrics
from gpuwarden.gpu.recorder import FlightRecorder
from gpuwarden.model import Event, Severity
from gpuwarden.store import QueuedStore, Store

log = logging.getLogger("gpuwarden")

_LOG_LEVEL = {Severity.INFO: logging.INFO, Severity.WARNING: logging.WARNING, Severity.CRITICAL: logging.ERROR}


class Hub:
    def __init__(self, metrics: SelfMetrics, recorder: FlightRecorder, situation: Callable[[], policy.Situation],
                 act: Callable[[policy.Action, Event], None], incidents_dir: Path, hostname: str) -> None:
        """`situation`: what the policy needs besides the event (engine views, GPUs seen, now), read afresh
        for each event; `act`: the actuator, which carries out each action the policy returns."""
        self.metrics, self.recorder, self.situation, self.act = metrics, recorder, situation, act
        self.hostname = hostname
        self.store: Store | QueuedStore | None = None  # set by the daemon once the loop runs
        self.alerter: Alerter | None = None
        self.engine_samples: Callable[[], dict[str, dict]] = dict
        self.recent_lines: deque[tuple[float, str]] = deque(maxlen=report.KERNEL_LINES)
        self.incidents = report.Incidents(incidents_dir, self._incident)

    # --- model.Sink -------------------------------------------------------------------------------

    def record(self, events: list[Event], cursor: tuple[str, str] | None = None) -> list[int]:
        """Store the events (and the cursor of the source that read them), then offer, alert, count, log and
        act on them. The store never refuses and never waits: what it cannot write yet it keeps and retries."""
        ids = self.store.add_events(events, cursor)
        for event, event_id in zip(events, ids, strict=True):
            if event.live:  # history beside today's telemetry would mislead: it is alerted, not bundled
                self.incidents.offer(event, event_id)
        if self.alerter and events:
            self.alerter.submit(events, ids)
        for event in events:
            # apart: an alerting rule on the live counter must not fire for an earlier boot's fault at a start
            counter = families.EVENTS if event.live else families.HISTORY_EVENTS
            self.metrics.inc(counter, event.kind, str(event.severity), by=event.count)
            log.log(_LOG_LEVEL[event.severity], "%s %s: %s", event.severity, event.kind, event.message,
                    extra=logsetup.event_fields(event.kind, event.gpu, event.engine))
            for action in policy.decide(event, self.situation()):
                self.act(action, event)
        return ids

    def set_count(self, row_id: int, event: Event) -> None:
        """A stored event's storm closed at `event.count` lines."""
        self.store.set_count(row_id, event.count)
        if self.alerter:
            self.alerter.repeated(event)

    def resolve(self, dedupe_key: str, message: str) -> None:
        if self.alerter:
            self.alerter.resolve(dedupe_key, message)

    def count(self, family: families.Family, *labels: str, by: float = 1) -> None:
        if by:
            self.metrics.inc(family, *labels, by=by)

    def metric(self, family: families.Family, value: float, *labels: str) -> None:
        self.metrics.set(family, value, *labels)

    def replace_series(self, family: families.Family, series: dict[tuple[str, ...], float]) -> None:
        self.metrics.replace(family, series)

    def polled(self, source: str) -> None:
        self.metrics.set(families.SOURCE_LAST_SUCCESS, time.time(), source)

    def kernel_lines(self, now: float, texts: list[str]) -> None:
        self.recent_lines.extend((now, text) for text in texts)

    # --- incident bundles -------------------------------------------------------------------------

    def _incident(self, trigger: Event, trigger_id: int, opened: float) -> dict:
        """An incident bundle's content, gathered now (on the loop: the recorder and the lines live here)."""
        since = opened - report.BEFORE
        events = self.store.events(since=since)
        telemetry = {gpu: self.recorder.history(gpu) for gpu in self.recorder.latest()}
        lines = [line for line in self.recent_lines if line[0] >= since]
        return report.bundle(report.row(trigger, trigger_id), events, lines, telemetry, self.engine_samples(),
                             self.hostname)
