"""Storm control, pure: which events become which messages, and when. The caller passes the time.

- Events about one subject (a GPU, an engine, or the host) that arrive within `group_window` of the first
  become one message, sent when the window closes.
- An event whose dedupe key was sent less than `cooldown` ago is not sent but counted; the next message for
  that key says "and N more since ...", and if none comes, a follow-up with the count goes out when the
  cooldown ends.
- `resolve(key)` makes a short "resolved" message when an alert for that key was sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwarden.model import Event, Severity


@dataclass
class Outgoing:
    """A message to send: the events it reports, repeats counted under cooldown, or a resolution."""

    subject: str
    events: list[Event] = field(default_factory=list)
    event_ids: list[int] = field(default_factory=list)
    repeats: dict[str, tuple[int, float]] = field(default_factory=dict)  # key -> (count, since)
    resolved: str | None = None  # the message of a "resolved" notice
    severity: Severity = Severity.INFO


@dataclass
class _Key:
    last_sent: float
    severity: Severity
    subject: str
    suppressed: int = 0
    since: float | None = None
    open: bool = True  # sent and not resolved since


@dataclass
class _Group:
    opened: float
    events: list[Event] = field(default_factory=list)
    event_ids: list[int] = field(default_factory=list)


class StormControl:
    def __init__(self, cooldown: float = 600.0, group_window: float = 5.0) -> None:
        self.cooldown, self.group_window = cooldown, group_window
        self._keys: dict[str, _Key] = {}
        self._groups: dict[str, _Group] = {}

    def offer(self, event: Event, event_id: int | None, now: float) -> bool:
        """Take an event; False when it was suppressed (counted under its key's cooldown)."""
        key = self._keys.get(event.dedupe_key)
        if key and now - key.last_sent < self.cooldown:
            self.repeated(event.dedupe_key, event.count, now)
            return False
        subject = subject_of(event)
        group = self._groups.setdefault(subject, _Group(opened=now))
        group.events.append(event)
        if event_id is not None:
            group.event_ids.append(event_id)
        # Claim the key now, so that its repeats inside the window are counted, not grouped again.
        self._keys[event.dedupe_key] = _Key(now, event.severity, subject, *(
            (key.suppressed, key.since) if key else (0, None)))
        return True

    def repeated(self, dedupe_key: str, count: int, now: float) -> None:
        """`count` more occurrences of an event already sent (a storm that grew)."""
        key = self._keys.get(dedupe_key)
        if key and count > 0:
            key.suppressed += count
            key.since = key.since or now

    def resolve(self, dedupe_key: str, message: str) -> Outgoing | None:
        key = self._keys.get(dedupe_key)
        if not key or not key.open:
            return None
        key.open = False
        return Outgoing(key.subject, resolved=message, severity=key.severity)

    def due(self, now: float) -> list[Outgoing]:
        """Messages whose time has come: closed groups, then follow-ups for storms whose cooldown ended."""
        out = []
        for subject, group in list(self._groups.items()):
            if now - group.opened >= self.group_window:
                del self._groups[subject]
                message = Outgoing(subject, group.events, group.event_ids,
                                   severity=max(e.severity for e in group.events))
                for event in group.events:
                    self._take_repeats(event.dedupe_key, message, now)
                out.append(message)
        for dedupe_key, key in self._keys.items():
            if key.suppressed and now - key.last_sent >= self.cooldown:
                message = Outgoing(key.subject, severity=key.severity)
                self._take_repeats(dedupe_key, message, now)
                out.append(message)
        return out

    def next_due(self) -> float | None:
        """When `due` will next have something: a group window closing, or a cooldown ending on repeats."""
        times = [g.opened + self.group_window for g in self._groups.values()]
        times += [k.last_sent + self.cooldown for k in self._keys.values() if k.suppressed]
        return min(times, default=None)

    def _take_repeats(self, dedupe_key: str, message: Outgoing, now: float) -> None:
        key = self._keys[dedupe_key]
        if key.suppressed:
            message.repeats[dedupe_key] = (key.suppressed, key.since)
        key.suppressed, key.since, key.last_sent, key.open = 0, None, now, True


def subject_of(event: Event) -> str:
    if event.gpu:
        return f"GPU {event.gpu}"
    if event.engine:
        return f"engine {event.engine}"
    return "host"
