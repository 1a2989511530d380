"""The hub: where every component's events go (it is the `model.Sink`). For each event the pure policy decides
first, and the decision with its reasons goes into the event; the pure conditions and incidents say what it
raised, resolved and which incident it belongs to; then it is stored, alerted, counted, logged, and the
actuator carries out what the policy decided. The hub decides nothing itself and never waits: the store keeps
what it cannot write yet."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gpuwarden import conditions, families, incidents, logsetup, policy, report
from gpuwarden.alert.alerter import Alerter
from gpuwarden.exporter import SelfMetrics
from gpuwarden.gpu.recorder import FlightRecorder
from gpuwarden.model import Event, Severity
from gpuwarden.store import QueuedStore, Store

log = logging.getLogger("gpuwarden")

_LOG_LEVEL = {Severity.INFO: logging.INFO, Severity.WARNING: logging.WARNING, Severity.CRITICAL: logging.ERROR}


class Hub:
    def __init__(self, metrics: SelfMetrics, recorder: FlightRecorder, situation: Callable[[], policy.Situation],
                 act: Callable[[policy.Action, Event], None], incidents_dir: Path, hostname: str,
                 incidents_keep: int = report.KEEP) -> None:
        """`situation`: what the policy needs besides the event (engine views, GPUs seen, now), read afresh
        for each batch; `act`: the actuator, which carries out each action the policy returns."""
        self.metrics, self.recorder, self.situation, self.act = metrics, recorder, situation, act
        self.hostname = hostname
        self.store: Store | QueuedStore | None = None  # set by the daemon once the loop runs
        self.alerter: Alerter | None = None
        self.engine_samples: Callable[[], dict[str, dict]] = dict
        self.recent_lines: deque[tuple[float, str]] = deque(maxlen=report.KERNEL_LINES)
        self.incidents = report.Incidents(incidents_dir, self._incident, self._save_incident, keep=incidents_keep)
        self.conditions: conditions.State = {}

    def load(self, now: float) -> None:
        """At start: the conditions and incidents the store holds open (a lost GPU stays lost across a restart)."""
        stored = {c.key: c for c in self.store.open_conditions()}
        self.conditions, ended = conditions.restarted(stored, now)
        self.incidents.load(self.store.incidents(open_only=True), list(self.conditions), now)
        self._changed(ended, now)
        self._export_conditions()

    def unwatched(self, engines: set[str]) -> None:
        """A reload stopped watching these engines: their conditions end."""
        now = time.time()
        self.conditions, changes = conditions.unwatched(self.conditions, engines, now)
        self._changed(changes, now)

    # --- model.Sink -------------------------------------------------------------------------------

    def record(self, events: list[Event], cursor: tuple[str, str] | None = None) -> list[int]:
        """Decide first (the decision and its reason go into the stored event), then change the conditions,
        join the incidents, store (with the source's cursor), alert, export, log, and act. The store never
        refuses and never waits: what it cannot write yet it keeps and retries."""
        situation = self.situation()
        engine_gpus = {view.name: view.gpus for view in situation.engines}
        decided, changes = [], []
        for event in events:
            actions = policy.decide(event, situation)
            self.conditions, changed = conditions.apply(self.conditions, event)
            decision = [policy.record_of(a) for a in actions]
            evidence = {**event.evidence, incidents.DECISION: decision}
            raised = [c.key for c in changed if c.raised]
            event = Event(event.kind, conditions.impact(event), event.message, event.time, event.gpu, event.engine,
                          evidence, event.count)
            if incident := self.incidents.offer(event, raised, decision, engine_gpus):
                evidence[incidents.INCIDENT] = incident  # the event's own dict: stored with it
            decided.append((event, actions, changed, incident))
            changes += changed
        events = [e for e, *_ in decided]
        ids = self.store.add_events(events, cursor)
        for (_, _, changed, incident), event_id in zip(decided, ids, strict=True):
            if incident:
                self.incidents.stored(event_id, incident)
            self.conditions = conditions.with_event_id(self.conditions, changed, event_id)
        self._changed(changes, time.time())
        if self.alerter and events:
            self.alerter.submit(events, ids)
        for event, actions, _, _ in decided:
            # apart: an alerting rule on the live counter must not fire for an earlier boot's fault at a start
            counter = families.EVENTS if event.live else families.HISTORY_EVENTS
            self.metrics.inc(counter, event.kind, str(event.severity), by=event.count)
            log.log(_LOG_LEVEL[event.severity], "%s %s: %s", event.severity, event.kind, event.message,
                    extra=logsetup.event_fields(event.kind, event.gpu, event.engine))
            for action in actions:
                self.act(action, event)
        return ids

    def set_count(self, row_id: int, event: Event) -> None:
        """A stored event's storm closed at `event.count` lines."""
        self.store.set_count(row_id, event.count)
        if self.alerter:
            self.alerter.repeated(event)

    def resolve(self, key: conditions.Key, message: str, cures: frozenset[str] | None = None) -> None:
        now = time.time()
        self.conditions, changes = conditions.resolve(self.conditions, key, message, now, cures)
        self._changed(changes, now)

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

    # --- conditions -------------------------------------------------------------------------------

    def _changed(self, changes: list[conditions.Change], now: float) -> None:
        """Each change a stored row (raises with their event's id), the gauges, the incidents, the log; an
        alert ends with its condition unless an event ended it (that event is alerted itself)."""
        self.incidents.changed(changes, now)
        if not changes:
            return
        self.store.add_changes([replace(c, condition=self.conditions.get(c.key, c.condition)) if c.raised else c
                                for c in changes])  # a raise with its event's id, known by now
        self._export_conditions()
        for change in changes:
            key, condition = change.key, change.condition
            if not change.raised:
                log.info("%s resolved: %s", key, change.message,
                         extra=logsetup.event_fields(str(key.kind), condition.gpu, condition.engine))
                if self.alerter and not change.by_event:
                    for alert_key in sorted(condition.alert_keys):
                        self.alerter.resolve(alert_key, change.message)
            if key.kind == conditions.Kind.ENGINE_STALLED and not change.raised:
                self.metrics.set(families.ENGINE_STALLED, 0, key.subject)
            elif key.kind == conditions.Kind.ENGINE_DOWN and change.raised:
                # a dead engine runs nothing: its last figures must not stand for it
                for family in (families.ENGINE_REQUESTS_RUNNING, families.ENGINE_REQUESTS_WAITING):
                    self.metrics.forget(family, key.subject)

    def _export_conditions(self) -> None:
        self.metrics.replace(families.CONDITION, conditions.series(self.conditions))

    # --- incident bundles -------------------------------------------------------------------------

    def _save_incident(self, row: dict) -> None:
        """An incident opened, changed or closed: stored, and the gauge of the open ones (one alert each)."""
        self.store.save_incident(row)
        self.metrics.replace(families.INCIDENT, {
            (i.id, i.kind, ",".join(sorted(i.gpus)), ",".join(sorted(i.engines))): 1.0
            for i in self.incidents.open.values()})

    def _incident(self, trigger: Event, trigger_id: int, opened: float) -> dict:
        """An incident bundle's content, gathered now (on the loop: the recorder and the lines live here)."""
        since = opened - report.BEFORE
        events = self.store.events(since=since)
        telemetry = {gpu: self.recorder.history(gpu) for gpu in self.recorder.latest()}
        lines = [line for line in self.recent_lines if line[0] >= since]
        content = report.bundle(report.row(trigger, trigger_id), events, lines, telemetry, self.engine_samples(),
                                self.hostname)
        content["conditions"] = self.store.condition_changes(since)  # what was wrong, and when it ended
        return content
