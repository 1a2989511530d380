"""The hub: the one consumer of the one queue every component reports on (reports.py). A report's events go through its
stages, declared in order as one list (`Hub.stages`, after Alertmanager's notify.Stage: each a small object with one
method, `run`, over the report's `Batch`): Decide, Conditions, Incidents, Record, Alert, Act. For each event the
pure policy decides first, and the decision with its reasons goes into the event; the pure conditions and incidents
say what it raised, resolved and which incident it belongs to; then it is stored, counted, logged, alerted, and the
actuator carries out what the policy decided (its outcomes come back on the queue). The engine watch is told each
event of an engine that nothing will be done about (`learn`): a kill's outcome is how the lifecycle of a stalled
engine learns the kill, a stall decided without one that no outcome will come. The hub decides nothing itself and
never waits: the store keeps what it cannot write yet."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Protocol

from gpuwarden.act.actuator import Actuator
from gpuwarden.alert.alerter import Alerter
from gpuwarden.alert.host import AlertContext
from gpuwarden.core import conditions, families, incidents, policy
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.core.model import HISTORY, LOGGED_AT, Event, Severity
from gpuwarden.gpu import recovery
from gpuwarden.gpu.inventory import GpuInventory
from gpuwarden.gpu.recorder import FlightRecorder
from gpuwarden.hub.queue import Report
from gpuwarden.hub.tracker import IncidentTracker
from gpuwarden.runtime import logsetup
from gpuwarden.store import bundles as report
from gpuwarden.store.sqlite import QueuedStore, Store

log = logging.getLogger("gpuwarden")

_ROWS_KEPT = 10_000  # reported events whose row a later storm count may name
_ENGINE_POINTS = 1200  # an engine's scrapes kept for its incident's picture (at 0.5 s: 5 minutes before, 5 after)
_LOG_LEVEL = {Severity.INFO: logging.INFO, Severity.WARNING: logging.WARNING, Severity.CRITICAL: logging.ERROR}


class Learns(Protocol):
    """What the hub tells the engine watch (engine/watch.py's EngineWatch): each of an engine's events with what
    was decided on it (the actions' outcomes among them)."""

    def learn(self, event: Event) -> None: ...


class Evidence:
    """What the hub was told of the host, for the policy, incident bundles and alerts (read on the loop): the
    recent kernel lines, the engines as the engine watch last reported them (views, last scrapes), with the
    recorder's telemetry; and where an incident is saved."""

    def __init__(self, store: Store | QueuedStore, recorder: FlightRecorder, metrics: SelfMetrics,
                 hostname: str, views: list[policy.EngineView] | None = None,
                 alert_context: AlertContext | None = None) -> None:
        """`views`: the configured engines before the engine watch's first report (a fault may come first);
        `alert_context`: told the engines each time they change (what an alert names, given, not fetched)."""
        self.store, self.recorder, self.metrics, self.hostname = store, recorder, metrics, hostname
        self.alert_context = alert_context
        self.lines: deque[tuple[float, str]] = deque(maxlen=report.KERNEL_LINES)
        self.views: dict[str, policy.EngineView] = {v.name: v for v in views or []}
        if alert_context:
            alert_context.engines(self.views.values())
        self.samples: dict[str, dict] = {}
        self.history: dict[str, deque[dict]] = {}  # each engine's recent scrapes: its incident's picture

    def engines(self, views: list[policy.EngineView], samples: dict[str, dict], whole: bool) -> None:
        """The engines the watch looked at (each poll reports its own); a whole set replaces every one."""
        if whole:
            self.views, self.samples = {}, {}
        self.views.update((v.name, v) for v in views)
        self.samples.update(samples)
        if self.alert_context:
            self.alert_context.engines(self.views.values())
        now = time.time()
        for name, sample in samples.items():
            self.history.setdefault(name, deque(maxlen=_ENGINE_POINTS)).append(
                {"time": now, "state": "ok" if sample else "no answer",
                 **{k: (sample or {}).get(k) for k in ("running", "waiting", "generated", "progress")}})
        for name in set(self.history) - {*self.views, *self.samples}:
            del self.history[name]  # an engine no longer watched

    def save(self, row: dict, open_incidents: Iterable[incidents.Incident]) -> None:
        """An incident opened, changed or closed: stored, and the gauge of the open ones (one alert each)."""
        self.store.save_incident(row)
        self.metrics.replace(families.INCIDENT, {
            (i.id, i.kind, ",".join(sorted(i.gpus)), ",".join(sorted(i.engines))): 1.0 for i in open_incidents})

    def gather(self, trigger: Event, trigger_id: int, opened: float) -> dict:
        """An incident bundle's content, gathered now (on the loop: the recorder and the lines live here). The
        telemetry is a copy of the flight recorder, its samples rebuilt where the bundle is written, off the loop
        (8 GPUs' full window: ~50 ms)."""
        since = opened - report.BEFORE
        events = self.store.events(since=since)
        lines = [line for line in self.lines if line[0] >= since]
        content = report.bundle(report.row(trigger, trigger_id), events, lines, {}, self.samples, self.hostname)
        recorded = self.recorder.frozen()
        content["telemetry"] = lambda: report.points({gpu: recorded.history(gpu) for gpu in recorded.latest()})
        content["conditions"] = self.store.condition_changes(since)  # what was wrong, and when it ended
        content["engine_history"] = {name: [p for p in points if p["time"] >= since]
                                     for name, points in self.history.items()}
        return content


@dataclass(eq=False, repr=False)  # nothing compares or prints one (tests/unit/test_footprint.py)
class Batch:
    """One report's events as the stages carry them: each stage reads what the ones before it wrote. Each list is
    the events' own, in their order; `conditions` is the hub's state, in and out."""

    events: list[Event]
    refs: list[tuple[str, int]]
    cursor: tuple[str, str] | None
    situation: policy.Situation
    conditions: conditions.State
    act: bool
    actions: list[list[policy.Action]] = field(default_factory=list)
    decisions: list[list[dict]] = field(default_factory=list)
    changed: list[list[conditions.Change]] = field(default_factory=list)
    incidents: list[str | None] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)


class Decide:
    """The pure policy, first: what is to be done about each event, and the record of it the event carries."""

    def run(self, batch: Batch) -> None:
        batch.actions = [policy.decide(event, batch.situation) for event in batch.events]
        batch.decisions = [[policy.record_of(a) for a in actions] for actions in batch.actions]


class Conditions:
    """The pure conditions: what each event raises and resolves, and its impact; each event is made anew with
    its decision in its evidence."""

    def run(self, batch: Batch) -> None:
        for i, (event, decision) in enumerate(zip(batch.events, batch.decisions, strict=True)):
            batch.conditions, changed = conditions.apply(batch.conditions, event)
            batch.changed.append(changed)
            batch.events[i] = Event(event.kind, conditions.impact(event), event.message, event.time, event.gpu,
                                    event.engine, {**event.evidence, incidents.DECISION: decision}, event.count)


class Incidents:
    """Which incident each event opens or joins (the incidents component, its bundle written off the loop)."""

    def __init__(self, incidents: IncidentTracker) -> None:
        self.incidents = incidents

    def run(self, batch: Batch) -> None:
        engine_gpus = {view.name: view.gpus for view in batch.situation.engines}
        for event, changed, decision in zip(batch.events, batch.changed, batch.decisions, strict=True):
            raised = [c.key for c in changed if c.raised]
            if incident := self.incidents.offer(event, raised, decision, engine_gpus):
                event.evidence[incidents.INCIDENT] = incident  # the event's own dict: stored with it
            batch.incidents.append(incident)


class Changed:
    """The conditions' changes, wherever they come from (events, resolutions, a start, a reload): each a stored
    row (a raise with its event's id), the gauges, the incidents, the log; an alert ends with its condition
    unless an event ended it (that event is alerted itself)."""

    def __init__(self, store: Store | QueuedStore, incidents: IncidentTracker, alerter: Alerter | None,
                 metrics: SelfMetrics) -> None:
        self.store, self.incidents, self.alerter, self.metrics = store, incidents, alerter, metrics

    def run(self, state: conditions.State, changes: list[conditions.Change], now: float) -> None:
        self.incidents.changed(changes, now)
        if not changes:
            return
        self.store.add_changes([replace(c, condition=state.get(c.key, c.condition)) if c.raised else c
                                for c in changes])  # a raise with its event's id, known by now
        self.metrics.replace(families.CONDITION, conditions.series(state))
        for change in changes:
            key, condition = change.key, change.condition
            if not change.raised:
                log.info("%s resolved: %s", key, change.message,
                         extra=logsetup.event_fields(str(key.kind), condition.gpu, condition.engine))
                if self.alerter and change.tells and not change.by_event:
                    for alert_key in sorted(condition.alert_keys):
                        self.alerter.resolve(alert_key, change.message)
            if key.kind == conditions.Kind.ENGINE_STALLED and not change.raised:
                self.metrics.set(families.ENGINE_STALLED, 0, key.subject)
            elif key.kind == conditions.Kind.ENGINE_DOWN and change.raised:
                # a dead engine runs nothing and uses no CPU: 0, as the engine watch says while it restarts (not
                # absent: one would drop the series the other sets, and a query could not tell "none" from "not
                # known"); never the dead instance's last figure
                for family in (families.ENGINE_REQUESTS_RUNNING, families.ENGINE_REQUESTS_WAITING,
                               families.ENGINE_CPU):
                    self.metrics.set(family, 0, key.subject)


class Record:
    """Stored, with the source's cursor (the store never refuses and never waits: what it cannot write yet it
    keeps and retries); each stored row told to its incident and its raises; the changes stored; counted, logged."""

    def __init__(self, store: Store | QueuedStore, incidents: IncidentTracker, changed: Changed,
                 metrics: SelfMetrics) -> None:
        self.store, self.incidents, self.changed, self.metrics = store, incidents, changed, metrics
        self.rows: OrderedDict[tuple[str, int], int] = OrderedDict()  # an outbox's reference -> its stored row

    def run(self, batch: Batch) -> None:
        batch.ids = self.store.add_events(batch.events, batch.cursor)
        self._remember(batch.refs, batch.ids)
        for incident, changed, event_id in zip(batch.incidents, batch.changed, batch.ids, strict=True):
            if incident:
                self.incidents.stored(event_id, incident)
            batch.conditions = conditions.with_event_id(batch.conditions, changed, event_id)
        self.changed.run(batch.conditions, [c for changed in batch.changed for c in changed], time.time())
        for event in batch.events:
            # apart: an alerting rule on the live counter must not fire for an earlier boot's fault at a start
            counter = families.EVENTS if event.live else families.HISTORY_EVENTS
            self.metrics.inc(counter, event.kind, str(event.severity), by=event.count)
            # history says so in its line: a start on a host whose log holds old faults logs each of them, and
            # those lines must not read as faults happening now
            log.log(_LOG_LEVEL[event.severity], "%s %s: %s%s", event.severity, event.kind, event.message,
                    "" if event.live else f" (history: {_logged(event)}; no action)",
                    extra=logsetup.event_fields(event.kind, event.gpu, event.engine))

    def _remember(self, refs: list[tuple[str, int]], ids: list[int]) -> None:
        """Which row each reported event became, for a storm's final count reported later by its reference;
        the oldest are forgotten (a burst ends within its max_burst, long before)."""
        self.rows.update(zip(refs, ids, strict=False))
        while len(self.rows) > _ROWS_KEPT:
            self.rows.popitem(last=False)


def _logged(event: Event) -> str:
    """When a history event's line was logged, where the log said; else that it was before the start."""
    if (logged := event.evidence.get(LOGGED_AT)) is None:
        return event.evidence[HISTORY]
    return f"logged {datetime.fromtimestamp(logged).isoformat(sep=' ', timespec='seconds')}"


class Alert:
    """The events' pages: storm control and the alerter's outbox (delivery is the alerter's own task)."""

    def __init__(self, alerter: Alerter | None) -> None:
        self.alerter = alerter

    def run(self, batch: Batch) -> None:
        if self.alerter and batch.events:
            self.alerter.submit(batch.events, batch.ids)


class Act:
    """The actuator carries out what the policy decided (its outcomes come back on the queue); the engine watch
    is told each event of an engine that nothing will be done about here (the lifecycle awaits no outcome)."""

    def __init__(self, actuator: Actuator, engines: Learns | None) -> None:
        self.actuator, self.engines = actuator, engines

    def run(self, batch: Batch) -> None:
        if not batch.act:
            return
        for event, actions in zip(batch.events, batch.actions, strict=True):
            for action in actions:
                self.actuator.execute(action, event)
            if event.engine and self.engines and not any(isinstance(a, policy.Kill) for a in actions):
                self.engines.learn(event)


class Hub:
    def __init__(self, reports: asyncio.Queue[Report], store: Store | QueuedStore, alerter: Alerter | None,
                 actuator: Actuator, inventory: GpuInventory, incidents: IncidentTracker, evidence: Evidence,
                 metrics: SelfMetrics, dry_run: bool, engines: Learns | None = None) -> None:
        """`reports`: the one queue every component's outbox puts on; the hub is its only consumer. The
        situation the policy decides in is the hub's own: the engines as the engine watch last reported them,
        the GPUs seen (the inventory), `now` as each report is handled, and `dry_run` ([cache] dry_run, or
        on_crash_loop = "alert"; a reload passes the new one through `configure`); `evidence`: what incident
        bundles hold, fed here (kernel lines, engine scrapes); `engines`: the engine watch, told each event of an
        engine that no action follows, the actions' outcomes among them (a reload passes its new one)."""
        self.reports, self.store, self.alerter = reports, store, alerter
        self.inventory, self.incidents, self.evidence, self.metrics = inventory, incidents, evidence, metrics
        self.dry_run = dry_run
        self.conditions: conditions.State = {}
        self.changed = Changed(store, incidents, alerter, metrics)
        self.act = Act(actuator, engines)
        self.saved = Record(store, incidents, self.changed, metrics)
        # the event path, declared: each stage one object with one method, in this order (docs/architecture.md's
        # walks are checked against this list, tests/unit/test_architecture_doc.py)
        self.stages: tuple[Decide | Conditions | Incidents | Record | Alert | Act, ...] = (
            Decide(), Conditions(), Incidents(incidents), self.saved, Alert(alerter), self.act)

    def configure(self, hostname: str, dry_run: bool, incidents_keep: int, engines: Learns | None) -> None:
        """A reload's new settings and engine watch."""
        self.dry_run, self.evidence.hostname, self.incidents.keep = dry_run, hostname, incidents_keep
        self.act.engines = engines

    def load(self, now: float, engines: Iterable[str] = (), discovering: bool = False) -> None:
        """At start: the conditions and incidents the store holds open (a lost GPU stays lost across a restart,
        and a watched engine stays down, stalled or unresponsive until seen otherwise: `engines`, those
        watched). Those of an engine no longer configured end, and their pages hear it, as after a reload
        (`discovering`: the engines are found at run time, so nothing is said of one not found yet)."""
        stored = {c.key: c for c in self.store.open_conditions()}
        self.conditions, ended = conditions.restarted(stored, now, engines, discovering)
        self.incidents.load(self.store.incidents(open_only=True), list(self.conditions), now)
        self._changed(ended, now)
        self._export_conditions()

    def still_lost(self, until: float) -> list[recovery.Loss]:
        """The GPUs lost before `until` and not back: what the confirmation after a reboot checks."""
        return recovery.still_lost(self.conditions, self.incidents.open.values(), until)

    def unwatched(self, engines: set[str]) -> None:
        """A reload stopped watching these engines: their conditions end."""
        now = time.time()
        self.conditions, changes = conditions.unwatched(self.conditions, engines, now)
        self._changed(changes, now)

    # --- the one consumer of the queue -------------------------------------------------------------

    async def run(self) -> None:
        """Drain the queue for ever. Handling a report awaits nothing: one that fails is logged and the next
        goes on (a bug in one event must not stop every later fault)."""
        while True:
            self._handle_logged(await self.reports.get(), act=True)

    def drain(self) -> None:
        """At stop: what is still queued is stored, counted and logged, and not acted on (the loop ends)."""
        while not self.reports.empty():
            self._handle_logged(self.reports.get_nowait(), act=False)

    def _handle_logged(self, told: Report, act: bool) -> None:
        try:
            self.handle(told, time.monotonic(), act)
        except Exception:
            log.exception("the hub could not handle a report of %s", told.source)

    def handle(self, told: Report, now: float, act: bool = True) -> None:
        """One report, its parts in their order (reports.Report)."""
        self.evidence.lines.extend(told.lines)
        if told.engines is not None:
            self.evidence.engines(told.engines, told.samples or {}, told.whole)
        if told.events or told.cursor:
            self._record(told.events, told.refs, told.cursor, now, act)
        for ref, event in told.recounts:
            if (row := self.saved.rows.get(ref)) is not None:
                self.store.set_count(row, event.count)
                if self.alerter:
                    self.alerter.repeated(event)
        for resolution in told.resolved:
            wall = time.time()
            self.conditions, changes = conditions.resolve(self.conditions, resolution.key, resolution.message,
                                                          wall, resolution.cures)
            self._changed(changes, wall)

    def _record(self, events: list[Event], refs: list[tuple[str, int]], cursor: tuple[str, str] | None,
                now: float, act: bool) -> None:
        """The report's events through the stages, in their order (decide first: the decision and its reason go
        into the stored event)."""
        situation = policy.Situation(list(self.evidence.views.values()), frozenset(self.inventory.seen), now,
                                     self.dry_run)
        batch = Batch(list(events), refs, cursor, situation, self.conditions, act)
        try:
            for stage in self.stages:
                stage.run(batch)
        finally:
            self.conditions = batch.conditions  # what a stage changed stays, as before a failure the next report

    # --- conditions -------------------------------------------------------------------------------

    def _changed(self, changes: list[conditions.Change], now: float) -> None:
        self.changed.run(self.conditions, changes, now)

    def _export_conditions(self) -> None:
        self.metrics.replace(families.CONDITION, conditions.series(self.conditions))
