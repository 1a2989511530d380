"""The recent past as the alerter saw it, in memory, for the status page: the last events, each incident's pages
(its title, what they told to do, whether its all-clear went out) and each target's deliveries (the last one,
the failures, what waits). Bounded: the last EVENTS events, the last INCIDENTS incidents; a restart forgets it
(the store keeps the whole history: `gpuwarden events`, `gpuwarden incidents`)."""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any

from gpuwarden.core.model import LOGGED_AT, Event

EVENTS = 20
INCIDENTS = 20


class Recent:
    def __init__(self) -> None:
        self.events: deque[dict[str, Any]] = deque(maxlen=EVENTS)
        self.incidents: OrderedDict[str, dict[str, Any]] = OrderedDict()  # incident -> its pages, oldest first
        self.targets: dict[str, dict[str, Any]] = {}
        self._all_clears: dict[str, str] = {}  # an all-clear's alert id -> its incident, until delivered once

    def event(self, e: Event) -> None:
        self.events.append({"time": e.time, "kind": e.kind, "severity": str(e.severity), "gpu": e.gpu,
                            "engine": e.engine, "message": e.message, "incident": e.evidence.get("incident"),
                            # history: read at start from an older line (`time` is the reading's), and when it was
                            # logged where the log said
                            "history": not e.live, "logged_at": e.evidence.get(LOGGED_AT)})

    def paged(self, incident: str | None, alert_id: str, title: str, steps: list[str], all_clear: bool,
              heard: bool, now: float) -> None:
        """An incident's message was made: its title and what it told to do; an all-clear, once delivered (at
        once where no target hears it), ends it for the status page (the incident closes a little later)."""
        if incident is None:
            return
        row = self.incidents.pop(incident, None) or {"first_paged": now, "all_clear": None}
        row.update(title=title, last_paged=now, **({} if all_clear else {"steps": steps}))
        self.incidents[incident] = row
        while len(self.incidents) > INCIDENTS:
            self.incidents.popitem(last=False)
        if all_clear and heard:
            self._all_clears[alert_id] = incident
        elif all_clear:
            row["all_clear"] = now

    def delivered(self, target: str, alert_id: str, title: str, now: float) -> None:
        row = self._target(target)
        row.update(last_sent=now, last_title=title)
        if (incident := self._all_clears.pop(alert_id, None)) and incident in self.incidents:
            self.incidents[incident]["all_clear"] = now

    def failed(self, target: str, error: str, now: float, final: bool) -> None:
        row = self._target(target)
        row.update(last_failure=now, last_error=error)
        row["failures"] += 1
        row["undeliverable"] += final

    def _target(self, name: str) -> dict[str, Any]:
        return self.targets.setdefault(name, {"last_sent": None, "last_title": None, "last_failure": None,
                                              "last_error": None, "failures": 0, "undeliverable": 0})

    def snapshot(self, targets: list[str], pending: dict[str, int]) -> dict[str, Any]:
        return {"recent_events": [dict(e) for e in reversed(self.events)],  # newest first
                "paged": {k: dict(v) for k, v in self.incidents.items()},
                "targets": [{"name": t, **self._target(t), "pending": pending.get(t, 0)} for t in targets]}
