"""What happened and what gpuwarden did, one sentence per event, written from what the event's evidence and the
daemon (Context) know rather than from the event's own log message: real counts, names and times, in the one
voice of alert/words.py.

A new event kind gets its words here: add `SENTENCES["its_kind"] = lambda e, ctx: "..."` (and, where a
person has something to do, a runbook in runbooks.py, a title word in titles.py). A kind without an entry is
told by its own message, which its maker must then write in the same voice."""

from __future__ import annotations

from collections.abc import Callable

from gpuwarden.alert.context import Context
from gpuwarden.alert.words import clock, duration, plural, span
from gpuwarden.core.model import CROWD, Event


def sentence(e: Event, ctx: Context) -> str:
    """The event in one sentence, ending with a full stop."""
    said = SENTENCES.get(e.kind)
    text = (said(e, ctx) if said else None) or e.message
    text = text.strip().removesuffix(".")  # not capitalised: it may begin with an engine's name
    if (crowd := e.evidence.get(CROWD)) and crowd not in text:  # said by the event's own message already
        text += f" (one of the {crowd}, alerted together)"
    return text + ("" if text.endswith(("!", "?")) else ".")


def stall_start(e: Event) -> float | None:
    """When a stall's engine last made progress (the event is when it was judged stalled)."""
    seconds = (e.evidence.get("figures") or {}).get("stalled_seconds")
    return e.time - seconds if isinstance(seconds, int | float) else None


def _stall(e: Event, ctx: Context) -> str | None:
    figures = e.evidence.get("figures") or {}
    running, start = figures.get("running"), stall_start(e)
    if not isinstance(running, int | float) or start is None:
        return None
    text = (f"{e.engine} had {plural(running, 'request')} running and processed no token "
            f"{span(start, e.time, ctx.tz)}")
    if isinstance(threshold := figures.get("threshold_seconds"), int | float):
        text += f"; its stall threshold is {duration(threshold)}"
    if e.evidence.get("spinning") and isinstance(cpu := figures.get("cpu_percent"), int | float):
        text += f"; a process of it spun at {round(cpu)} % CPU, the classic hang"
    if e.evidence.get("suspicion"):
        text += f"; under suspicion since {e.evidence['suspicion']}"
    if e.evidence.get("source") == "log":
        text += " (read from its own log)"
    if canary := e.evidence.get("canary"):
        text += f"; a one-token canary: {canary.get('detail') or canary.get('outcome')}"
    return text


def _unresponsive(e: Event, ctx: Context) -> str | None:
    figures = e.evidence.get("figures") or {}
    silent, failures = figures.get("silent_seconds"), figures.get("failures")
    if not isinstance(silent, int | float) or not isinstance(failures, int | float):
        return None
    running, processes = figures.get("running"), figures.get("processes")
    text = (f"{e.engine} did not answer {span(e.time - silent, e.time, ctx.tz)} "
            f"({plural(failures, 'try', 'tries')}, the last: {e.evidence.get('error') or 'no answer'})")
    if isinstance(processes, int | float):
        text += f" while its {plural(processes, 'process')} lived"
    return text + ("; " + (f"{plural(running, 'request')} were running when it last answered" if running else
                           "no request was running when it last answered" if running is not None else
                           "it has never answered"))


def pids(processes: list) -> str:
    """`pid 4303 (python3)`, `pids 4303 (python3), 4304`: the killer's "pid name" entries (a bare pid in old
    events) as a person reads them, and a pid alone where a command needs it."""
    said = [f"{p} ({n})" if n else p for p, _, n in (str(x).partition(" ") for x in processes)]
    return f"pid{'s' if len(said) > 1 else ''} {', '.join(said)}"


def _killed(e: Event, ctx: Context) -> str | None:
    ev = e.evidence
    if ev.get("unfinished") or "terminated" not in ev:
        return None  # the signals' wait never ended: its own message says what is known
    procs = len(ev.get("terminated") or ()) + len(ev.get("killed") or ())  # ended by SIGTERM, and by SIGKILL
    if ev.get("dry_run"):
        return f"dry run: would have killed {e.engine}'s {plural(procs, 'process')}"
    text = f"killed {e.engine}: {plural(procs, 'process')}"
    if killed := ev.get("killed"):
        text += f", {len(killed)} of them only by SIGKILL"
    if survivors := ev.get("survivors"):
        text += f"; {plural(len(survivors), 'process')} survived SIGKILL: {pids(survivors)}"
    return text  # a restart that follows is an event of its own (engine_restarting)


def _supervisor(e: Event, ctx: Context) -> str:
    runs = ctx.runs_of(e.engine)
    return f"systemd unit {runs.unit}" if runs.unit else f"Docker container {runs.container}" if runs.container \
        else str(e.evidence.get("supervisor") or "supervisor")


def _restarting(e: Event, ctx: Context) -> str:
    return (f"asked the {_supervisor(e, ctx)} to start {e.engine} again; it is back once its tokens move or a real "
            "completion returns")


def _back(e: Event, ctx: Context) -> str | None:
    killed, started = e.evidence.get("seconds_since_kill"), e.evidence.get("seconds_since_start")
    if isinstance(killed, int | float):
        return f"{e.engine} back: its first real completion came {duration(killed)} after the kill"
    if isinstance(started, int | float):
        return f"{e.engine} back: its first real completion came {duration(started)} after it started again"
    return None


def _caches(e: Event, ctx: Context) -> str | None:
    moved, failed = e.evidence.get("moved"), e.evidence.get("failed") or []
    if moved is None:
        return None
    verb = "would have moved" if e.evidence.get("dry_run") else "moved"
    said = [f"{verb} {m['dir']} aside to {m['to']} ({plural(m.get('zero_byte_files') or 0, 'zero-byte file')})"
            for m in moved]
    said += [f"could not move {f['dir']} ({f['error']})" for f in failed]
    return "; ".join(said) or f"{verb} nothing"


def _refused(e: Event, ctx: Context) -> str:
    """A kill not done: why (the actuator's words after "but"), and, for a spent budget, the kills that spent
    it."""
    _, but, refusal = e.message.removesuffix(": act by hand").partition(" but ")
    text = f"did not kill {e.engine} ({e.evidence.get('reason') or 'as decided'}): {refusal}" if but else e.message
    if "budget" in text and (kills := ctx.kills.get(e.engine or "")):
        text += f", by the kills at {', '.join(clock(t, ctx.tz) for t in kills)}"
    return text


def _not_answering(e: Event, ctx: Context) -> str | None:
    figures = e.evidence.get("figures") or {}
    silent = figures.get("silent_seconds")
    if not isinstance(silent, int | float):
        return None
    since = e.evidence.get("since") or "its start"
    return (f"{e.engine} has not answered at {e.evidence.get('where') or 'its address'} "
            f"{span(e.time - silent, e.time, ctx.tz)}, since {since} (last error: "
            f"{e.evidence.get('error') or 'none'})")


SENTENCES: dict[str, Callable[[Event, Context], str | None]] = {
    "engine_stall": _stall,
    "engine_unresponsive": _unresponsive,
    "engine_not_answering": _not_answering,
    "engine_killed": _killed,
    "engine_restarting": _restarting,
    "engine_back": _back,
    "cache_poisoned": _caches,
    "kill_refused": _refused,
}
