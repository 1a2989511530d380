"""Incident reports: on a critical event, a folder `state_dir/incidents/<time>-<kind>/` with `incident.json`
(the event, the kernel lines around it, the flight recorder's telemetry per GPU, the engines' last metrics,
what gpuwarden did and how it went) and `timeline.svg`.

The bundle is pure (`bundle`), and so is its picture (`timeline.svg`, SVG text written directly: a few
milliseconds, no plotting library); `write` puts both on disk. The incidents component that gathers them and has
them written, off the loop, is the hub's (hub/tracker.py).
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import time
import traceback
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuwarden.core import incidents
from gpuwarden.core.eventkinds import OUTCOMES
from gpuwarden.core.model import Event, GpuSample
from gpuwarden.store.sqlite import private_folder
from gpuwarden.store.timeline import svg

log = logging.getLogger(__name__)

BEFORE = 300.0  # seconds of events and kernel lines before the trigger that go into the bundle
KERNEL_LINES = 2000  # the daemon keeps this many recent kernel lines for the bundles
PICTURE, BUNDLE, FAILED = "timeline.svg", "incident.json", "render-error.txt"
# In each bundle: its place in the order bundles were written, and the wall-clock time then. Pruning and the
# listing go by it: a folder's name is its trigger's wall-clock time, which a clock stepped back a day puts
# before every bundle written the day before (each new bundle then deleted the one before it).
ORDER = "order.json"
_TELEMETRY = ("power_watts", "sclk_hz", "busy_ratio", "state")
KEEP = 100  # bundles kept ([daemon] incidents_keep): one a minute, forever, would fill the state disk
_NAMED = re.compile(r"\d{8}-\d{6}-[a-z_]{1,64}(?:-\d{1,9})?")  # what folder_name and unique make


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


class Folders:
    """The incidents this process writes, as an alert asks about them: which incident each event belongs to (its
    folder: its picture is coming) and which are still open. The hub's incident tracker (hub/tracker.py) keeps
    them; the alerter, below the hub, only reads (tests/integration/test_upward_calls.py)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.open: dict[str, incidents.Incident] = {}  # the open incidents by id, as the tracker has them now
        self.by_event: dict[int, str] = {}  # event id -> incident id, while it is open

    def is_open(self, incident_id: str) -> bool:
        return incident_id in self.open

    def folder_for(self, event_ids: list[int]) -> Path | None:
        """The incident that these events belong to (an alert names it or attaches its picture)."""
        return next((self.folder / self.by_event[i] for i in event_ids if i in self.by_event), None)


def write(path: Path, content: dict[str, Any], keep: int = KEEP) -> None:
    """Write an incident's bundle and its picture into `path` (blocking: the tracker runs it off the loop); a
    new bundle prunes the oldest beyond `keep`."""
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


def unique(path: Path, taken: Iterable[str] = ()) -> Path:
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
