"""Recorded scenarios and their replay through the real alerter: the golden pages' source.

A recording is what the daemon's alerter was handed while a real scenario ran (tests/integration/
test_golden_scenarios.py): each call (the events as the hub stored and decided them, a resolution, a storm's
count) with its wall-clock time, and the alert context (host, GPUs, engines, how each runs) the daemon gave each
message. `replay` hands the same calls, at the same times, to a fresh real Alerter (its storm control, its
composer, its outbox in a real store) and returns the messages it queued."""

from __future__ import annotations

import json
import re
import time
from datetime import tzinfo
from pathlib import Path
from typing import Any

from gpuwarden.alert.alerter import Alerter
from gpuwarden.alert.context import Context, Runs
from gpuwarden.alert.targets import build
from gpuwarden.config.settings import AlertsConfig
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.core.model import Event, Severity
from gpuwarden.store import bundles as report
from gpuwarden.store.sqlite import Store

SCENARIOS = Path(__file__).resolve().parent / "data" / "golden" / "scenarios"
_ALERT_ID = re.compile(r"alert id: gw-[0-9a-f]+")
_TICK = 0.01  # the alerter's tick wakes this long after a due time (alert/alerter.py _tick)


class Recorder:
    """Records what a running daemon's alerter is handed, and the pages it queues, by wrapping its entry points
    (the alerter itself runs as it does, with each call's own time)."""

    def __init__(self, alerter: Alerter) -> None:
        self.alerter, self.calls, self.contexts, self.pages = alerter, [], [], []
        submit, resolve, repeated, context = alerter.submit, alerter.resolve, alerter.repeated, alerter.context
        enqueue = alerter.store.enqueue_alert

        def on_submit(events, ids, now=None):
            rows = [report.row(e, i) for e, i in zip(events, ids, strict=True)]
            self.calls.append({"at": time.time(), "submit": rows})
            submit(events, ids, self.calls[-1]["at"])

        def on_resolve(key, message, now=None):
            self.calls.append({"at": time.time(), "resolve": [key, message]})
            resolve(key, message, self.calls[-1]["at"])

        def on_repeated(event, now=None):
            self.calls.append({"at": time.time(), "repeated": report.row(event, 0)})
            repeated(event, self.calls[-1]["at"])

        def on_context():
            self.contexts.append(context())
            return self.contexts[-1]

        def on_enqueue(alert_id, severity, payload, targets, event_ids, now):
            self.pages.append(page(severity, payload))
            return enqueue(alert_id, severity, payload, targets, event_ids, now)

        alerter.submit, alerter.resolve, alerter.repeated, alerter.context = on_submit, on_resolve, on_repeated, \
            on_context
        alerter.store.enqueue_alert = on_enqueue

    def recording(self, end: float) -> dict[str, Any]:
        config = self.alerter.config
        return {"alerts": {"group_window": config.group_window, "cooldown": config.cooldown},
                "incidents_dir": str(self.alerter.incidents_dir), "end": end, "calls": self.calls,
                "contexts": [context_row(c) for c in self.contexts]}


def page(severity: str, payload: dict[str, Any]) -> dict[str, Any]:
    """A queued message as the golden files and the live check compare it (the alert id is random)."""
    return {"severity": severity, "resolved": payload["resolved"], "title": payload["title"],
            "body": _ALERT_ID.sub("alert id: gw-?", payload["body"]),
            "text": _ALERT_ID.sub("alert id: gw-?", payload["text"])}


def context_row(c: Context) -> dict[str, Any]:
    return {"host": c.host, "gpus": {k: list(v) for k, v in c.gpus.items()},
            "engines": {k: None if v is None else sorted(v) for k, v in c.engines.items()},
            "runs": {k: {"unit": r.unit, "container": r.container, "log_file": r.log_file and str(r.log_file)}
                     for k, r in c.runs.items()},
            "kills": {k: list(v) for k, v in c.kills.items()}, "cache_dry_run": c.cache_dry_run}


def context_of(row: dict[str, Any], tz: tzinfo | None) -> Context:
    return Context(row["host"], {k: (v[0], v[1]) for k, v in row["gpus"].items()},
                   {k: None if v is None else frozenset(v) for k, v in row["engines"].items()}, tz,
                   {k: Runs(r["unit"], r["container"], r["log_file"] and Path(r["log_file"]))
                    for k, r in row["runs"].items()},
                   {k: tuple(v) for k, v in row["kills"].items()}, row["cache_dry_run"])


def event_of(row: dict[str, Any]) -> Event:
    return Event(row["kind"], Severity.parse(row["severity"]), row["message"], row["time"], row["gpu"],
                 row["engine"], row["evidence"], row["count"])


def replay(recording: dict[str, Any], store_path: Path, tz: tzinfo | None = None,
           incidents_dir: str | None = None) -> list[dict[str, Any]]:
    """The messages a fresh alerter queues for the recorded calls, made at the recorded times, with the recorded
    contexts in the reader's zone `tz` (None: the machine's)."""
    settings = recording["alerts"]
    config = AlertsConfig.validate({**settings, "hostname": recording["contexts"][0]["host"] if
                                    recording["contexts"] else "box", "urls": ["json://127.0.0.1:9/never-sent"]})
    contexts = [context_of(c, tz) for c in recording["contexts"]]
    store = Store(store_path)
    alerter = Alerter(config, build(config), store, SelfMetrics(),
                      incidents_dir=Path(incidents_dir or recording["incidents_dir"]),
                      context=lambda: contexts.pop(0))
    try:
        for call in [*recording["calls"], {"at": recording["end"]}]:
            at = call["at"]
            # what the alerter's tick did in between: it wakes just after each due time (_tick's 10 ms)...
            while (due := alerter.storm.next_due()) is not None and due + _TICK <= at:
                alerter.due(due + _TICK)
            if "submit" in call:
                rows = call["submit"]
                alerter.submit([event_of(r) for r in rows], [r["id"] for r in rows], at)
            elif "resolve" in call:
                alerter.resolve(*call["resolve"], now=at)
            elif "repeated" in call:
                alerter.repeated(event_of(call["repeated"]), at)
            if (due := alerter.storm.next_due()) is not None and due <= at:
                alerter.due(at)  # ...and at once after a call, which wakes it
        return [page(row.severity, row.payload) for row in store.outbox()]
    finally:
        store.close()


def load(name: str) -> dict[str, Any]:
    return json.loads((SCENARIOS / f"{name}.json").read_text())


def save(name: str, recording: dict[str, Any]) -> None:
    SCENARIOS.mkdir(parents=True, exist_ok=True)
    (SCENARIOS / f"{name}.json").write_text(json.dumps(recording, indent=1, sort_keys=True) + "\n")
