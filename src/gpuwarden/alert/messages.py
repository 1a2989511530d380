"""Message text, pure: what the person woken at 3 a.m. reads.

The title says what broke and what gpuwarden did ("vm: engine qwen-72b killed — GPU 0 (ffff:03:00.0, Radeon AI
PRO R9700) ring timeout"). The body says when (local time and UTC), what happened in one sentence, the decision
and its reason (`evidence["decision"]`: acted, or not and why), what gpuwarden did, the evidence lines that
matter, which engines run on the GPU, what to do in the order it applies, and the incident's folder. A
follow-up on an incident says what changed and the incident so far. Each message is written twice: Markdown
for targets that render it, plain text for the others."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo

from gpuwarden.alert import runbooks
from gpuwarden.alert.storm import FOLLOW_UP_KINDS, Outgoing
from gpuwarden.kinds import GPU_LOST_KINDS
from gpuwarden.model import Event, Severity

_EVIDENCE_LINES = 12
_WORDS = {  # what broke, in words, after the GPU's or the engine's name
    "sq_intr": "shader fault (SQ interrupt)", "ring_timeout": "ring timeout", "page_fault": "page fault",
    "gpu_reset": "reset by the driver", "reset_failed": "reset failed", "device_lost": "fell off the bus",
    "gpu_missing": "missing", "gpu_unresponsive": "not answering", "gpu_wedged": "wedged", "smu_error": "SMU error",
    "ras_error": "uncorrectable memory error", "pcie_aer": "PCIe error", "gsp_error": "firmware (GSP) error",
    "engine_stall": "stalled", "engine_unresponsive": "not answering", "engine_exited": "exited",
    "engine_crash_loop": "in a crash loop", "engine_suspect": "suspect",
}


@dataclass(frozen=True)
class Context:
    """What the daemon knows that the events do not say: the host, its GPUs and engines, the reader's clock."""

    host: str
    gpus: Mapping[str, tuple[int, str | None]] = field(default_factory=dict)  # PCI address -> (index, model)
    engines: Mapping[str, frozenset[str] | None] = field(default_factory=dict)  # engine -> its GPUs (None: any)
    tz: tzinfo | None = None  # the reader's local time zone; None: the machine's

    def gpu(self, pci: str | None) -> str:
        if pci is None:
            return "a GPU"
        if pci not in self.gpus:
            return f"GPU {pci}"
        index, model = self.gpus[pci]
        return f"GPU {index} ({pci}{', ' + model if model else ''})"

    def engines_on(self, pci: str) -> list[str]:
        """The engines known to run on the GPU."""
        return sorted(name for name, gpus in self.engines.items() if gpus is not None and pci in gpus)

    def engines_maybe_on(self, pci: str) -> list[str]:
        """The engines whose GPUs are unknown: they may be on any (the policy counts them too)."""
        return sorted(name for name, gpus in self.engines.items() if gpus is None)


@dataclass(frozen=True)
class Message:
    alert_id: str
    title: str
    body: str  # Markdown
    text: str  # the same, plain
    severity: Severity  # routing: a follow-up goes where its incident's first page went
    resolved: bool  # an all-clear: a resolution, or an incident that ended well
    tags: frozenset[str]


@dataclass(frozen=True)
class _Code:
    lines: list[str]


def compose(out: Outgoing, ctx: Context, alert_id: str, incident: str | None = None) -> Message:
    """`incident`: the incident's folder, where its report and picture are."""
    every = out.earlier + out.events
    tags = {e.kind for e in every} | {e.gpu for e in every if e.gpu} | {e.engine for e in every if e.engine}
    tags |= {k.split(":", 1)[0] for k in out.repeats} | ({out.subject.split(" ", 1)[-1]} if not out.incident else set())
    if out.resolved:
        title = f"{ctx.host}: resolved — " + (_headline(out.earlier, ctx) if out.earlier else out.subject)
        blocks: list = [("What changed", _sentence(out.resolved))]
        if out.earlier:
            blocks.append(("The incident so far", _Code([_line(e, ctx) for e in out.earlier])))
        return _message(alert_id, title, blocks, incident, out, True, tags)
    title = f"{ctx.host}: {_headline(out.events, ctx, out.earlier) if out.events else _repeats_title(out, ctx)}"
    blocks = []
    if out.follow_up:
        first = out.earlier[0]
        blocks.append(("Update on", f"{_headline(out.earlier, ctx)} (first paged {_when(first.time, ctx)})"))
    if out.events:
        blocks.append(("When", _when(out.events[0].time, ctx)))
    if happened := _happened(out, ctx):
        blocks.append(("What happened", happened))
    if decisions := _decisions(out.events, ctx):
        blocks.append(("Decision", decisions))
    if lost := sorted({g for e in out.events for g in e.evidence.get("lost") or ()}):
        blocks.append(("Lost before the reboot", ", ".join(lost)))
    if found := [c for e in out.events if e.kind.startswith("gpus_") for c in e.evidence.get("changes") or
                 [_sentence(e.message)]]:
        blocks.append(("What gpuwarden found", found))
    if did := [_sentence(e.message) for e in out.events if e.kind in FOLLOW_UP_KINDS and
               not e.kind.startswith("gpus_")]:
        outcome = out.ends or _first(out.events, "engine_restart_failed")
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
    if steps := _steps(out, ctx):
        blocks.append(("What to do", steps))
    return _message(alert_id, title, blocks, incident, out, out.ends, tags)


def _message(alert_id: str, title: str, blocks: list, incident: str | None, out: Outgoing, resolved: bool,
             tags: set[str]) -> Message:
    if incident:
        blocks.append(("Incident report", f"{incident} (incident.json, timeline.png)"))
    footer = f"\n\nalert id: {alert_id}"
    return Message(alert_id, title, _render(blocks, True) + footer, _render(blocks, False) + footer, out.severity,
                   resolved, frozenset(tags))


# --- the title ---------------------------------------------------------------------------------------------

def _headline(events: list[Event], ctx: Context, earlier: list[Event] = ()) -> str:
    """What broke and what gpuwarden did, in one line."""
    fault = _first_fault([*earlier, *events])  # none: an outcome alone (its fault was told apart, or by no one)
    cause = _cause(fault, ctx) if fault else str(events[0].evidence.get("reason") or events[0].message)
    if e := _first(events, "gpus_back", "gpus_changed"):
        return e.message
    if lost := next((e for e in events if _lost(e) and e.live), None):
        # engines whose GPUs are unknown are named in the body only: a title is one line
        killed = {e.engine for e in events if e.kind == "engine_killed"}
        engines = [f"{name} (killed)" if name in killed else name for name in ctx.engines_on(lost.gpu or "")]
        return f"{_cause(lost, ctx)} — reboot needed" + (f"; on it: engine {', '.join(engines)}" if engines else "")
    if e := _first(events, "engine_restart_failed"):
        return f"engine {e.engine} NOT back after the restart — {_own(cause, e)}"
    if e := _first(events, "engine_back"):
        return f"engine {e.engine} back — {_back(e)}"
    if e := _first(events, "engine_restarting"):
        verb = "killed, restarting" if _first(events, "engine_killed") else "restarting"
        return f"engine {e.engine} {verb} — {_own(cause, e)}"
    if killed := [e for e in events if e.kind == "engine_killed"]:
        names = ", ".join(dict.fromkeys(str(e.engine) for e in killed))
        verb = "would be killed (dry run)" if all(e.evidence.get("dry_run") for e in killed) else "killed"
        if survivors := sum(len(e.evidence.get("survivors") or ()) for e in killed):
            verb += f", {survivors} process(es) survived SIGKILL"
        return f"engine{'s' if len(killed) > 1 else ''} {names} {verb} — {_own(cause, killed[0])}"
    if e := _first(events, "kill_refused"):
        return f"engine {e.engine} NOT killed, act by hand — {_own(cause, e)}"
    if _first(events, "cache_poisoned"):
        return f"compile caches moved aside — {cause}"
    fault = _first_fault(events) or events[0]
    if not fault.live:
        return f"{cause} (logged before gpuwarden started; no action)"
    decisions = [d for e in events for d in e.evidence.get("decision") or ()]
    if acting := [d for d in decisions if d.get("action") in ("kill", "restart")]:
        names = ", ".join(dict.fromkeys(str(d.get("engine")) for d in acting))
        verb = "killing and restarting" if any(d["action"] == "restart" for d in acting) else "killing"
        return f"{'dry run, would be ' if all(d.get('dry_run') for d in acting) else ''}{verb} engine {names} — " \
               f"{cause}"
    if quarantine := [d for d in decisions if d.get("action") == "quarantine"]:
        return f"{cause} — " + ("compile caches not moved (dry run)" if all(d.get("dry_run") for d in quarantine)
                                else "moving compile caches aside")
    if any(d.get("action") in ("refuse", "alert_only") for d in decisions):
        return f"{cause} — not acted on"
    return cause


def _cause(e: Event, ctx: Context) -> str:
    if e.kind == "engine_stall" and (figures := e.evidence.get("figures")):
        return (f"engine {e.engine} stalled {figures.get('stalled_seconds', 0):.0f} s with "
                f"{figures.get('running') or 0:.0f} request(s) running")
    if e.kind.startswith("engine_") and e.kind in _WORDS:
        return f"engine {e.engine} {_WORDS[e.kind]}"
    if e.kind == "xid":
        what = f"{ctx.gpu(e.gpu)} Xid {e.evidence.get('xid')}" + \
            (" (fell off the bus)" if e.evidence.get("xid") in runbooks.OFF_THE_BUS_XIDS else "")
    elif e.kind in _WORDS:
        what = f"{ctx.gpu(e.gpu)} {_WORDS[e.kind]}"
    else:
        return e.message.split(". ", 1)[0]  # its first sentence: a title is a line
    if process := e.evidence.get("process"):
        what += f" by pid {process.get('pid')} ({process.get('name')})"
    return what


def _own(cause: str, e: Event) -> str:
    """The cause, without the engine's name where the title already says it."""
    return cause.removeprefix(f"engine {e.engine} ")


def _back(e: Event) -> str:
    seconds = e.evidence.get("seconds_since_kill")
    if isinstance(seconds, int | float):
        return f"first completion {seconds:.0f} s after the kill"
    return e.message.removeprefix(f"{e.engine} back: ")


def _repeats_title(out: Outgoing, ctx: Context) -> str:
    """A storm's follow-up: how many more of what."""
    counts = ", ".join(f"{n:,} more {key.split(':', 1)[0]}" for key, (n, _) in out.repeats.items())
    return f"{out.subject}: {counts}"


# --- the body ----------------------------------------------------------------------------------------------

def _happened(out: Outgoing, ctx: Context) -> str | list[str]:
    """The faults in a sentence each (what gpuwarden did and found has its own block)."""
    faults = [e for e in out.events if e.kind not in FOLLOW_UP_KINDS]
    lines = [_sentence(e.message) + (f" ({e.count:,} lines)" if e.count > 1 else "")
             + ("" if e.live else " Logged before gpuwarden started: history, never acted on.") for e in faults]
    lines += [f"And {n:,} more `{key.split(':', 1)[0]}` since {_clock(since, ctx)}."
              for key, (n, since) in out.repeats.items()]
    if out.quiet:
        lines.append(f"And {out.quiet:,} more event(s) of this incident since the last message (in its report).")
    return lines[0] if len(lines) == 1 else lines


def _decisions(events: list[Event], ctx: Context) -> list[str]:
    said: list[str] = []
    for e in events:
        if "decision" not in e.evidence or e.kind in FOLLOW_UP_KINDS:  # an outcome is no question for the policy
            continue
        if not e.evidence["decision"]:
            said.append(_no_action(e, ctx))
        for d in e.evidence["decision"]:
            said.append(_decision(d))
    return list(dict.fromkeys(said))


def _decision(d: dict) -> str:
    engine, reason, action = d.get("engine"), d.get("reason") or "no reason given", d.get("action")
    dry = "dry run, " if d.get("dry_run") else ""
    if action == "kill":
        return f"{dry}kill {engine}: {reason}."
    if action == "restart":
        return f"{dry}kill and restart {engine}: {reason}."
    if action == "quarantine":
        return ("dry run: move nothing" if d.get("dry_run") else "move the poisoned compile caches aside") + \
            f" ({reason.replace('_', ' ')})."
    if action == "alert_only":
        return f"no action on {engine}: {reason}."
    if action == "refuse":
        return f"no action{' on ' + engine if engine else ''}: {reason}" + \
            (" — a person must act." if d.get("by_hand") else ".")
    if action == "suspect":
        return f"watch {engine} closely: {reason}."
    return f"{action} {engine or ''}: {reason}."


def _no_action(e: Event, ctx: Context) -> str:
    if _lost(e):
        return "nothing more to do for a lost GPU: only a reboot brings it back (gpuwarden never resets or " \
               "unbinds it)."
    if e.gpu and e.kind not in GPU_LOST_KINDS and not ctx.engines_on(e.gpu) and not ctx.engines_maybe_on(e.gpu):
        return f"no action: none of gpuwarden's engines runs on {ctx.gpu(e.gpu)}."
    return "no action: gpuwarden reports this kind of event and does not act on it."


def _evidence(events: list[Event]) -> list[str]:
    lines: list[str] = []
    for event in events:
        lines += event.evidence.get("lines") or ([event.evidence["line"]] if "line" in event.evidence else [])
        if process := event.evidence.get("process"):
            lines.append(f"process the kernel named: pid {process.get('pid')} ({process.get('name')})")
        lines += [f"{k}: {v}" for k, v in (event.evidence.get("figures") or {}).items() if v is not None]
    lines = list(dict.fromkeys(lines))
    return lines[:_EVIDENCE_LINES] + ([f"... ({len(lines) - _EVIDENCE_LINES} more lines)"]
                                      if len(lines) > _EVIDENCE_LINES else [])


def _steps(out: Outgoing, ctx: Context) -> list[str]:
    """What to do, in the order it applies: the hardware's worst state first, then each engine, then the rest."""
    events = out.events
    if out.ends:
        return ["Nothing to do now." + (" Check that the engines came back: `gpuwarden status`."
                                        if _first(events, "gpus_back") else "")]
    gone = any(_lost(e) for e in [*out.earlier, *events]) and not _first(events, "gpus_back")
    keys = runbooks.ordered([k for e in events for k in _keys(e)])
    refused = {e.engine for e in events if e.kind == "kill_refused"}  # the decision was kill; the kill was not
    steps = []
    if not all(e.live for e in events):
        steps.append("It was logged before gpuwarden started (an earlier boot, or before the daemon ran): check "
                     "the GPU now with `gpuwarden doctor` and `gpuwarden status`; if it is healthy, nothing else is "
                     "needed.")
    steps += [runbooks.RUNBOOKS[k] for k in keys if k in runbooks.HARDWARE]
    for e in events:
        for d in e.evidence.get("decision") or ():
            if d.get("engine") in refused and d.get("action") in ("kill", "restart"):
                d = {**d, "action": "refuse", "by_hand": True, "reason": "the kill was refused (see above)"}
            steps.append(runbooks.engine_step(d, gone) or "")
            if d.get("action") == "refuse" and d.get("by_hand"):
                keys = [k for k in keys if k != "kill_refused"]  # said for this engine, by name
            if d.get("action") == "refuse" and not d.get("by_hand") and (p := e.evidence.get("process")):
                steps.append(f"Find who runs pid {p.get('pid')} ({p.get('name')}): `ps -o user,lstart,cmd -p "
                             f"{p.get('pid')}`. Its process faulted {ctx.gpu(e.gpu)}, which {d.get('engine')} "
                             "shares; gpuwarden kills an engine only for a fault of its own processes. If the GPU "
                             "hangs next, the engines on it go with it: a reset or a device lost follows.")
                keys = [k for k in keys if k != "gpu_fault"]  # about the engine's own requests: not this case
            if d.get("action") == "quarantine" and d.get("dry_run"):
                steps.append("gpuwarden moved nothing ([cache] dry_run, or on_crash_loop = \"alert\"): look for "
                             "the zero-byte files yourself, as the next step says.")
    if "cache_poisoned" in keys:
        keys = [k for k in keys if k != "crash_loop"]  # what it tells to do is done
    steps += [runbooks.RUNBOOKS[k] for k in keys if k not in runbooks.HARDWARE]
    return list(dict.fromkeys(s for s in steps if s))


def _keys(e: Event) -> list[str]:
    if e.kind == "gpus_changed":  # a GPU missing, and one that came back different, are two things to do
        return ["gpus_missing"] * bool(e.evidence.get("missing")) + ["gpus_changed"] * bool(e.evidence.get("changed"))
    key = runbooks.key_for(e.kind, e.evidence.get("runbook"), e.evidence.get("xid"))
    return [key] if key else []


# --- small pieces ------------------------------------------------------------------------------------------

def _first(events: list[Event], *kinds: str) -> Event | None:
    return next((e for e in events if e.kind in kinds), None)


def _first_fault(events: list[Event]) -> Event | None:
    return next((e for e in events if e.kind not in FOLLOW_UP_KINDS), None)


def _lost(e: Event) -> bool:
    return (e.kind in GPU_LOST_KINDS and e.kind != "xid") or e.evidence.get("xid") in runbooks.OFF_THE_BUS_XIDS


def _line(e: Event, ctx: Context) -> str:
    return f"{_clock(e.time, ctx)}  {e.message}"


def _sentence(text: str) -> str:
    text = text.strip()  # not capitalised: it may begin with an engine's name
    return text + ("" if text.endswith((".", "!", "?")) else ".")


def _when(stamp: float, ctx: Context) -> str:
    local = datetime.fromtimestamp(stamp, ctx.tz) if ctx.tz else datetime.fromtimestamp(stamp).astimezone()
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()} ({datetime.fromtimestamp(stamp, UTC):%H:%M:%S} UTC)"


def _clock(stamp: float | None, ctx: Context) -> str:
    if not stamp:
        return "?"
    return f"{datetime.fromtimestamp(stamp, ctx.tz) if ctx.tz else datetime.fromtimestamp(stamp):%H:%M:%S}"


def _render(blocks: list, markdown: bool) -> str:
    parts = []
    for label, content in blocks:
        head = f"**{label}**" if markdown else label
        if isinstance(content, _Code):
            lines = "\n".join(content.lines)
            parts.append(f"{head}\n```\n{lines}\n```" if markdown else
                         f"{head}:\n" + "\n".join(f"    {line}" for line in content.lines))
        elif isinstance(content, list):
            numbered = label == "What to do"
            items = [f"{f'{i}.' if numbered else '-'} {item}" for i, item in enumerate(content, 1)]
            parts.append(f"{head}\n" + "\n".join(items) if markdown else
                         f"{head}:\n" + "\n".join(f"  {_plain(item)}" for item in items))
        else:
            parts.append(f"{head}: {content}" if markdown else f"{head}: {_plain(content)}")
    return "\n\n".join(parts)


def _plain(text: str) -> str:
    return text.replace("`", "")
