"""What to do, pure, in the order it applies: the hardware's worst state first (a lost GPU: the reboot, and no
step that needs a live GPU), then each engine after what gpuwarden decided about it, then the rest."""

from __future__ import annotations

from gpuwarden.alert import runbooks
from gpuwarden.alert.context import Context, first, is_lost
from gpuwarden.alert.sentences import pids, stall_start
from gpuwarden.alert.storm import Outgoing
from gpuwarden.alert.words import plural
from gpuwarden.core.model import Event


def what_to_do(out: Outgoing, ctx: Context) -> list[str]:
    """What to do, in the order it applies: the hardware's worst state first, then each engine, then the rest."""
    events = out.events
    if out.ends:
        return ["Nothing to do now." + (" gpuwarden watches the engines as they start: one that does not answer "
                                        "is paged (engine not answering)." if first(events, "gpus_back") else "")]
    gone = any(is_lost(e) for e in [*out.earlier, *events]) and not first(events, "gpus_back")
    keys = runbooks.ordered([k for e in events for k in _keys(e)])
    # the decision was kill; the kill was not
    refused = {e.engine: "the kill was refused" if e.kind == "kill_refused" else "the kill could not be done"
               for e in events if e.kind in ("kill_refused", "kill_not_done")}
    killed = {e.engine for e in [*out.earlier, *events] if e.kind == "engine_killed"}
    steps = []
    if not all(e.live for e in events):
        steps.append("It was logged before gpuwarden started (an earlier boot, or before the daemon ran): check "
                     "the GPU now with `gpuwarden doctor` and `gpuwarden status`; if it is healthy, nothing else is "
                     "needed.")
    steps += [runbooks.RUNBOOKS[k] for k in keys if k in runbooks.HARDWARE]
    for e in events:
        for d in e.evidence.get("decision") or ():
            if d.get("engine") in refused and d.get("action") in ("kill", "restart"):
                d = {**d, "action": "refuse", "by_hand": True, "reason": f"{refused[d['engine']]} (see above)"}
            if d.get("action") == "kill" and not d.get("dry_run") and not gone and d.get("engine") not in killed:
                # decided, not done yet: a page never says killed before the outcome is known
                steps.append(f"Nothing to do for {d.get('engine') or 'the engine'} yet: gpuwarden is killing it and "
                             "pages again with the outcome (killed, or not killed and why).")
                continue
            steps.append(runbooks.engine_step(d, gone, ctx.runs_of(d.get("engine")).restart()) or "")
            if d.get("action") == "refuse" and d.get("by_hand"):
                keys = [k for k in keys if k not in ("kill_refused", "kill_not_done")]  # said for it, by name
            if d.get("action") == "refuse" and not d.get("by_hand") and (p := e.evidence.get("process")):
                steps.append(f"Find who runs pid {p.get('pid')} ({p.get('name')}): `ps -o user,lstart,cmd -p "
                             f"{p.get('pid')}`. Its process faulted {ctx.gpu(e.gpu)}, which {d.get('engine')} "
                             "shares; gpuwarden kills an engine only for a fault of its own processes. If the GPU "
                             "hangs next, the engines on it go with it: a reset or a device lost follows.")
                keys = [k for k in keys if k != "gpu_fault"]  # about the engine's own requests: not this case
            if d.get("action") == "quarantine" and d.get("dry_run"):
                steps.append(f"gpuwarden moved no cache: {ctx.cache_dry_run or 'a dry run'}.")
            elif d.get("action") == "quarantine" and not first(events, "cache_poisoned"):
                # decided, not done yet: what the runbook tells a person to do is what gpuwarden is doing
                keys = [k for k in keys if k != "crash_loop"]
                engine = d.get("engine") or e.engine or "the engine"  # the crash loop's engine
                its_log = ctx.runs_of(engine).logs(None) if engine != "the engine" else None
                steps.append(f"Nothing to do yet: gpuwarden looks for zero-byte files in {engine}'s compile caches "
                             "and moves each such cache aside (renamed, never deleted), then pages what it moved. "
                             f"If it moves none, {engine}'s own log says why it dies"
                             + (f": {its_log}." if its_log else "."))
    for e in events:
        if e.kind == "engine_killed" and (left := e.evidence.get("survivors")):
            steps.append(f"{plural(len(left), 'process')} of {e.engine} survived SIGKILL, {pids(left)}: "
                         "stuck in the kernel, most likely in the GPU driver, holding its GPU memory. Look where: "
                         f"`cat /proc/{str(left[0]).split()[0]}/wchan`. Only a reboot ends it: drain the box and "
                         "reboot.")
    for e in events:  # a refusal whose decision was paged before (a follow-up): said for its engine, by name
        if e.kind == "kill_refused" and "kill_refused" in keys:
            how = ctx.runs_of(e.engine).restart()
            steps.append(runbooks.engine_step({"action": "refuse", "by_hand": True, "engine": e.engine}, gone, how))
            keys = [k for k in keys if k != "kill_refused"]
    for e in events:  # a supervisor that did not start it: the one the daemon asked, by name, not every kind
        key = runbooks.key_for(e.kind, e.evidence.get("runbook"))
        if key in ("restart_retrying", "restart_not_started") and key in keys and (said := _supervisor_step(e, key)):
            steps.append(said)
            keys = [k for k in keys if k != key]
    if "cache_poisoned" in keys:
        keys = [k for k in keys if k != "crash_loop"]  # what it tells to do is done
        unmoved = [m["dir"] for e in events if e.kind == "cache_poisoned" and e.evidence.get("dry_run")
                   for m in e.evidence.get("moved") or ()]
        if unmoved:  # found, not moved (on_crash_loop = "alert", or [cache] dry_run): the person moves them
            keys = [k for k in keys if k != "cache_poisoned"]
            steps.append("Zero-byte files in a compile cache are the mark of a write cut by a power loss; the "
                         "engine dies on them. Move the cache aside (renamed, never deleted): `gpuwarden quarantine "
                         f"{' '.join(unmoved)}`, then restart the engine so it recompiles (the first start takes "
                         "longer), and delete the BROKEN folder once it runs.")
    for k in keys:
        if k not in runbooks.HARDWARE:
            steps.append(runbooks.RUNBOOKS[k] + _its_log(k, events, ctx))
    return list(dict.fromkeys(s for s in steps if s))


def _supervisor_step(e: Event, key: str) -> str | None:
    """What to do when the engine's Docker container or systemd unit did not start it, naming that one."""
    supervisor, command = e.evidence.get("supervisor") or "", e.evidence.get("command")
    if supervisor.startswith("Docker container"):
        look = "dockerd itself: `systemctl status docker` and `journalctl -u docker`"
    elif supervisor.startswith("systemd unit "):
        unit = supervisor.removeprefix("systemd unit ")
        look = f"the unit: `systemctl status {unit}` and `journalctl -u {unit}`"
    else:
        return None
    if key == "restart_retrying":
        return (f"Nothing to do yet: gpuwarden asks its {supervisor} again with backoff until restart_timeout and "
                f"pages again either way. If it goes on, look at {look}.")
    return (f"Look at {look}; then start {e.engine} by hand" + (f": `{command}`" if command else "")
            + ". gpuwarden will not restart it again.")


def _its_log(key: str, events: list[Event], ctx: Context) -> str:
    """For a runbook that sends the reader to an engine's own log: the command that shows it, from when the
    trouble began, where the daemon knows how the engine runs."""
    if key not in ("stall", "restart_failed", "crash_loop", "not_answering"):
        return ""
    said = []
    for e in events:
        if e.engine and runbooks.key_for(e.kind, e.evidence.get("runbook")) == key:
            since = stall_start(e) if e.kind == "engine_stall" else None
            if command := ctx.runs_of(e.engine).logs(since):
                said.append(f"{e.engine}'s log: {command}")
    return " " + "; ".join(dict.fromkeys(said)) + "." if said else ""


def _keys(e: Event) -> list[str]:
    if e.kind == "gpus_changed":  # a GPU missing, and one that came back different, are two things to do
        return ["gpus_missing"] * bool(e.evidence.get("missing")) + ["gpus_changed"] * bool(e.evidence.get("changed"))
    key = runbooks.key_for(e.kind, e.evidence.get("runbook"), e.evidence.get("xid"))
    return [key] if key else []
