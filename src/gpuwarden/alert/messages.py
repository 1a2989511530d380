"""Message text, pure: what happened in plain words, the evidence, what gpuwarden did, what to do next."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gpuwarden.alert.runbooks import runbook_for
from gpuwarden.alert.storm import Outgoing
from gpuwarden.kinds import ACTION_KINDS
from gpuwarden.model import Severity

_EVIDENCE_LINES = 12


@dataclass(frozen=True)
class Message:
    alert_id: str
    title: str
    body: str
    severity: Severity
    resolved: bool
    tags: frozenset[str]


def compose(out: Outgoing, host: str, alert_id: str, incident: str | None = None) -> Message:
    tags = {out.subject.split(" ", 1)[-1]} | {e.kind for e in out.events}
    tags |= {k.split(":", 1)[0] for k in out.repeats}
    if out.resolved:
        title = f"[RESOLVED] {host}: {out.subject}"
        return Message(alert_id, title, f"{out.resolved}\n\nalert id: {alert_id}", out.severity, True,
                       frozenset(tags))
    kinds = list(dict.fromkeys([e.kind for e in out.events] + [k.split(":", 1)[0] for k in out.repeats]))
    title = f"[{str(out.severity).upper()}] {', '.join(kinds)} on {host}: {out.subject}"
    sections = []
    happened = [f"- **{e.severity}** `{e.kind}`{'' if e.live else ' (history)'}: {e.message}"
                + (f" (x{e.count})" if e.count > 1 else "") for e in out.events if e.kind not in ACTION_KINDS]
    happened += [f"- `{key.split(':', 1)[0]}`: and {n:,} more since {_clock(since)}"
                 for key, (n, since) in out.repeats.items()]
    sections.append("**What happened**\n" + "\n".join(happened))
    evidence = _evidence(out)
    if evidence:
        sections.append("**Evidence**\n```\n" + "\n".join(evidence) + "\n```")
    actions = [f"- {e.message}" for e in out.events if e.kind in ACTION_KINDS]
    if not all(e.live for e in out.events):
        actions.append("- nothing about the (history) lines: they were logged before gpuwarden started, "
                       "and history never kills or moves anything")
    sections.append("**What gpuwarden did**\n" + ("\n".join(actions) or "- recorded the events; no action"))
    runbooks = dict.fromkeys(filter(None, (runbook_for(e.kind, e.evidence.get("runbook")) for e in out.events)))
    if runbooks:
        sections.append("**What to do**\n" + "\n".join(f"- {r}" for r in runbooks))
    if incident:
        sections.append(f"**Incident report**: `{incident}` (incident.json; timeline.svg attached where the "
                        "target takes attachments)")
    sections.append(f"alert id: {alert_id}")
    return Message(alert_id, title, "\n\n".join(sections), out.severity, False, frozenset(tags))


def _evidence(out: Outgoing) -> list[str]:
    lines: list[str] = []
    for event in out.events:
        lines += event.evidence.get("lines") or ([event.evidence["line"]] if "line" in event.evidence else [])
        lines += [f"{k}: {v}" for k, v in event.evidence.get("figures", {}).items()]
    return lines[:_EVIDENCE_LINES] + ([f"... ({len(lines) - _EVIDENCE_LINES} more lines)"]
                                      if len(lines) > _EVIDENCE_LINES else [])


def _clock(stamp: float | None) -> str:
    return datetime.fromtimestamp(stamp).strftime("%H:%M:%S") if stamp else "?"
