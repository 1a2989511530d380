"""An alert's title, pure: the host, what broke and what gpuwarden did, in one line ("vm: engine qwen-72b killed —
GPU 0 (ffff:03:00.0, Radeon AI PRO R9700) ring timeout")."""

from __future__ import annotations

import re

from gpuwarden.alert.context import Context, first, first_fault, is_lost
from gpuwarden.alert.runbooks import OFF_THE_BUS_XIDS
from gpuwarden.alert.sentences import stall_start
from gpuwarden.alert.storm import Outgoing
from gpuwarden.alert.words import duration, plural
from gpuwarden.core.eventkinds import words
from gpuwarden.core.model import Event

_UNSAFE = re.compile(r"[^\w.:/@+=-]")


def headline(events: list[Event], ctx: Context, earlier: list[Event] = ()) -> str:
    """What broke and what gpuwarden did, in one line."""
    fault = first_fault([*earlier, *events])  # none: an outcome alone (its fault was told apart, or by no one)
    cause = _cause(fault, ctx) if fault else str(events[0].evidence.get("reason") or events[0].message).replace(
        "_", " ")  # an outcome's reason is a word of the code's (crash_loop)
    if e := first(events, "gpus_back", "gpus_changed"):
        return e.message
    if lost := next((e for e in events if is_lost(e) and e.live), None):
        # engines whose GPUs are unknown are named in the body only: a title is one line
        killed = {e.engine for e in events if e.kind == "engine_killed"}
        engines = [f"{name} (killed)" if name in killed else name for name in ctx.engines_on(lost.gpu or "")]
        return f"{_cause(lost, ctx)} — reboot needed" + (f"; on it: engine {', '.join(engines)}" if engines else "")
    if e := first(events, "engine_restart_failed"):
        # its supervisor never started it, or started it and it never served: the title says which
        verb = "NOT started again" if e.evidence.get("started") is False else "NOT back after the restart"
        return f"engine {e.engine} {verb} — {_own(cause, e)}"
    if e := first(events, "engine_back"):
        return f"engine {e.engine} back — {_back(e)}"
    if e := first(events, "engine_restart_retrying"):
        return f"engine {e.engine} not started yet, asking again — {_own(cause, e)}"
    if e := first(events, "engine_restarting"):
        verb = "killed, restarting" if first(events, "engine_killed") else "restarting"
        return f"engine {e.engine} {verb} — {_own(cause, e)}"
    if killed := [e for e in events if e.kind == "engine_killed"]:
        names = ", ".join(dict.fromkeys(str(e.engine) for e in killed))
        verb = "would be killed (dry run)" if all(e.evidence.get("dry_run") for e in killed) else "killed"
        if survivors := sum(len(e.evidence.get("survivors") or ()) for e in killed):
            verb += f", {plural(survivors, 'process')} survived SIGKILL"
        return f"engine{'s' if len(killed) > 1 else ''} {names} {verb} — {_own(cause, killed[0])}"
    if e := first(events, "kill_not_done"):  # the kill decided before could not run: never "killed"
        return f"engine {e.engine} NOT killed: {e.evidence.get('why') or e.message} — act by hand"
    if e := first(events, "kill_refused"):
        return f"engine {e.engine} NOT killed, act by hand — {_own(cause, e)}"
    if e := first(events, "cache_poisoned"):
        return f"compile caches {'with zero-byte files, not moved' if e.evidence.get('dry_run') else 'moved aside'}" \
               f" — {cause}"
    fault = first_fault(events) or events[0]
    if not fault.live:
        return f"{cause} (logged before gpuwarden started; no action)"
    decisions = [d for e in events for d in e.evidence.get("decision") or ()]
    if acting := [d for d in decisions if d.get("action") in ("kill", "restart")]:
        names = ", ".join(dict.fromkeys(str(d.get("engine")) for d in acting))
        verb = "killing and restarting" if any(d["action"] == "restart" for d in acting) else "killing"
        return f"{'dry run, would be ' if all(d.get('dry_run') for d in acting) else ''}{verb} engine {names} — " \
               f"{cause.removeprefix(f'engine {names} ')}"
    if quarantine := [d for d in decisions if d.get("action") == "quarantine"]:
        return f"{cause} — " + (f"compile caches not moved ({ctx.cache_dry_run or 'dry run'})"
                                if all(d.get("dry_run") for d in quarantine) else "moving compile caches aside")
    if any(d.get("action") in ("refuse", "alert_only") for d in decisions):
        return f"{cause} — not acted on"
    return cause


def ended(earlier: list[Event], ctx: Context, end: float | None = None) -> str:
    """The title of an incident's condition that ended by itself (at `end`): what it was."""
    return f"resolved: {_cause(first_fault(earlier) or earlier[0], ctx, end)}"


def _cause(e: Event, ctx: Context, end: float | None = None) -> str:
    """`end`: when a stall ended (its length then runs to there, not to when it was judged a stall)."""
    if e.kind == "engine_stall" and (figures := e.evidence.get("figures")):
        start = stall_start(e) or e.time
        return (f"engine {e.engine} stalled {duration((end or e.time) - start)} with "
                f"{plural(figures.get('running') or 0, 'request')} running")
    if e.kind == "engine_not_answering" and isinstance(silent := (e.evidence.get("figures") or {}).get(
            "silent_seconds"), int | float):
        return f"engine {e.engine} not answering for {duration(silent)}"
    if e.kind.startswith("engine_") and (said := words(e.kind)):
        return f"engine {e.engine} {said}"
    if e.kind == "xid":
        what = f"{ctx.gpu(e.gpu)} Xid {e.evidence.get('xid')}" + \
            (" (fell off the bus)" if e.evidence.get("xid") in OFF_THE_BUS_XIDS else "")
    elif said := words(e.kind):
        what = f"{ctx.gpu(e.gpu)} {said}"
    else:
        return e.message.split(". ", 1)[0]  # its first sentence: a title is a line
    if process := e.evidence.get("process"):  # its name is the process's own choice: shown, never rendered
        what += f" by pid {process.get('pid')} ({_UNSAFE.sub('?', str(process.get('name')))})"
    return what


def _own(cause: str, e: Event) -> str:
    """The cause, without the engine's name where the title already says it."""
    return cause.removeprefix(f"engine {e.engine} ")


def _back(e: Event) -> str:
    seconds = e.evidence.get("seconds_since_kill")
    if isinstance(seconds, int | float):
        return f"first completion {duration(seconds)} after the kill"
    return e.message.removeprefix(f"{e.engine} back: ")


def repeats_title(out: Outgoing, ctx: Context) -> str:
    """A storm's follow-up: how many more of what."""
    counts = ", ".join(f"{n:,} more {key.split(':', 1)[0]}" for key, (n, _) in out.repeats.items())
    return f"{out.subject}: {counts}"
