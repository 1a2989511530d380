"""The incidents component of the hub: which incident each event opens or joins (core/incidents.py, pure, decides),
each incident saved as it changes, and its bundle gathered from the hub's Evidence and written off the loop
(store/bundles.py writes the files). It lives in hub/ beside the Evidence it asks, so nothing below the hub calls
up into it (tests/integration/test_upward_calls.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwarden.core import incidents
from gpuwarden.core.conditions import Change, Key
from gpuwarden.core.model import Event
from gpuwarden.runtime.offloop import OffLoop
from gpuwarden.store import bundles

if TYPE_CHECKING:
    from gpuwarden.hub.hub import Evidence

log = logging.getLogger(__name__)
_WRITES = OffLoop("incident write", limit=4)  # one per bundle: a hung disk holds these, never a kill's
_WRITE_DEADLINE = 60.0

SETTLE = 2.0  # the first write waits this long, so the lines that follow the trigger are in it
WINDOW = 60.0  # the incident stays open this long: critical events join it, and it is written again at the end


class IncidentTracker:
    """The incidents component: groups live events into incidents (core/incidents.py decides), names each member
    event's incident, has the hub's Evidence save each incident as it changes, and writes its bundle after SETTLE,
    once more when WINDOW has passed, and a last time when it closes, each time followed by a fresh picture.
    Incidents loaded at a start close on the condition changes (or the events) that come; their bundles are not
    written again. `folders`: what the alerter reads of them (store/bundles.Folders), kept current here."""

    def __init__(self, folders: bundles.Folders, evidence: Evidence, settle: float = SETTLE, window: float = WINDOW,
                 keep: int = bundles.KEEP) -> None:
        self.folders, self.folder, self.evidence = folders, folders.folder, evidence
        self.settle, self.window, self.keep = settle, window, keep
        self.open = folders.open  # the open incidents: the alerts ask whether one still is
        self._trigger: dict[str, tuple[Event, int | None]] = {}
        self._closed: dict[str, asyncio.Event] = {}
        self._latest: dict[str, incidents.Incident] = {}  # each followed incident as it is now, closed or not
        self._tasks: set[asyncio.Task] = set()

    def load(self, rows: list[dict[str, Any]], open_keys: list[Key], now: float) -> None:
        """A daemon's start: the stored incidents still open go on (a lost GPU's, until it is back)."""
        for row in rows:
            incident = incidents.settle(incidents.from_row(row, open_keys), [], now, self.window)
            if incident.closed is None:
                self.open[incident.id] = incident
            self.evidence.save(incident.row(), self.open.values())

    def offer(self, event: Event, raised: list[Key], decisions: list[dict[str, Any]],
              engine_gpus: dict[str, frozenset[str] | None]) -> str | None:
        """The id of the incident the event opens or joins, or None."""
        current = incidents.joins(self.open.values(), event, engine_gpus)
        new_id = ""
        if current is None and incidents.opens(event):  # a look at the folder, only for a new one
            new_id = bundles.unique(self.folder / bundles.folder_name(event), taken=self.open.keys()).name
        incident = incidents.offer(current, event, raised, decisions, new_id, time.time())
        if incident is None:
            return None
        before = self.open.get(incident.id)
        if before is None:
            self._trigger[incident.id] = (event, None)
            self._closed[incident.id] = asyncio.Event()
            task = asyncio.get_running_loop().create_task(self._follow(incident.id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self.open[incident.id] = self._latest[incident.id] = incident
        if incidents.grew(before, incident):  # not for each line of a storm
            self.evidence.save(incident.row(), self.open.values())
        return incident.id

    def stored(self, event_id: int, incident_id: str) -> None:
        """An event of the incident got its id (its alert finds the incident's folder)."""
        self.folders.by_event[event_id] = incident_id
        trigger, known = self._trigger.get(incident_id, (None, 0))
        if trigger is not None and known is None:
            self._trigger[incident_id] = (trigger, event_id)

    def changed(self, changes: list[Change], now: float) -> None:
        """Condition changes, or only time passing (no changes): incidents may close."""
        for incident_id, incident in list(self.open.items()):
            settled = incidents.settle(incident, changes, now, self.window)
            if settled == incident:
                continue
            if incident_id in self._latest:
                self._latest[incident_id] = settled
            if settled.closed is None:
                self.open[incident_id] = settled
            else:
                del self.open[incident_id]
                by_event = self.folders.by_event
                for event_id in [i for i, p in by_event.items() if p == incident_id]:
                    del by_event[event_id]
                if closed := self._closed.get(incident_id):
                    closed.set()
            self.evidence.save(settled.row(), self.open.values())

    async def _follow(self, incident_id: str) -> None:
        path, closed = self.folder / incident_id, self._closed[incident_id]
        opened = time.time()
        await asyncio.sleep(self.settle)
        await self._write_bundle(path, incident_id, opened)
        await asyncio.sleep(self.window - self.settle)
        await self._write_bundle(path, incident_id, opened)
        while not closed.is_set():
            try:
                await asyncio.wait_for(closed.wait(), self.window)
            except TimeoutError:
                self.changed([], time.time())  # quiet long enough, or past its bound
        await self._write_bundle(path, incident_id, opened)  # how it ended
        for followed in (self._trigger, self._closed, self._latest):
            followed.pop(incident_id, None)

    async def _write_bundle(self, path: Path, incident_id: str, opened: float) -> None:
        trigger, trigger_id = self._trigger[incident_id]
        try:
            content = self.evidence.gather(trigger, trigger_id or 0, opened)
            content["incident"] = self._latest[incident_id].row()
            await _WRITES.run(path.name, _WRITE_DEADLINE, bundles.write, path, content, self.keep)
        except Exception:
            log.exception("incident report %s could not be written", path)

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
