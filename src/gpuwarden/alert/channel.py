"""The alert-channel interface: one alert in, whether to try again out (the shape of Alertmanager's
`notify.Notifier`: `Notify(ctx, alerts) (retry bool, err)`). The alerter's outbox keeps order, backoff and
give-up; a channel only delivers. A receiver that forgets an alert not sent again (Alertmanager) has its channel
re-send what is still firing (`refresh`). apprise is one channel, Alertmanager another; a new one implements
this."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuwarden.core.model import Event


@dataclass(frozen=True, eq=False, repr=False)
class Alert:
    """What the outbox hands a channel: the message in both renderings, its tone, and the alert identities
    (label sets) it reports, for a channel that keeps alerts by identity rather than by message."""

    title: str
    body: str  # Markdown
    text: str  # the same, plain
    tone: str  # info, warning, failure or success
    resolved: bool  # the alert's end: an all-clear
    picture: str | None = None  # the incident's timeline picture, when the channel takes one
    # {"labels": {...}, "starts": epoch seconds, "held": firing while its incident is open}
    identities: list[dict[str, Any]] = field(default_factory=list)


def identities(events: list[Event], host: str, incident: str | None) -> list[dict[str, Any]]:
    """One alert identity per distinct label set of `events`, with when its first event happened: what a channel
    that keeps alerts by identity (Alertmanager) fires and ends. `held`: its incident holds it firing until the
    incident's all-clear or end, which the model always tells; an event outside an incident is not held (what
    ends its condition may be an event whose alert ends nothing), so it is sent once, and expires there."""
    found: dict[tuple, dict[str, Any]] = {}
    for e in events:
        labels = {"alertname": e.kind, "severity": str(e.severity), "host": host, "gpu": e.gpu or "",
                  "engine": e.engine or "", "incident": incident or ""}
        labels = {k: v for k, v in labels.items() if v}  # Alertmanager treats an empty label as absent
        found.setdefault(tuple(sorted(labels.items())), {"labels": labels, "starts": e.time,
                                                         "held": bool(incident)})
    return list(found.values())


class Channel(Protocol):
    takes_pictures: bool  # the outbox waits for an incident's picture only for a channel that sends it

    async def notify(self, alert: Alert, timeout: float) -> tuple[bool, str | None]:
        """(retry, error): error None on success; retry False when sending again cannot help (refused)."""
        ...

    async def refresh(self, timeout: float, still_open: Callable[[str], bool]) -> tuple[bool, str | None]:
        """Send again what is firing, when due, ending what `still_open(incident)` says has closed; as
        `notify`'s. Called between two alerts of the outbox, never during one."""
        ...

    def resume(self, alert: Alert) -> None:
        """At a start: an alert the last run sent that is still firing (its incident is open)."""
        ...

    def carry(self, earlier: Channel) -> None:
        """A reload's new channel for the same target: what the earlier one held firing."""
        ...
