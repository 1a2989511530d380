"""Incidents, pure: what one cause did, grouped. A live critical event opens one; later live events about the same
engine or GPU (or an engine on that GPU) join it while it is open; it closes when the conditions its members
raised are resolved and nothing joined for `window` seconds, or when `bound` has passed (a condition nobody
resolves must not keep it open for good). Each member event carries the incident's id (`evidence["incident"]`,
the name of its bundle folder); the incident keeps the decisions with their reasons, what gpuwarden did, and
how it ended. Times are wall-clock seconds, passed in."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from gpuwarden.core.conditions import Change, Key
from gpuwarden.core.eventkinds import OUTCOMES
from gpuwarden.core.model import Event, Severity
from gpuwarden.core.plain import compared

INCIDENT = "incident"  # evidence key: the incident an event belongs to
DECISION = "decision"  # evidence key: what the policy decided about it, with the reasons
WINDOW = 60.0  # an incident with no open condition stays open this long after its last event
BOUND = 7 * 86400.0  # and one whose conditions nobody resolves closes after this long


@compared
class Incident:
    """Events that belong together, from the one that opened it to the last."""

    id: str
    opened: float  # wall-clock seconds
    kind: str  # what opened it
    message: str
    last: float  # when its last event came
    engines: frozenset[str] = frozenset()
    gpus: frozenset[str] = frozenset()
    conditions: frozenset[Key] = frozenset()  # raised by its events and still open
    decisions: tuple[dict[str, Any], ...] = ()  # each with the kind of the event it was decided for
    done: tuple[str, ...] = ()  # what gpuwarden did, or was not allowed to do (outcome events' messages)
    closed: float | None = None
    ended: str | None = None  # how it ended

    def row(self) -> dict[str, Any]:
        """As stored and shown (`gpuwarden incidents`, the bundle's incident.json)."""
        return {"id": self.id, "opened": self.opened, "kind": self.kind, "message": self.message, "last": self.last,
                "engines": sorted(self.engines), "gpus": sorted(self.gpus),
                "conditions": [str(k) for k in sorted(self.conditions)], "decisions": list(self.decisions),
                "done": list(self.done), "closed": self.closed, "ended": self.ended}


def from_row(row: Mapping[str, Any], open_keys: Iterable[Key]) -> Incident:
    """A stored open incident at a daemon's start, keeping only the conditions still open."""
    named = {str(k): k for k in open_keys}
    return Incident(row["id"], row["opened"], row["kind"], row["message"], row["last"], frozenset(row["engines"]),
                    frozenset(row["gpus"]), frozenset(named[k] for k in row["conditions"] if k in named),
                    tuple(row["decisions"]), tuple(row["done"]))


def about(incident: Incident, event: Event, engine_gpus: Mapping[str, frozenset[str] | None]) -> bool:
    """The event is about the incident's engines or GPUs, or an engine on one of its GPUs, or a GPU one of its
    engines uses. An engine whose GPUs are unknown matches by name only."""
    if event.engine in incident.engines or event.gpu in incident.gpus:
        return True
    if event.engine and incident.gpus & (engine_gpus.get(event.engine) or frozenset()):
        return True
    return bool(event.gpu) and any(event.gpu in (engine_gpus.get(e) or ()) for e in incident.engines)


def joins(incidents: Iterable[Incident], event: Event,
          engine_gpus: Mapping[str, frozenset[str] | None]) -> Incident | None:
    """The open incident a live event joins, or None (then a critical one opens its own)."""
    if not event.live:
        return None
    return next((i for i in incidents if i.closed is None and about(i, event, engine_gpus)), None)


def opens(event: Event) -> bool:
    return event.live and event.severity == Severity.CRITICAL


def offer(current: Incident | None, event: Event, raised: Iterable[Key], decisions: list[dict[str, Any]],
          new_id: str, now: float) -> Incident | None:
    """`current` (what `joins` found) with the event in it, a new incident it opens (named `new_id`), or None.
    Its times are when gpuwarden saw the events (`now`): a line's own stamp may be old."""
    if current is None:
        if not opens(event):
            return None
        current = Incident(new_id, now, event.kind, event.message, now)
    return replace(
        current, last=max(current.last, now),
        engines=current.engines | ({event.engine} if event.engine else set()),
        gpus=current.gpus | ({event.gpu} if event.gpu else set()),
        conditions=current.conditions | frozenset(raised),
        decisions=_more(current.decisions, ({"event": event.kind, **d} for d in decisions)),
        done=_more(current.done, [event.message] if event.kind in OUTCOMES else []))


def _more(kept: tuple, new: Iterable) -> tuple:
    """`kept` and what of `new` it does not hold yet: a storm of one fault adds its decision once."""
    return kept + tuple(x for x in new if x not in kept)


def grew(before: Incident | None, after: Incident) -> bool:
    """Something more than its last event's time changed (a storm of one fault joins without a change)."""
    return before is None or (before.engines, before.gpus, before.conditions, len(before.decisions),
                              len(before.done)) != (after.engines, after.gpus, after.conditions,
                                                    len(after.decisions), len(after.done))


def settle(incident: Incident, changes: Iterable[Change], now: float, window: float = WINDOW,
           bound: float = BOUND) -> Incident:
    """The incident after condition changes (and time): closed once nothing is open and it was quiet for
    `window`, or `bound` after it opened. How it ended is the last resolution's message."""
    if incident.closed is not None:
        return incident
    ended = [c for c in changes if not c.raised and c.key in incident.conditions]
    if ended:
        incident = replace(incident, conditions=incident.conditions - {c.key for c in ended},
                           ended=ended[-1].message)
    if not incident.conditions and now - incident.last >= window:
        return replace(incident, closed=now, ended=incident.ended or "nothing left open")
    if now - incident.opened >= bound:
        return replace(incident, closed=now, ended=f"still open after {bound / 86400:.0f} days: "
                       + ", ".join(str(k) for k in sorted(incident.conditions)))
    return incident
