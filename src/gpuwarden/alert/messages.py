"""Message text, pure: what the person woken at 3 a.m. reads.

The title (titles.py) says what broke and what gpuwarden did. The body says when (local time and UTC), what
happened in one sentence, the decision and its reason (`evidence["decision"]`: acted, or not and why), what
gpuwarden did, the evidence lines that matter, which engines run on the GPU, what to do in the order it applies
(steps.py), and the incident's folder. A follow-up on an incident says what changed and the incident so far.
Each message is written twice: Markdown for targets that render it, plain text for the others."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuwarden.alert.context import Context, first, is_lost
from gpuwarden.alert.sentences import sentence, stall_start
from gpuwarden.alert.steps import what_to_do
from gpuwarden.alert.storm import FOLLOW_UP_KINDS, Outgoing
from gpuwarden.alert.titles import ended, headline, repeats_title
from gpuwarden.alert.words import clock, figure, plural, span, when
from gpuwarden.core.eventkinds import GPU_LOST_KINDS
from gpuwarden.core.model import LOGGED_AT, Event, Severity

_EVIDENCE_LINES = 12
_MARKS = re.compile(r"[\\*_\[\]<>#|~]")  # what Markdown would read as emphasis, a link, HTML, a heading, a table


@dataclass(frozen=True)
class Message:
    alert_id: str
    title: str
    body: str  # Markdown
    text: str  # the same, plain
    severity: Severity  # routing: a follow-up goes where its incident's first page went
    resolved: bool  # an all-clear: a resolution, or an incident that ended well
    tags: frozenset[str]
    steps: tuple[str, ...] = ()  # what to do, plain (the status page shows it for the open incident)


@dataclass(frozen=True)
class _Code:
    lines: list[str]


def compose(out: Outgoing, ctx: Context, alert_id: str, incident: str | None = None) -> Message:
    """`incident`: the incident's folder, where its report and picture are."""
    every = out.earlier + out.events
    tags = {e.kind for e in every} | {e.gpu for e in every if e.gpu} | {e.engine for e in every if e.engine}
    tags |= {k.split(":", 1)[0] for k in out.repeats} | ({out.subject.split(" ", 1)[-1]} if not out.incident else set())
    if out.resolved:
        title = f"{ctx.host}: " + (ended(out.earlier, ctx, out.at) if out.earlier else f"resolved: {out.subject}")
        blocks: list = [("What changed", _sentence(out.resolved))]
        if lasted := _lasted([*out.earlier, *([out.about] if out.about else [])], out.at, ctx):
            blocks.insert(0, ("When", lasted))
        if out.earlier:
            blocks.append(("The incident so far", _Code([_line(e, ctx) for e in out.earlier])))
        return _message(alert_id, title, blocks, incident, out, True, tags)
    title = f"{ctx.host}: {headline(out.events, ctx, out.earlier) if out.events else repeats_title(out, ctx)}"
    blocks = []
    if out.follow_up:
        paged = out.earlier[0].time
        blocks.append(("Update on", f"{headline(out.earlier, ctx)} (first paged {when(paged, ctx.tz)})"))
    if out.events:
        blocks.append(("When", _when(out.events[0], ctx)))
    if happened := _happened(out, ctx):
        blocks.append(("What happened", happened))
    if decisions := _decisions(out.events, ctx):
        blocks.append(("Decision", decisions))
    if lost := sorted({g for e in out.events for g in e.evidence.get("lost") or ()}):
        blocks.append(("Lost before the reboot", ", ".join(lost)))
    if found := [c for e in out.events if e.kind.startswith("gpus_") for c in e.evidence.get("changes") or
                 [sentence(e, ctx)]]:
        blocks.append(("What gpuwarden found", found))
    if did := [_line(e, ctx) for e in out.events if e.kind in FOLLOW_UP_KINDS and
               not e.kind.startswith("gpus_")]:
        outcome = out.ends or first(out.events, "engine_restart_failed")
        blocks.append(("Outcome" if outcome else "What gpuwarden did", did))
    if evidence := _evidence(out.events):
        blocks.append(("Evidence", _Code(evidence)))
    for gpu in dict.fromkeys(e.gpu for e in out.events if e.gpu and not out.ends):
        engines, maybe = ctx.engines_on(gpu), ctx.engines_maybe_on(gpu)
        text = ", ".join(engines) if engines else "none known"
        if maybe:
            text += f"; perhaps (their GPUs are unknown): {', '.join(maybe)}"
        blocks.append((f"Engines on {ctx.gpu(gpu)}", text))
    if out.follow_up:
        blocks.append(("The incident so far", _Code([_line(e, ctx) for e in every])))
    if steps := what_to_do(out, ctx):
        blocks.append(("What to do", steps))
    return _message(alert_id, title, blocks, incident, out, out.ends, tags, steps)


def _when(e: Event, ctx: Context) -> str:
    """When it happened: for history, when its line was logged (its `time` is when gpuwarden read it, at start)."""
    if e.live:
        return when(e.time, ctx.tz)
    if logged := e.evidence.get(LOGGED_AT):
        return f"{when(logged, ctx.tz)}, logged before gpuwarden started (read at {clock(e.time, ctx.tz)})"
    return f"logged before gpuwarden started, at a time its log does not say (read {when(e.time, ctx.tz)})"


def _message(alert_id: str, title: str, blocks: list, incident: str | None, out: Outgoing, resolved: bool,
             tags: set[str], steps: list[str] = ()) -> Message:
    if incident:
        blocks.append(("Incident report", f"`{incident}` (incident.json, timeline.svg)"))
    footer = f"\n\nalert id: {alert_id}"
    return Message(alert_id, title, _render(blocks, True) + footer, _render(blocks, False) + footer, out.severity,
                   resolved, frozenset(tags), tuple(_plain(s) for s in steps))


# --- the body ----------------------------------------------------------------------------------------------

def _happened(out: Outgoing, ctx: Context) -> str | list[str]:
    """The faults in a sentence each (what gpuwarden did and found has its own block)."""
    faults = [e for e in out.events if e.kind not in FOLLOW_UP_KINDS]
    lines = [sentence(e, ctx) + (f" ({plural(e.count, 'line')})" if e.count > 1 else "")
             + ("" if e.live else " Logged before gpuwarden started: history, never acted on.") for e in faults]
    lines += [f"And {n:,} more `{key.split(':', 1)[0]}` since {clock(since, ctx.tz)}."
              for key, (n, since) in out.repeats.items()]
    if out.quiet:
        lines.append(f"And {plural(out.quiet, 'more event')} of this incident since the last message (in its "
                     "report).")
    return lines[0] if len(lines) == 1 else lines


def _decisions(events: list[Event], ctx: Context) -> list[str]:
    said: list[str] = []
    for e in events:
        if "decision" not in e.evidence or e.kind in FOLLOW_UP_KINDS:  # an outcome is no question for the policy
            continue
        if not e.evidence["decision"]:
            said.append(_no_action(e, ctx))
        for d in e.evidence["decision"]:
            said.append(_decision(d, ctx))
    return list(dict.fromkeys(said))


def _decision(d: dict, ctx: Context) -> str:
    engine, reason, action = d.get("engine"), d.get("reason") or "no reason given", d.get("action")
    dry = "dry run, " if d.get("dry_run") else ""
    if action == "kill":
        return f"{dry}kill {engine}: {reason}."
    if action == "restart":
        return f"{dry}kill and restart {engine}: {reason}."
    if action == "quarantine":
        if d.get("dry_run"):
            return f"move no compile cache ({ctx.cache_dry_run or 'dry run'})."
        return f"move the poisoned compile caches aside ({reason.replace('_', ' ')})."
    if action == "alert_only":
        return f"no action on {engine}: {reason}."
    if action == "refuse":
        return f"no action{' on ' + engine if engine else ''}: {reason}" + \
            (" — a person must act." if d.get("by_hand") else ".")
    if action == "suspect":
        return f"watch {engine} closely: {reason}."
    return f"{action} {engine or ''}: {reason}."


def _no_action(e: Event, ctx: Context) -> str:
    if is_lost(e):
        return "nothing more to do for a lost GPU: only a reboot brings it back (gpuwarden never resets or " \
               "unbinds it)."
    if e.kind == "engine_not_answering":
        return "no action: nothing of it answers, so there is nothing to kill or restart."
    if e.gpu and e.kind not in GPU_LOST_KINDS and not ctx.engines_on(e.gpu) and not ctx.engines_maybe_on(e.gpu):
        return f"no action: none of gpuwarden's engines runs on {ctx.gpu(e.gpu)}."
    return "no action: gpuwarden reports this kind of event and does not act on it."


def _evidence(events: list[Event]) -> list[str]:
    lines: list[str] = []
    for event in events:
        lines += event.evidence.get("lines") or ([event.evidence["line"]] if "line" in event.evidence else [])
        if process := event.evidence.get("process"):
            lines.append(f"process the kernel named: pid {process.get('pid')} ({process.get('name')})")
        lines += [figure(k, v) for k, v in (event.evidence.get("figures") or {}).items() if v is not None]
    lines = list(dict.fromkeys(lines))
    return lines[:_EVIDENCE_LINES] + ([f"... ({len(lines) - _EVIDENCE_LINES} more lines)"]
                                      if len(lines) > _EVIDENCE_LINES else [])


# --- small pieces ------------------------------------------------------------------------------------------

def _line(e: Event, ctx: Context) -> str:
    return f"{clock(e.time, ctx.tz)}  {sentence(e, ctx)}"


def _lasted(events: list[Event], end: float | None, ctx: Context) -> str | None:
    """How long a condition that ended by itself lasted, from when it began (a stall: its last progress)."""
    fault = next((e for e in events if e.kind not in FOLLOW_UP_KINDS), None)
    if fault is None or end is None:
        return None
    return span(stall_start(fault) or fault.time, end, ctx.tz)


def _sentence(text: str) -> str:
    text = text.strip()  # not capitalised: it may begin with an engine's name
    return text + ("" if text.endswith((".", "!", "?")) else ".")


def _render(blocks: list, markdown: bool) -> str:
    text = _markdown if markdown else _plain
    parts = []
    for label, content in blocks:
        head = f"**{label}**" if markdown else label
        if isinstance(content, _Code):
            # a line of the log may hold backticks (a process names itself): it must not end the fence
            lines = "\n".join(line.replace("`", "'") for line in content.lines)
            parts.append(f"{head}\n```\n{lines}\n```" if markdown else
                         f"{head}:\n" + "\n".join(f"    {line}" for line in content.lines))
        elif isinstance(content, list):
            numbered = label == "What to do"
            items = [f"{f'{i}.' if numbered else '-'} {text(item)}" for i, item in enumerate(content, 1)]
            parts.append(f"{head}\n" + "\n".join(items) if markdown else
                         f"{head}:\n" + "\n".join(f"  {item}" for item in items))
        else:
            parts.append(f"{head}: {text(content)}")
    return "\n\n".join(parts)


def _plain(text: str) -> str:
    return text.replace("`", "")


def _markdown(text: str) -> str:
    """Text as Markdown that shows it as it is: what a process or a log line brought in (a process may name
    itself `[x](http://…)`) renders as text, not as a link or emphasis. Code spans (`…`, ours) stay code."""
    spans = text.split("`")
    return "`".join(part if i % 2 and i + 1 < len(spans) else _MARKS.sub(r"\\\g<0>", part)  # a closed code span
                    for i, part in enumerate(spans))
