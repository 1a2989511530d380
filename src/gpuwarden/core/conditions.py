"""Conditions, pure: what is wrong now, as opposed to what happened (events).

A condition has a key (its kind and its subject: an engine, a GPU, a telemetry condition of a GPU, the host), is
raised and resolved, and each change is a `Change` that the hub stores, exports as a gauge, alerts and hands to
the incidents; `npd-check` and the report read the stored rows. Which event kinds raise and resolve which
conditions is one table (`RAISES`, `RESOLVES`); what a component observes without an event (an engine that
answers again, a GPU back on the bus, a telemetry reading back to normal) resolves through `resolve`.

The state is a plain mapping key -> `Condition`, never changed in place: `apply` and `resolve` return the state
after (a new mapping when something changed) and the changes, and never read a clock: `now` is the event's time
or is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from gpuwarden.core.eventkinds import Table
from gpuwarden.core.model import CONDITION, ConditionKey, ConditionKind, Event, Severity
from gpuwarden.core.plain import compared, plain

Kind = ConditionKind  # the kinds and the key live in model.py: the Sink's resolve() takes a key
Key = ConditionKey

ENGINE_CONDITIONS = frozenset({Kind.ENGINE_STALLED, Kind.ENGINE_UNRESPONSIVE, Kind.ENGINE_DOWN,
                               Kind.ENGINE_RESTARTING})


def stalled(engine: str) -> Key:
    return Key(Kind.ENGINE_STALLED, engine)


def unresponsive(engine: str) -> Key:
    return Key(Kind.ENGINE_UNRESPONSIVE, engine)


def down(engine: str) -> Key:
    return Key(Kind.ENGINE_DOWN, engine)


def restarting(engine: str) -> Key:
    return Key(Kind.ENGINE_RESTARTING, engine)


def lost(gpu: str) -> Key:
    return Key(Kind.GPU_LOST, gpu)


def degraded(telemetry_condition: str) -> Key:
    """A telemetry condition of gpu/rules.py ("thermal:0000:03:00.0:junction"), its own key."""
    return Key(Kind.GPU_DEGRADED, telemetry_condition)


STORE = Key(Kind.STORE_UNWRITABLE, "host")


@compared
class Condition:
    """A condition that holds now: raised by an event, ended by another or by its watch."""

    key: Key
    since: float  # wall-clock seconds
    message: str  # what raised it
    gpu: str | None = None  # labels: the GPU and engine it is about (an engine's condition names its GPU)
    engine: str | None = None
    causes: frozenset[str] = frozenset()  # the event kinds that raised it
    alert_keys: frozenset[str] = frozenset()  # dedupe keys of those events: their alerts end with it
    event_id: int | None = None  # the stored event that raised it, once known


@plain
class Change:
    """A condition raised or ended, to alert and export."""

    condition: Condition  # as raised, or as it was when it ended
    raised: bool
    time: float
    message: str
    by_event: bool  # an event ended it (a kill, a restart): that event is alerted itself
    tells: bool = True  # its alerts hear the end; not when nothing was seen to end (closed at a start)

    @property
    def key(self) -> Key:
        return self.condition.key


State = Mapping[Key, Condition]

# Event kinds -> the conditions they raise on their subject, and those they resolve: the catalog's rows
# (eventkinds.py, read when asked: a kind registered later counts), a kind of a "gpu" condition raising GPU_LOST.
RAISES: Mapping[str, tuple[Kind, ...]] = Table(lambda row: row.raises + ((Kind.GPU_LOST,) if row.condition == "gpu"
                                                                          else ()))
RESOLVES: Mapping[str, tuple[Kind, ...]] = Table(lambda row: row.resolves)
GPUS_PRESENT = "gpus_present"  # evidence of gpus_back / gpus_changed: the PCI addresses that are there now


def _dry_run(event: Event) -> bool:
    return bool(event.evidence.get("dry_run"))


def raised_by(event: Event) -> list[Key]:
    """The conditions this event raises. A dry run raises nothing; a GPU-lost kind only when critical (a
    warning Xid loses no GPU); a telemetry event its own gpu_degraded condition."""
    telemetry = event.evidence.get(CONDITION)
    if (event.kind not in RAISES and not telemetry) or not event.live or _dry_run(event):
        return []
    if telemetry:
        return [degraded(telemetry)]
    kinds = RAISES[event.kind]
    if Kind.GPU_LOST in kinds and event.severity < Severity.CRITICAL:
        return []
    return [_key(kind, event) for kind in kinds if _subject(kind, event)]


def resolved_by(event: Event, state: State) -> list[Key]:
    """The open conditions this event ends. A kill that left survivors (a process stuck in the driver) ends no
    stall: the engine is still stuck."""
    if event.kind not in RESOLVES or not event.live or _dry_run(event) or event.evidence.get("survivors"):
        return []
    kinds = RESOLVES[event.kind]
    if Kind.GPU_LOST in kinds:
        present = event.evidence.get(GPUS_PRESENT)
        # a loss whose line named no GPU ("host") ends when none is missing
        return [k for k in state if k.kind == Kind.GPU_LOST and (
            present is None or k.subject in present or (k.subject == "host" and not event.evidence.get("missing")))]
    return [k for kind in kinds if _subject(kind, event) and (k := _key(kind, event)) in state]


def impact(event: Event) -> Severity:
    """Severity by impact: an event that takes an engine down (not a dry run) or loses a GPU pages; a dry run
    never does, nor a discovered server that only looks like an engine (evidence "lookalike": anyone can start
    and crash one). Everything else keeps the severity its component gave it."""
    if _dry_run(event) or event.evidence.get("lookalike"):
        return min(event.severity, Severity.WARNING)
    if any(k.kind in (Kind.ENGINE_DOWN, Kind.GPU_LOST) for k in raised_by(event)):
        return Severity.CRITICAL
    return event.severity


def apply(state: State, event: Event) -> tuple[State, list[Change]]:
    """The state after `event`, and what changed: resolutions first (a kill ends the stall, then raises down).
    An event that bears on no condition (most of them) returns `state` itself."""
    resolved, raised = resolved_by(event, state), raised_by(event)
    if not resolved and not raised:
        return state, []
    new, changes = dict(state), []
    for key in resolved:
        changes.append(Change(new.pop(key), False, event.time, event.message, by_event=True))
    for key in raised:
        if (old := new.get(key)) is not None:  # open already: it gains a cause, no change
            new[key] = replace(old, causes=old.causes | {event.kind}, alert_keys=old.alert_keys | {event.dedupe_key})
            continue
        condition = Condition(key, event.time, event.message, event.gpu, event.engine, frozenset({event.kind}),
                              frozenset({event.dedupe_key}))
        new[key] = condition
        changes.append(Change(condition, True, event.time, event.message, by_event=False))
    return new, changes


def resolve(state: State, key: Key, message: str, now: float,
            cures: Iterable[str] | None = None) -> tuple[State, list[Change]]:
    """A component saw a condition end (an engine answers, a GPU is back on the bus). `cures`: the event kinds
    this observation cures; a condition raised by any other kind stays (a GPU that answers reads again is not
    cured of a failed reset)."""
    condition = state.get(key)
    if condition is None or (cures is not None and not condition.causes <= frozenset(cures)):
        return state, []
    new = dict(state)
    del new[key]
    return new, [Change(condition, False, now, message, by_event=False)]


# A lost GPU: only a reboot (or the GPU back) ends it. A telemetry condition: the GPU watch's first round tells
# whether it lasts (TelemetryRules.resume), and its end is said to those who heard it begin.
SURVIVES_RESTART = frozenset({Kind.GPU_LOST, Kind.GPU_DEGRADED})


def restarted(state: State, now: float, engines: Iterable[str] = (),
              discovering: bool = False) -> tuple[State, list[Change]]:
    """A daemon's start with the conditions its store held open: a lost GPU stays lost, a telemetry condition
    stays open until the GPU watch judges it (`TelemetryRules.resume`), and a watched engine (`engines`: those
    configured) stays down, stalled or unresponsive until its watch sees that end, as it would live (told by
    `EngineWatch.resume`); one no longer configured ends, said as after a reload. What nothing will judge again
    (an engine that discovery may find again, the store's health) is resolved unsaid (nothing was seen to end),
    or it would stay open for good."""
    watched = set(engines)
    kept = {k: c for k, c in state.items()
            if k.kind in SURVIVES_RESTART or (k.kind in ENGINE_CONDITIONS and k.subject in watched)}
    return kept, [Change(c, False, now, f"{k.subject} is no longer watched", by_event=False)
                  if k.kind in ENGINE_CONDITIONS and not discovering else
                  Change(c, False, now, "gpuwarden restarted: judged afresh", by_event=False, tells=False)
                  for k, c in state.items() if k not in kept]


def unwatched(state: State, engines: Iterable[str], now: float) -> tuple[State, list[Change]]:
    """Engines a reload stopped watching: nothing will resolve their conditions any more, so they end now."""
    gone = set(engines)
    ended = [c for k, c in state.items() if k.kind in ENGINE_CONDITIONS and k.subject in gone]
    if not ended:
        return state, []
    return ({k: c for k, c in state.items() if c not in ended},
            [Change(c, False, now, f"{c.key.subject} is no longer watched (reload)", by_event=False) for c in ended])


def with_event_id(state: State, changes: Iterable[Change], event_id: int) -> State:
    """The conditions just raised by a stored event, with its id."""
    raised = [c.key for c in changes if c.raised and c.key in state]
    if not raised:
        return state
    new = dict(state)
    for key in raised:
        new[key] = replace(new[key], event_id=event_id)
    return new


def series(state: State) -> dict[tuple[str, str, str, str], float]:
    """The gauge gpuwarden_condition{condition, subject, gpu, engine}: 1 for each open condition; a resolved
    one's series goes away."""
    return {(str(c.key.kind), c.key.subject, c.gpu or "", c.engine or ""): 1.0 for c in state.values()}


def _subject(kind: Kind, event: Event) -> str | None:
    if kind in ENGINE_CONDITIONS:
        return event.engine
    if kind == Kind.GPU_LOST:
        return event.gpu or "host"  # a lost GPU the line does not name is still a lost GPU
    return "host"


def _key(kind: Kind, event: Event) -> Key:
    return Key(kind, _subject(kind, event) or "host")
