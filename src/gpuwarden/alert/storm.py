"""Storm control, pure: which events become which messages, and when. The caller passes the time.

- An incident (`evidence["incident"]`, what one cause did) is one page, updated as it evolves: its events within
  `group_window` of the first make the first message; later, only news makes a follow-up on it (what gpuwarden
  did, an outcome such as "restarting" or "back", or a worse severity), and the rest is counted into the next
  follow-up. A follow-up reaches every target the first page reached, whatever its own severity: the pager that
  heard "killed" hears "back". A GPU lost twice (a failed reset, then the GPU missing) is one fault: the second
  joins the first's incident, so it never pages twice.
- Events with no incident, about one subject (a GPU, an engine, or the host), that arrive within `group_window`
  of the first become one message, sent when the window closes.
- A discovered server's event (`evidence["crowd"]`, its user) pages with its user's other servers, not as an
  incident of its own: its subject and key are the crowd's, so a user who starts sixteen servers and stalls them
  makes one page, the other fifteen counted into it.
- An event with no incident whose dedupe key was sent less than `cooldown` ago is not sent but counted; the next
  message for that key says "and N more since ...", and if none comes, a follow-up with the count goes out when
  the cooldown ends.
- `resolve(key)` makes a short "resolved" message when an alert for that key was sent; for a key of an incident
  that gpuwarden acted on, the incident's own follow-ups ("back") tell the end, so it makes none. A condition
  that ends while its page still waits in its group window is resolved right after that page, never before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwarden.core.eventkinds import FOLLOW_UP_KINDS, GPU_LOST_KINDS
from gpuwarden.core.model import CROWD, Event, Severity

ENDS = frozenset({"engine_back", "gpus_back"})  # the good end of an incident: its follow-up is an all-clear
_ACTED = frozenset({"kill", "restart", "quarantine"})


@dataclass(eq=False, repr=False)
class Outgoing:
    """A message to send: the events it reports, repeats counted under cooldown, or a resolution."""

    subject: str
    events: list[Event] = field(default_factory=list)
    event_ids: list[int] = field(default_factory=list)
    repeats: dict[str, tuple[int, float]] = field(default_factory=dict)  # key -> (count, since)
    resolved: str | None = None  # the message of a "resolved" notice
    severity: Severity = Severity.INFO  # routing: for a follow-up, the highest its incident was sent with
    incident: str | None = None
    earlier: list[Event] = field(default_factory=list)  # what this incident's earlier messages reported
    quiet: int = 0  # events of the incident since its last message that were not news
    about: Event | None = None  # of a resolution: the event whose alert it ends
    at: float | None = None  # of a resolution: when the condition ended

    @property
    def follow_up(self) -> bool:
        return bool(self.earlier)

    @property
    def ends(self) -> bool:
        """The incident ended well with this message (an engine back, the GPUs back)."""
        return bool(self.resolved) or any(e.kind in ENDS for e in self.events)


@dataclass(eq=False, repr=False)
class _Key:
    """A dedupe key's last alert and what its cooldown suppressed since."""

    last_sent: float
    severity: Severity
    subject: str
    suppressed: int = 0
    since: float | None = None
    open: bool = True  # sent and not resolved since
    incident: str | None = None
    event: Event | None = None  # the last one sent under this key: what a resolution ends


@dataclass(eq=False, repr=False)
class _Group:
    """Events held together for one message, within the group window."""

    opened: float
    events: list[Event] = field(default_factory=list)
    event_ids: list[int] = field(default_factory=list)
    ends: list[tuple[str, str, float | None]] = field(default_factory=list)  # resolutions held until it is sent


@dataclass(eq=False, repr=False)
class _Incident:
    """What an incident's messages have said so far."""

    severity: Severity = Severity.INFO  # the highest it was sent with
    sent: list[Event] = field(default_factory=list)
    quiet: int = 0


class StormControl:
    def __init__(self, cooldown: float = 600.0, group_window: float = 5.0) -> None:
        self.cooldown, self.group_window = cooldown, group_window
        self._keys: dict[str, _Key] = {}
        self._groups: dict[str, _Group] = {}
        self._incidents: dict[str, _Incident] = {}
        self._lost: dict[str, str] = {}  # GPU -> the incident that told it lost

    def offer(self, event: Event, event_id: int | None, now: float) -> bool:
        """Take an event; False when it was suppressed (counted under its key's cooldown, or into its incident's
        next follow-up)."""
        incident = self._incident_of(event)
        if incident is not None:
            state = self._incidents.get(incident)
            if state and state.sent and not _news(event, state):
                state.quiet += event.count
                return False
            self._adopt(subject_of(event), incident)
            self._join(f"incident {incident}", event, event_id, now)
            self._keys[event.dedupe_key] = _Key(now, event.severity, f"incident {incident}", incident=incident,
                                                event=event)
            return True
        key = self._keys.get(event.dedupe_key)
        if key and key.incident is None and now - key.last_sent < self.cooldown:
            self.repeated(event.dedupe_key, event.count, now)
            return False
        subject = subject_of(event)
        self._join(subject, event, event_id, now)
        # Claim the key now, so that its repeats inside the window are counted, not grouped again.
        self._keys[event.dedupe_key] = _Key(now, event.severity, subject, *(
            (key.suppressed, key.since) if key and key.incident is None else (0, None)), event=event)
        return True

    def resume(self, incident: str | None, sent: list[Event]) -> None:
        """What the last run of gpuwarden alerted (`sent`, oldest first), so that a restart neither pages again
        nor loses a page: of an incident still open, its page was sent, so what comes now is a follow-up routed
        where that page went (the pager that heard "killed" hears "back"), and a GPU it lost stays its; with no
        incident, recent events whose keys are still in their cooldown."""
        if not sent:
            return
        if incident is not None:
            self._incidents.setdefault(incident, _Incident(max(_impact(e) for e in sent), list(sent)))
        # newest first: a key's last sending is its newest event; what this run was told already stays as it is
        for event in reversed(sent):
            if incident is not None and event.gpu and event.kind in GPU_LOST_KINDS:
                self._lost.setdefault(event.gpu, incident)
            subject = subject_of(event) if incident is None else f"incident {incident}"
            self._keys.setdefault(event.dedupe_key, _Key(event.time, event.severity, subject, incident=incident,
                                                         event=event))

    def repeated(self, dedupe_key: str, count: int, now: float) -> None:
        """`count` more occurrences of an event already sent (a storm that grew)."""
        key = self._keys.get(dedupe_key)
        if key and count > 0:
            if key.incident is not None and key.incident in self._incidents:
                self._incidents[key.incident].quiet += count
                return
            key.suppressed += count
            key.since = key.since or now

    def resolve(self, dedupe_key: str, message: str, now: float | None = None) -> Outgoing | None:
        key = self._keys.get(dedupe_key)
        if not key or not key.open:
            return None
        if (group := self._groups.get(key.subject)) and any(e is key.event for e in group.events):
            # It ended inside its own group window: the page still tells it began, and the end follows that page
            # (made now, the end would come first, or, for an incident not paged yet, never).
            group.ends.append((dedupe_key, message, now))
            return None
        key.open = False
        if key.incident is not None:
            state = self._incidents.get(key.incident)
            if state is None or not state.sent or _acted(state.sent):
                return None
            return Outgoing(key.subject, resolved=message, severity=state.severity, incident=key.incident,
                            earlier=list(state.sent), at=now)
        return Outgoing(key.subject, resolved=message, severity=key.severity, about=key.event, at=now)

    def due(self, now: float) -> list[Outgoing]:
        """Messages whose time has come: closed groups, then follow-ups for storms whose cooldown ended."""
        out = []
        for subject, group in list(self._groups.items()):
            if now - group.opened >= self.group_window:
                del self._groups[subject]
                out.append(self._message(subject, group, now))
                out += [end for held in group.ends if (end := self.resolve(*held))]
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

    # --- inside ---------------------------------------------------------------------------------------------

    def _incident_of(self, event: Event) -> str | None:
        if event.evidence.get(CROWD):
            return None  # a user's discovered servers page as one crowd, not as an incident each
        incident = event.evidence.get("incident")
        if event.gpu and event.kind in GPU_LOST_KINDS:
            if event.gpu in self._lost:
                return self._lost[event.gpu]  # the same GPU lost again: the same fault
            if incident is not None:
                self._lost[event.gpu] = str(incident)
        if event.kind in ("gpus_back", "gpus_changed"):
            self._lost.clear()  # a new boot's GPUs: a loss from now on is news
        return None if incident is None else str(incident)

    def _adopt(self, subject: str, incident: str) -> None:
        """An incident opened by an event about a subject whose lesser events wait in their window (a warning
        just before the fault it led to): they go out in the incident's page, not in a message of their own."""
        if (group := self._groups.pop(subject, None)) is None:
            return
        target = self._groups.setdefault(f"incident {incident}", _Group(opened=group.opened))
        target.opened = min(target.opened, group.opened)
        target.events[:0], target.event_ids[:0] = group.events, group.event_ids
        target.ends[:0] = group.ends
        for event in group.events:
            if key := self._keys.get(event.dedupe_key):
                key.subject, key.incident = f"incident {incident}", incident

    def _join(self, subject: str, event: Event, event_id: int | None, now: float) -> None:
        group = self._groups.setdefault(subject, _Group(opened=now))
        group.events.append(event)
        if event_id is not None:
            group.event_ids.append(event_id)

    def _message(self, subject: str, group: _Group, now: float) -> Outgoing:
        severity = max(_impact(e) for e in group.events)
        if not subject.startswith("incident "):
            message = Outgoing(subject, group.events, group.event_ids, severity=severity)
            for event in group.events:
                self._take_repeats(event.dedupe_key, message, now)
            return message
        incident = subject.removeprefix("incident ")
        state = self._incidents.setdefault(incident, _Incident())
        message = Outgoing(subject, group.events, group.event_ids, severity=max(severity, state.severity),
                           incident=incident, earlier=list(state.sent), quiet=state.quiet)
        state.sent += group.events
        state.severity, state.quiet = message.severity, 0
        return message

    def _take_repeats(self, dedupe_key: str, message: Outgoing, now: float) -> None:
        key = self._keys[dedupe_key]
        if key.suppressed:
            message.repeats[dedupe_key] = (key.suppressed, key.since)
        key.suppressed, key.since, key.last_sent, key.open = 0, None, now, True


def _impact(event: Event) -> Severity:
    """The severity a message is routed with: history (logged before the start) and a dry run never page; the
    GPUs back after a reboot answer the page of their loss (sent before the reboot, by another process), and
    reach where it went."""
    if event.kind == "gpus_back":
        return Severity.CRITICAL
    if not event.live or event.evidence.get("dry_run"):
        return min(event.severity, Severity.WARNING)
    return event.severity


def _news(event: Event, state: _Incident) -> bool:
    """Whether an event of an incident already paged is worth a follow-up of its own."""
    return (event.kind in FOLLOW_UP_KINDS or event.severity > state.severity
            or any(d.get("action") in _ACTED for d in event.evidence.get("decision") or ()))


def _acted(events: list[Event]) -> bool:
    """gpuwarden did something in the incident: its own follow-ups tell how it ended."""
    return any(e.kind in FOLLOW_UP_KINDS or any(d.get("action") in _ACTED for d in e.evidence.get("decision") or ())
               for e in events)


def subject_of(event: Event) -> str:
    if crowd := event.evidence.get(CROWD):
        return crowd
    if event.gpu:
        return f"GPU {event.gpu}"
    if event.engine:
        return f"engine {event.engine}"
    return "host"
