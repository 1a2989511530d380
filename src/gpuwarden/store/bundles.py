"""Incident reports: on a critical event, a folder `state_dir/incidents/<time>-<kind>/` with `incident.json`
(the event, the kernel lines around it, the flight recorder's telemetry per GPU, the engines' last metrics,
what gpuwarden did and how it went) and `timeline.svg`.

The bundle is pure (`bundle`), and so is its picture (`timeline.svg`, SVG text written directly: a few
milliseconds, no plotting library); `Incidents` is the daemon's edge that gathers and writes both, off the loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import stat
import time
import traceback
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuwarden.core import incidents
from gpuwarden.core.conditions import Change, Key
from gpuwarden.core.eventkinds import OUTCOMES
from gpuwarden.core.model import Event, GpuSample
from gpuwarden.runtime.offloop import OffLoop
from gpuwarden.store.sqlite import private_folder
from gpuwarden.store.timeline import svg

log = logging.getLogger(__name__)
_WRITES = OffLoop("incident write", limit=4)  # one per bundle: a hung disk holds these, never a kill's
_WRITE_DEADLINE = 60.0

BEFORE = 300.0  # seconds of events and kernel lines before the trigger that go into the bundle
SETTLE = 2.0  # the first write waits this long, so the lines that follow the trigger are in it
WINDOW = 60.0  # the incident stays open this long: critical events join it, and it is written again at the end
KERNEL_LINES = 2000  # the daemon keeps this many recent kernel lines for the bundles
PICTURE, BUNDLE, FAILED = "timeline.svg", "incident.json", "render-error.txt"
# In each bundle: its place in the order bundles were written, and the wall-clock time then. Pruning and the
# listing go by it: a folder's name is its trigger's wall-clock time, which a clock stepped back a day puts
# before every bundle written the day before (each new bundle then deleted the one before it).
ORDER = "order.json"
_TELEMETRY = ("power_watts", "sclk_hz", "busy_ratio", "state")
KEEP = 100  # bundles kept ([daemon] incidents_keep): one a minute, forever, would fill the state disk
_NAMED = re.compile(r"\d{8}-\d{6}-[a-z_]{1,64}(?:-\d{1,9})?")  # what folder_name and _unique make


def folder_name(event: Event) -> str:
    return f"{datetime.fromtimestamp(event.time).strftime('%Y%m%d-%H%M%S')}-{event.kind}"


def row(event: Event, event_id: int) -> dict[str, Any]:
    """An event as the store lists it."""
    return {"id": event_id, "time": event.time, "kind": event.kind, "severity": str(event.severity),
            "gpu": event.gpu, "engine": event.engine, "message": event.message, "evidence": event.evidence,
            "count": event.count}


def bundle(trigger: dict[str, Any], events: list[dict[str, Any]], kernel_lines: list[tuple[float, str]],
           telemetry: dict[str, list[GpuSample]], engines: dict[str, dict[str, Any]], host: str) -> dict[str, Any]:
    """incident.json's content. `events` are store rows (the trigger among them); times are epoch seconds."""
    return {
        "host": host,
        "trigger": trigger,
        "events": [e for e in events if e["kind"] not in OUTCOMES],
        "actions": [e for e in events if e["kind"] in OUTCOMES],
        "kernel_lines": [{"time": t, "line": text} for t, text in kernel_lines],
        "telemetry": points(telemetry),
        "engines": engines,
    }


def points(telemetry: dict[str, list[GpuSample]]) -> dict[str, list[dict[str, Any]]]:
    return {gpu: [_point(s) for s in samples] for gpu, samples in telemetry.items()}


def _point(s: GpuSample) -> dict[str, Any]:
    point = {"time": s.time, **{k: getattr(s, k) for k in _TELEMETRY}}
    point["temperature_celsius"] = max(s.temperatures.values(), default=None)
    return point


class Incidents:
    """The incidents' edge: groups live events into incidents (incidents.py decides), names each member event's
    incident, saves each incident as it changes (`save(row, open incidents)`), and writes its
    bundle after SETTLE, once more when WINDOW has passed, and a last time when it closes, each time followed by
    a fresh picture. Incidents loaded at a start close on the condition changes (or the events) that come; their
    bundles are not written again."""

    def __init__(self, folder: Path, gather: Callable[[Event, int, float], dict[str, Any]],
                 save: Callable[[dict[str, Any], Iterable[incidents.Incident]], None], settle: float = SETTLE,
                 window: float = WINDOW, keep: int = KEEP) -> None:
        self.folder, self.gather, self.save = folder, gather, save
        self.settle, self.window, self.keep = settle, window, keep
        self.open: dict[str, incidents.Incident] = {}
        self._by_event: dict[int, str] = {}  # event id -> incident id, while it is open
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
            self.save(incident.row(), self.open.values())

    def offer(self, event: Event, raised: list[Key], decisions: list[dict[str, Any]],
              engine_gpus: dict[str, frozenset[str] | None]) -> str | None:
        """The id of the incident the event opens or joins, or None."""
        current = incidents.joins(self.open.values(), event, engine_gpus)
        new_id = ""
        if current is None and incidents.opens(event):  # a look at the folder, only for a new one
            new_id = _unique(self.folder / folder_name(event), taken=self.open.keys()).name
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
            self.save(incident.row(), self.open.values())
        return incident.id

    def stored(self, event_id: int, incident_id: str) -> None:
        """An event of the incident got its id (its alert finds the incident's folder)."""
        self._by_event[event_id] = incident_id
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
                self._by_event = {i: p for i, p in self._by_event.items() if p != incident_id}
                if closed := self._closed.get(incident_id):
                    closed.set()
            self.save(settled.row(), self.open.values())

    def is_open(self, incident_id: str) -> bool:
        return incident_id in self.open

    def folder_for(self, event_ids: list[int]) -> Path | None:
        """The incident that these events belong to (an alert names it or attaches its picture)."""
        return next((self.folder / self._by_event[i] for i in event_ids if i in self._by_event), None)

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
            content = self.gather(trigger, trigger_id or 0, opened)
            content["incident"] = self._latest[incident_id].row()
            await _WRITES.run(path.name, _WRITE_DEADLINE, self._write, path, content, self.keep)
        except Exception:
            log.exception("incident report %s could not be written", path)

    @staticmethod
    def _write(path: Path, content: dict[str, Any], keep: int = KEEP) -> None:
        private_folder(path.parent, ours=True)  # bundles hold kernel lines and process lists
        if callable(content.get("telemetry")):  # gathered as a copy of the flight recorder, rebuilt here off the loop
            content["telemetry"] = content["telemetry"]()
        new = not path.exists()
        path.mkdir(exist_ok=True)
        if new:
            last = max((_written(p)[0] for p in path.parent.iterdir() if p != path), default=0)
            _atomic(path / ORDER, json.dumps({"sequence": max(last, 0) + 1, "written": time.time()}).encode())
        (path / FAILED).unlink(missing_ok=True)
        _atomic(path / BUNDLE, json.dumps(content, indent=1, default=str).encode())
        log.info("incident report written: %s", path)
        draw(path, content)
        if new:
            try:
                prune(path.parent, keep, path)
            except OSError as exc:  # the new bundle is written all the same, and its picture drawn
                log.error("cannot delete old incident reports in %s: %s", path.parent, exc)

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()


def prune(folder: Path, keep: int, spare: Path | None = None) -> list[str]:
    """Delete the oldest bundles beyond the newest `keep`, in the order they were written (ORDER; those of an
    older gpuwarden, which have none, come first, by name). Only real folders named like a bundle count; a
    link, a file or another name is left as it is, and rmtree removes a link inside a bundle without following
    it. `spare` (the bundle being written) stays."""
    bundles = []
    for entry in os.scandir(folder):
        if _NAMED.fullmatch(entry.name) and stat.S_ISDIR(entry.stat(follow_symlinks=False).st_mode):
            bundles.append(entry.name)
    newest = sorted(bundles, key=lambda name: _written(folder / name), reverse=True)
    old = [n for n in newest[keep:] if spare is None or n != spare.name]
    import shutil  # here: shutil loads bz2 and lzma, 1.5 ms of every start for a prune that comes with incidents

    for name in old:
        shutil.rmtree(folder / name, onerror=lambda _f, p, exc: log.error("cannot delete %s: %s", p, exc[1]))
    if old:
        log.info("deleted %d old incident report(s) in %s, keeping the newest %d", len(old), folder, keep)
    return old


def _written(path: Path) -> tuple[int, str]:
    """A bundle's place in the order bundles were written; -1 (then its name) for one written before ORDER."""
    try:
        return int(json.loads((path / ORDER).read_text())["sequence"]), path.name
    except (OSError, ValueError, KeyError, TypeError):
        return -1, path.name


def _unique(path: Path, taken: Iterable[str] = ()) -> Path:
    """`path`, or `path-N`: a name no folder has, nor an incident not yet written (`taken`)."""
    n, candidate, taken = 1, path, set(taken)
    while candidate.exists() or candidate.name in taken:
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def _atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def draw(path: Path, content: dict[str, Any]) -> bool:
    """Write `path`/timeline.svg; on failure write render-error.txt instead (alerts stop waiting for it)."""
    try:
        _atomic(path / PICTURE, svg(content).encode())
    except Exception:  # a bundle the picture cannot show is still written and alerted
        (path / FAILED).write_text(traceback.format_exc()[-4000:])
        log.exception("incident picture for %s failed", path)
        return False
    return True


def picture(path: Path) -> Path | bool | None:
    """The incident's picture, None while it is being drawn, False when drawing failed."""
    if (path / PICTURE).exists():
        return path / PICTURE
    return False if (path / FAILED).exists() else None


def listing(folder: Path) -> list[dict[str, Any]]:
    """Every incident under `folder`, oldest first (as written: a wall-clock step does not reorder them); an
    unreadable bundle is listed as such, not skipped."""
    rows = []
    for path in sorted((p for p in folder.glob("*") if p.is_dir()), key=_written):
        try:
            content = json.loads((path / BUNDLE).read_text())
            trigger = content["trigger"]
        except (OSError, ValueError, KeyError) as exc:
            rows.append({"folder": str(path), "time": path.stat().st_mtime, "kind": "?", "subject": "?",
                         "events": 0, "actions": 0, "picture": None, "error": str(exc)})
            continue
        found = picture(path)
        incident = content.get("incident") or {}  # how it ended, as of its last write (the store has it too)
        rows.append({"folder": str(path), "time": trigger["time"], "kind": trigger["kind"],
                     "subject": trigger["gpu"] or trigger["engine"] or "host", "events": len(content["events"]),
                     "actions": len(content["actions"]), "picture": str(found) if found else None,
                     "ended": incident.get("ended") if incident.get("closed") else None})
    return rows
