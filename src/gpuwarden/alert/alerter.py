"""The alerts component: events in, messages into the durable outbox, delivery through each target's channel
(alert/channel.py: apprise, Alertmanager).

An outbox row is handed to the store before it is attempted and deleted only after the channel reports success
for its target; a failure the channel calls worth a retry retries with exponential backoff and jitter until
`give_up_after`, one it calls final (a refusal) is dropped as undeliverable at once. Each target gets
its rows strictly in order. The outbox lives in memory while the daemon runs (loaded from the store at start),
so alerts go out even while the store cannot be written. Events that the daemon stored but never handed to
the alerter (it died first) are picked up again at start.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from gpuwarden.alert.channel import Alert, identities
from gpuwarden.alert.context import Context
from gpuwarden.alert.recent import Recent
from gpuwarden.alert.storm import Outgoing, StormControl
from gpuwarden.alert.targets import Target
from gpuwarden.config.settings import AlertsConfig
from gpuwarden.core import families
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.core.model import Event, Severity
from gpuwarden.runtime.offloop import Busy, OffLoop
from gpuwarden.store.bundles import picture
from gpuwarden.store.sqlite import OutboxRow, QueuedStore, Store, StoreError

log = logging.getLogger(__name__)

TONES = {Severity.INFO: "info", Severity.WARNING: "warning", Severity.CRITICAL: "failure"}  # apprise's names
_PICTURE_WAIT = 30.0  # an alert of an incident waits this long for its picture, then goes without it
_SKEW = 60.0  # an event's own time may precede the incident's opening (when gpuwarden saw it) by this much
_READS = OffLoop("alerts-resume", limit=1)  # the last run's alerts, read once at a start
_READ_DEADLINE = 30.0  # a hung disk: start afresh rather than never
# a stop while a send is under way waits this long for it (inside the daemon's stop grace, 3 s): a page the target
# took but this run never recorded is sent again at the next start, and the owner is paged twice for one thing
_SEND_AT_STOP = 2.0


class Alerter:
    name = "alerts"

    def __init__(self, config: AlertsConfig, targets: list[Target], store: Store | QueuedStore,
                 metrics: SelfMetrics, incident_for: Callable[[list[int]], Path | None] = lambda ids: None,
                 incidents_dir: Path | None = None, context: Callable[[], Context] | None = None,
                 incident_open: Callable[[str], bool] = lambda incident: True) -> None:
        """`incident_for`: the folder of the incident these events belong to while this process writes it (its
        picture is coming); `incidents_dir`: where the folder of an incident named in the events
        (`evidence["incident"]`) is; `context`: the host's GPUs and engines now; `incident_open`: whether an
        incident is still open (a channel that re-sends its alerts ends them once it is not)."""
        self.store, self.metrics, self.incident_for = store, metrics, incident_for
        self.incidents_dir, self.context = incidents_dir, context or (lambda: Context(self.config.hostname))
        self.incident_open = incident_open
        self.storm = StormControl()
        self.recent = Recent()  # what the status page shows of the recent past
        self._outbox: dict[str, deque[OutboxRow]] = {}  # target -> its rows, oldest first
        self._changed = asyncio.Event()  # something was offered: the next due time may be sooner
        self._recovered = False
        self._early: set[int] = set()  # ids submitted before the first run: this run's, not left by the last
        self.targets: list[Target] = []
        self.configure(config, targets)

    def configure(self, config: AlertsConfig, targets: list[Target]) -> None:
        """New settings and targets (a reload), keeping the storm state, what waits in the outbox and what a
        target's channel holds firing."""
        earlier = {t.name: t.channel for t in self.targets}
        for target in targets:
            if target.name in earlier:
                target.channel.carry(earlier[target.name])
        self.config, self.targets = config, targets
        self.storm.cooldown, self.storm.group_window = config.cooldown, config.group_window
        self._wake = {t.name: asyncio.Event() for t in targets}

    # --- from the daemon (synchronous, on the loop) -----------------------------------------------

    # `now`: the wall-clock time of the call (a recorded scenario replayed: tests/unit/test_golden_alerts.py)

    def submit(self, events: list[Event], ids: list[int], now: float | None = None) -> None:
        if not self._recovered:
            self._early.update(ids)
        now, suppressed = time.time() if now is None else now, []
        for event, event_id in zip(events, ids, strict=True):
            self.recent.event(event)
            if not self.storm.offer(event, event_id, now):
                suppressed.append(event_id)
                self.metrics.inc(families.ALERTS_SUPPRESSED, str(event.severity), by=event.count)
        self._changed.set()
        if suppressed:
            self.store.mark_alerted(suppressed)

    def repeated(self, event: Event, now: float | None = None) -> None:
        """A stored event's storm grew to `event.count` lines."""
        self.storm.repeated(event.dedupe_key, event.count - 1, time.time() if now is None else now)
        self._changed.set()
        self.metrics.inc(families.ALERTS_SUPPRESSED, str(event.severity), by=event.count - 1)

    def resolve(self, dedupe_key: str, message: str, now: float | None = None) -> None:
        """A condition its alert was about ended (the daemon recovers the alerter before anything can end, so
        that the page that told it began is the one that hears it end)."""
        now = time.time() if now is None else now
        out = self.storm.resolve(dedupe_key, message, now)
        if out:
            self._enqueue(out, now)

    # --- the component ------------------------------------------------------------------------------

    async def run(self) -> None:
        await self.recover()
        self._drop_orphans()
        self._export_pending()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._tick())
            for target in self.targets:
                tasks.create_task(self._deliver(target))

    async def recover(self) -> None:
        """What the last run left, taken up once, before this run sends or resolves anything: read off the loop
        (the storm state scans a week of events per open incident), then taken up here. Not read in time: this
        run starts afresh, said (its pages may then repeat the last run's)."""
        if self._recovered:
            return
        self._recovered = True
        try:
            last = await _READS.run("recover", _READ_DEADLINE, _LastRun.read, self.store, time.time(),
                                    self.storm.cooldown, self.config.give_up_after)
        except (TimeoutError, Busy, StoreError, sqlite3.Error) as exc:
            log.error("what the last run alerted was not read (%s): storm control starts afresh", exc)
            last = _LastRun([], [], [], [])
        self._take_up(last)

    def _take_up(self, last: _LastRun) -> None:
        self._resume_storms(last)
        waiting: dict[str, deque[OutboxRow]] = {}
        for row in last.outbox:
            waiting.setdefault(row.target, deque()).append(row)
        for name, rows in self._outbox.items():  # made before the first run: newer than what was stored
            known = {r.id for r in waiting.get(name, ())}
            waiting.setdefault(name, deque()).extend(r for r in rows if r.id not in known)
        self._outbox = waiting
        backlog = [(i, e) for i, e in last.unalerted
                   if i not in self._early]  # offering those again would count each as a repeat of itself
        self._early.clear()
        if backlog:
            log.info("alerting %d event(s) stored before the last stop but never alerted", len(backlog))
        now = time.time()
        for event_id, event in backlog:
            if not self.storm.offer(event, event_id, now):
                self.store.mark_alerted([event_id])

    def _resume_storms(self, last: _LastRun) -> None:
        """The storm state of the last run, derived from what it stored (no file of its own): the incidents
        still open with what was alerted of them, and the keys alerted within their cooldown. A channel that
        re-sends what is firing (Alertmanager) holds each open incident's alerts again, as its page said them."""
        for incident, sent in last.incidents:
            self.storm.resume(incident, sent)
            if sent:
                self._resume_firing(incident, sent)
        self.storm.resume(None, last.recent)

    def _resume_firing(self, incident: str, sent: list[Event]) -> None:
        from gpuwarden.alert.messages import compose  # as in _enqueue

        out = Outgoing(f"incident {incident}", sent, severity=max(e.severity for e in sent), incident=incident)
        message = compose(out, self.context(), "gw-resumed", self.incidents_dir and str(self.incidents_dir / incident))
        alert = Alert(message.title, message.body, message.text, TONES[message.severity], False,
                      identities=identities(sent, self.config.hostname, incident))
        for target in self.targets:
            if target.wants(message.severity, message.tags):
                target.channel.resume(alert)

    def _drop_orphans(self) -> None:
        configured = {t.name for t in self.targets}
        for name in set(self._outbox) - configured:
            for row in self._outbox.pop(name):
                log.error("alert %s for target %s is undeliverable: the target is no longer configured",
                          row.alert_id, name)
                self.metrics.inc(families.ALERTS_UNDELIVERABLE, name, row.severity)
                self.store.delivered(row.id)

    async def _tick(self) -> None:
        """Send what is due, then sleep until the storm control's next due time or a new event: no wake-ups while
        nothing happens (the outbox's counts for the exporter are set as it changes)."""
        while True:
            self.due(time.time())
            due = self.storm.next_due()
            self._changed.clear()
            await _woken(self._changed, None if due is None else max(due - time.time(), 0.0) + 0.01)

    def due(self, now: float) -> None:
        """Make the messages whose time has come (closed groups, storms' follow-ups) and queue them."""
        for out in self.storm.due(now):
            self._enqueue(out, now)

    def _enqueue(self, out, now: float) -> None:
        # here, with the first alert: composing one loads its texts' modules (1.5 ms of every start otherwise)
        from gpuwarden.alert.messages import compose

        drawn = None if out.resolved else self.incident_for(out.event_ids)  # an incident this process writes now
        incident = self.incidents_dir / out.incident if out.incident and self.incidents_dir else drawn
        message = compose(out, self.context(), f"gw-{os.urandom(6).hex()}", incident and str(incident))
        wanted = [t.name for t in self.targets if t.wants(message.severity, message.tags)]
        # the message's own tone: a follow-up "restarting" is a warning even where its incident paged as critical
        tone = "success" if message.resolved else TONES[
            max((e.severity for e in out.events), default=message.severity)]
        # the first page of an incident this process is writing waits for its picture; a follow-up, or an alert
        # of an incident from before a restart (whose picture may never come), takes the one there, if any
        fresh = drawn is not None and not out.follow_up
        about = [*out.earlier, *out.events] + ([out.about] if out.about else [])  # the alerts it fires or ends
        payload = {"title": message.title, "body": message.body, "text": message.text, "resolved": message.resolved,
                   "notify": tone, "incident": incident and str(incident), "picture_wait": fresh,
                   "identities": identities(about, self.config.hostname, out.incident)}
        ids = self.store.enqueue_alert(message.alert_id, str(message.severity), payload, wanted, out.event_ids, now)
        for name, row_id in zip(wanted, ids, strict=True):
            self._outbox.setdefault(name, deque()).append(
                OutboxRow(row_id, message.alert_id, name, now, 0, now, str(message.severity), payload))
        self._export_pending()
        log.info("alert %s: %s -> %s", message.alert_id, message.title, ", ".join(wanted) or "no target")
        self.recent.paged(out.incident, message.alert_id, message.title, list(message.steps), message.resolved,
                          bool(wanted), now)
        for name in wanted:
            self._wake[name].set()

    def pending(self) -> dict[str, int]:
        """What waits in the outbox, per target."""
        return {name: len(rows) for name, rows in self._outbox.items()}

    def _export_pending(self) -> None:
        """The outbox's rows per target and severity, for the exporter: set whenever the outbox changes (all the
        series at once: a target a reload removed has none)."""
        self.metrics.replace(families.ALERTS_PENDING, {
            (target.name, str(severity)): sum(r.severity == str(severity) for r in self._outbox.get(target.name, ()))
            for target in self.targets for severity in Severity})

    async def _deliver(self, target: Target) -> None:
        wake = self._wake[target.name]
        while True:
            rows = self._outbox.setdefault(target.name, deque())
            row = rows[0] if rows else None
            now = time.time()
            if row is None or row.next_attempt > now:
                await self._refresh(target)  # between two rows: never ahead of an all-clear still queued
                wake.clear()
                timeout = 1.0 if row is None else min(row.next_attempt - now, 1.0)
                await _woken(wake, timeout)
                continue
            if now - row.created > self.config.give_up_after:
                log.error("alert %s to %s undeliverable after %d attempts: giving up", row.alert_id,
                          target.name, row.attempts)
                self.recent.failed(target.name, "undeliverable: gave up", now, True)
                self.metrics.inc(families.ALERTS_UNDELIVERABLE, target.name, row.severity)
                self._done(rows, row)
                continue
            sending = asyncio.ensure_future(self._send(target, row))
            try:
                retry, error = await asyncio.shield(sending)
            except asyncio.CancelledError:
                await self._send_stopped(sending, rows, row)
                raise
            if error is None:
                self._done(rows, row)
                self.metrics.inc(families.ALERTS_SENT, target.name, row.severity)
                self.recent.delivered(target.name, row.alert_id, row.payload["title"], time.time())
            elif not retry:
                self.recent.failed(target.name, error, time.time(), True)
                log.error("alert %s to %s refused (%s): undeliverable", row.alert_id, target.name, error)
                self.metrics.inc(families.ALERTS_UNDELIVERABLE, target.name, row.severity)
                self._done(rows, row)
            else:
                delay = min(self.config.retry_max, self.config.retry_initial * 2 ** row.attempts)
                # ±20 % jitter from os.urandom: `random` is not imported for it (nor on the loop, at a retry)
                delay *= 0.8 + 0.4 * os.urandom(1)[0] / 255
                retry_at = time.time() + delay  # from the end of this attempt: a slow send is no retry
                if rows and rows[0].id == row.id:
                    rows[0] = row._replace(attempts=row.attempts + 1, next_attempt=retry_at)
                self.store.retry_later(row.id, retry_at)
                self.metrics.inc(families.ALERTS_FAILED, target.name, row.severity)
                self.recent.failed(target.name, error, time.time(), False)
                log.warning("alert %s to %s failed (%s); retrying in %.1f s", row.alert_id, target.name, error,
                            delay)

    async def _send_stopped(self, sending: asyncio.Future, rows: deque[OutboxRow], row: OutboxRow) -> None:
        """The component is stopping while `row` is being sent: what the send did, if it ends within
        _SEND_AT_STOP, is recorded (a delivered page is not sent again at the next start); else it stays in the
        outbox, sent at the next start."""
        await asyncio.wait({sending}, timeout=_SEND_AT_STOP)
        if not sending.done():
            sending.cancel()
        elif not sending.cancelled() and sending.exception() is None and sending.result()[1] is None:
            self._done(rows, row)

    async def _refresh(self, target: Target) -> None:
        """What the target's channel holds firing, sent again when due (Alertmanager forgets it otherwise)."""
        _, error = await target.channel.refresh(self.config.send_timeout, self.incident_open)
        if error is not None:  # tried again at the next interval, as a whole
            log.warning("re-sending the firing alerts to %s failed (%s); trying again in %.0f s", target.name,
                        error, self.config.alertmanager_resend)

    def _done(self, rows: deque[OutboxRow], row: OutboxRow) -> None:
        if rows and rows[0].id == row.id:
            rows.popleft()
        self.store.delivered(row.id)
        self._export_pending()

    async def _send(self, target: Target, row: OutboxRow) -> tuple[bool, str | None]:
        """The channel's (retry, error); the error never holds the URL (it holds secrets)."""
        folder, payload = row.payload.get("incident"), row.payload
        attach = None
        if folder and target.channel.takes_pictures:
            wait = _PICTURE_WAIT if payload.get("picture_wait", True) else 0.0
            attach = await self._picture(Path(folder), row.created, wait)
        tone = payload.get("notify") or ("success" if payload["resolved"] else TONES[Severity.parse(row.severity)])
        alert = Alert(payload["title"], payload["body"], payload.get("text", payload["body"]), tone,
                      payload["resolved"], attach, payload.get("identities", []))
        return await target.channel.notify(alert, self.config.send_timeout)

    @staticmethod
    async def _picture(folder: Path, created: float, wait: float) -> str | None:
        """The incident's timeline.svg, waiting for it up to `wait` seconds after the alert was made."""
        while (found := picture(folder)) is None and time.time() - created < wait:
            await asyncio.sleep(0.25)
        return str(found) if found else None


class _LastRun(NamedTuple):
    """What the last run stored that this run's alerter takes up."""

    incidents: list[tuple[str, list[Event]]]  # each open incident and what was alerted of it, oldest first
    recent: list[Event]  # alerted within the cooldown, of no incident
    outbox: list[OutboxRow]
    unalerted: list[tuple[int, Event]]  # stored but never alerted (it stopped first), within give_up_after

    @classmethod
    def read(cls, store: Store | QueuedStore, now: float, cooldown: float, give_up_after: float) -> _LastRun:
        """Off the loop: store reads only."""
        opened = [(row["id"], store.alerted_events(row["opened"] - _SKEW, row["id"]))
                  for row in store.incidents(open_only=True)]
        return cls(opened, store.alerted_events(now - cooldown, None), store.outbox(),
                   store.unalerted_events(since=now - give_up_after))


async def _woken(event: asyncio.Event, timeout: float | None) -> None:
    """Until `event` is set or `timeout` passes (None: no timeout). Not wait_for: on Python 3.11 a cancellation
    that arrives as the event is set is swallowed, and the component would not stop (seen when an alert came in
    with SIGTERM)."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        pass
