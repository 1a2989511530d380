"""What gpuwarden does about an event, pure: the event and plain views of the engines and GPUs in, typed
actions out.

- An engine that stalls, or whose /metrics hangs while requests were running, or that lets a real one-token
  completion (the canary) time out, is killed (or only alerted, as its config says); so is an engine on a GPU
  whose own process the kernel reports faulting the GPU. A stall read from a log alone kills only once a canary
  confirmed it: a log is the engine's word, a completion is proof.
- A GPU fault that the driver pins on a process (`evidence["process"]`, a pid other than 0, or
  `evidence["pasid"]`, an AMD address space that an engine's processes hold) kills only the engines that process
  belongs to: any local user with GPU access can make a GPU fault, and must not thereby kill the engines sharing
  it (each of those gets a `Refuse`).
- A fault with no owner (no process, pid 0, a pasid no one can be found for: sq_intr, NVML's Xid events, MES and
  KFD hangs, soft-recovered timeouts) never kills alone: any user can raise one. Each engine on that GPU is put
  under suspicion (`Suspect`): its stall threshold drops to its floor and a canary completion runs, so that it is
  killed if it then stops progressing or does not answer. An escalation on that GPU (a reset, the device lost)
  kills the engines already under suspicion. A fault that names no GPU never kills on its own word either.
- An engine in a crash loop gets its poisoned compile caches moved aside.
- Only live, local evidence acts: an event from a line logged before gpuwarden started (journal look-back,
  catch-up after a restart) is history, and a kernel fault acts only for a GPU this daemon has seen on this
  machine since it started (it may be gone now: a GPU off the bus is exactly the case) or for a line that
  names none on a box that has GPUs. What the config asks for but the evidence does not allow is a `Refuse`.
- A kill for an engine's own stall or silence carries the target the engine watch judged on the look that
  found it (`EngineView.target`, reported with the event): the actuator kills that, and asks nothing more. A
  fault's kill carries none (its report holds no look of the engine): the actuator asks for a fresh one.
- An engine whose setting says restart is killed, then started again through its supervisor (`Kill.restart`);
  once a restart did not bring it back it is only killed: no restart loop.
- At most `kill_budget` kills per engine per `kill_budget_window`: beyond it a kill is refused and a person must
  act (a `Refuse` with `by_hand`, alerted as kill_refused). A dry run is never refused for its budget.
- An engine whose processes are gone, not by our kill, has exited; enough exits within a window are a crash
  loop (`exited`).

Times given to the policy (`now`, kills, exits) are monotonic seconds: the policy never reads a clock.
"""

from __future__ import annotations

from dataclasses import field, replace

from gpuwarden.core.eventkinds import ESCALATION_KINDS, GPU_FAULT_KINDS, QUARANTINE_KINDS
from gpuwarden.core.model import Event, Severity
from gpuwarden.core.plain import compared, plain

OUR_KILL_SLACK = 10.0  # seconds beyond kill_grace in which an engine's processes going is taken for our kill
KILL_SLACK = 30.0  # beyond kill_grace, the longest a kill's signals are waited for (SIGKILL's own 5 s, the looks)


@plain
class EngineView:
    """What the policy knows of one engine."""

    name: str
    gpus: frozenset[str] | None  # None: unknown, so every GPU
    on_stall: str  # kill | alert
    on_gpu_fault: str
    on_unresponsive: str = "kill"
    dry_run: bool = False
    kill_budget: int = 3
    kill_budget_window: float = 3600.0
    kills: tuple[float, ...] = ()  # monotonic times of its real kills (not dry runs)
    pids: frozenset[int] = frozenset()  # its processes at the last look (none known: no fault is pinned on it)
    restart_failed: bool = False  # a restart did not bring it back: it is never restarted again
    pasids: frozenset[int] | None = None  # their KFD pasids (AMD); None: the kernel exposes none to read
    suspect: bool = False  # under suspicion since an owner-less fault on its GPU (watched closely)
    # with a stall or silence it reports: the kill's target judged on that look (engine/targets.py's KillTarget or
    # Refused, opaque here); in memory only, never stored
    target: object | None = field(default=None, repr=False)


@plain
class Situation:
    """What the policy knows besides the event, as plain values."""

    engines: list[EngineView]
    gpus_seen: frozenset[str]  # every GPU discovered since start
    now: float  # monotonic
    cache_dry_run: bool = False  # [cache] dry_run, or on_crash_loop = "alert"


@compared
class Kill:
    """Kill an engine (and maybe restart it)."""

    engine: str
    reason: str
    dry_run: bool = False
    restart: bool = False  # then start it again through its supervisor (its on_* setting says "restart")
    target: object | None = field(default=None, repr=False)  # the view's target (None: the actuator looks)


@compared
class Quarantine:
    """Move the compiled caches away: a crash loop may come from a poisoned one."""

    reason: str
    dry_run: bool = False
    engine: str | None = None  # whose crash loop: only that engine's user's caches move


@compared
class Refuse:
    """An action the config asks for that may not be done: reported, never done. `by_hand`: it is needed and a
    person must do it (kill_refused, alerted); otherwise the evidence does not allow it (a log line)."""

    action: Kill | Quarantine | Suspect
    reason: str
    by_hand: bool = False


@compared
class AlertOnly:
    """An action the config turned into an alert (on_stall = "alert"...): the event's alert is all there is."""

    action: Kill | Quarantine
    reason: str


@compared
class Suspect:
    """A fault with no owner on the engine's GPU: alert, drop its stall threshold to the floor and run a canary;
    a kill follows only from what the engine then does (a stall, no answer) or from an escalation."""

    engine: str
    reason: str


Action = Kill | Quarantine | Refuse | AlertOnly | Suspect

# What a fault with no owner escalates to: the GPU reset or lost, whatever any process did (the catalog's
# `escalation` kinds). Xid 79 (off the bus), 95 (uncontained ECC: reset needed), 154 (a reset or reboot is
# required) say it too.
ESCALATION_XIDS = frozenset({79, 95, 154})


def is_gpu_fault(event: Event) -> bool:
    """A kernel fault after which an engine on that GPU is killed at once: the GPU is hanging or faulting and a
    hung engine is how GPUs get lost. Xids count when their catalog severity is critical (79, 119, 95...)."""
    return event.kind in GPU_FAULT_KINDS or (event.kind == "xid" and event.severity == Severity.CRITICAL)


def escalates(event: Event) -> bool:
    """The GPU was reset or lost: the engines under suspicion on it are done for. A reset at info ("reset
    succeeded", "wedged, but recovered") is the driver's recovery, not news of a worse fault."""
    if event.kind in ESCALATION_KINDS:
        return event.severity >= Severity.WARNING
    return event.kind == "xid" and event.evidence.get("xid") in ESCALATION_XIDS


def decide(event: Event, situation: Situation) -> list[Action]:
    wanted = _wanted(event, situation)
    if why := _not_allowed(event, situation.gpus_seen):
        # a suspicion refused too: the decision says why nothing was done (a GPU never seen, history...)
        return [Refuse(a, why) if isinstance(a, Kill | Quarantine | Suspect) else a for a in wanted]
    return [_within_budget(a, situation) if isinstance(a, Kill) else a for a in wanted]


def budget_spent(view: EngineView, now: float) -> bool:
    return sum(1 for t in view.kills if now - t <= view.kill_budget_window) >= view.kill_budget


def _within_budget(kill: Kill, situation: Situation) -> Kill | Refuse:
    view = next(e for e in situation.engines if e.name == kill.engine)
    if kill.dry_run or not budget_spent(view, situation.now):
        return kill
    return Refuse(kill, f"its kill budget ({view.kill_budget} per {view.kill_budget_window:.0f} s) is spent",
                  by_hand=True)


def exited(exits: tuple[float, ...], now: float, last_kill: float | None, grace: float,
           window: float) -> tuple[float, ...] | None:
    """An engine's processes are gone at `now`. None: that is our own kill, not news. Else its exits within
    `window`, this one included (as many as `crash_loop_exits` make a crash loop)."""
    if last_kill is not None and now - last_kill < grace + OUR_KILL_SLACK:
        return None
    return (*(t for t in exits if now - t <= window), now)


def _canary_timed_out(event: Event) -> bool:
    return (event.evidence.get("canary") or {}).get("outcome") == "timeout"


def _per_engine(engines: list[EngineView], setting: str, reason: str, looked: bool = False) -> list[Kill | AlertOnly]:
    """A kill for each of `engines` whose `setting` (on_stall...) says kill or restart; an alert only for the
    others. An engine whose last restart failed is killed and not restarted: a restart loop is no cure.
    `looked`: the event is the engine's own, reported with the look its view's target was judged on."""
    return [_kill(e, getattr(e, setting), reason, e.target if looked else None) if getattr(e, setting) in
            ("kill", "restart") else AlertOnly(Kill(e.name, reason, e.dry_run), f'{setting} = "{getattr(e, setting)}"')
            for e in engines]


def _kill(engine: EngineView, setting: str, reason: str, target: object | None) -> Kill:
    if setting == "restart" and engine.restart_failed:
        return Kill(engine.name, f"{reason}; not restarted: its last restart did not bring it back", engine.dry_run,
                    target=target)
    return Kill(engine.name, reason, engine.dry_run, restart=setting == "restart", target=target)


def _raised_by(event: Event) -> tuple[int, str] | None:
    """The process the driver says raised the fault (pid, name); None when it names none, or pid 0 (none)."""
    process = event.evidence.get("process")
    if not isinstance(process, dict) or not isinstance(pid := process.get("pid"), int) or pid <= 0:
        return None
    return pid, str(process.get("name") or "")


def _pasid(event: Event) -> int | None:
    pasid = event.evidence.get("pasid")
    return pasid if isinstance(pasid, int) and pasid > 0 else None


def _gpu_fault(event: Event, situation: Situation) -> list[Kill | AlertOnly | Refuse | Suspect]:
    """A kill for the engines whose process raised the fault; suspicion, not a kill, when no one did."""
    on_gpu = {e.name: e for e in situation.engines if _uses(e, event.gpu)}
    reason = f"kernel reported {event.kind}" + (f" on {event.gpu}" if event.gpu else "")
    owned = _owned(event, list(on_gpu.values()))
    if owned is None:
        return _unowned(event, list(on_gpu.values()), reason)
    owners, whose, its = owned
    actions: list[Kill | AlertOnly | Refuse | Suspect] = []
    for action in _per_engine(list(on_gpu.values()), "on_gpu_fault", reason):
        if isinstance(action, Kill) and action.engine in owners:
            action = replace(action, reason=f"{reason}, raised by its process {its}")
        elif isinstance(action, Kill):
            action = Refuse(action, f"the fault was raised by {whose}, not one of {action.engine}'s processes")
        actions.append(action)
    return actions


def _owned(event: Event, engines: list[EngineView]) -> tuple[set[str], str, str] | None:
    """Which engines' process raised the fault, and who it was (said of anyone, said of an engine's own); None
    when the fault has no owner to be found.
    A pasid is as good as a pid once resolved: it belongs to an engine, or (every engine's pasids being known)
    to no engine."""
    if raised := _raised_by(event):
        pid, name = raised
        return {e.name for e in engines if pid in e.pids}, f"pid {pid} ({name})", f"{pid} ({name})"
    if (pasid := _pasid(event)) is None:
        return None
    owners = {e.name for e in engines if e.pasids and pasid in e.pasids}
    if owners or (engines and all(e.pasids is not None for e in engines)):
        return owners, f"pasid {pasid}", f"with pasid {pasid}"
    return None  # the kernel does not say whose it is: no owner can be found


def _unowned(event: Event, engines: list[EngineView], reason: str) -> list[Kill | AlertOnly | Suspect]:
    """No owner: suspicion for each engine on the GPU; a kill only where an escalation on a named GPU finds an
    engine already under suspicion."""
    if not (event.gpu and escalates(event)):
        return [Suspect(e.name, f"{reason} (no owner)") for e in engines]
    out: list[Kill | AlertOnly | Suspect] = []
    for engine in engines:
        if engine.suspect:
            out += _per_engine([engine], "on_gpu_fault", f"{reason} after an earlier fault with no owner")
        else:
            out.append(Suspect(engine.name, f"{reason} (no owner)"))
    return out


def _wanted(event: Event, situation: Situation) -> list[Kill | Quarantine | AlertOnly | Refuse]:
    named = [e for e in situation.engines if e.name == event.engine]
    if event.kind == "engine_stall":
        return _per_engine(named, "on_stall", "stalled", looked=True)
    if event.kind == "engine_unresponsive":
        if not event.evidence.get("requests_running") and not _canary_timed_out(event):
            return []  # an idle engine whose /metrics hangs: reported, not killed
        reason = "a real completion did not return" if _canary_timed_out(event) else \
            "unresponsive with requests running"
        return _per_engine(named, "on_unresponsive", reason, looked=True)
    if is_gpu_fault(event) or escalates(event):
        return _gpu_fault(event, situation)
    if event.kind in QUARANTINE_KINDS:
        return _quarantine(Quarantine(event.kind.replace("engine_", ""), situation.cache_dry_run, event.engine),
                           named)
    return []


def _quarantine(action: Quarantine, named: list[EngineView]) -> list[Quarantine | AlertOnly | Refuse]:
    """The engine's own settings govern this root action too: an engine that may only be alerted on (every
    discovered one: anyone can start a look-alike and make it exit) never makes root move a cache."""
    if not named:
        return [Refuse(action, f"{action.engine or 'no engine'} is not an engine this daemon watches")]
    view = named[0]
    if all(getattr(view, setting) == "alert" for setting in _ON_SETTINGS):
        return [AlertOnly(action, f"{view.name} is alert-only ({', '.join(_ON_SETTINGS)} say \"alert\")")]
    return [replace(action, dry_run=action.dry_run or view.dry_run)]


_ON_SETTINGS = ("on_stall", "on_gpu_fault", "on_unresponsive")


def _not_allowed(event: Event, gpus_seen: frozenset[str]) -> str | None:
    """Why this event may not act, or None."""
    if not event.live:
        return "history: logged before gpuwarden started"
    if event.evidence.get("verified") is False:  # a kernel line its own record does not prove the driver's
        return f"not proven to come from the driver ({event.evidence.get('unverified', 'unverified')})"
    if event.kind == "engine_stall" and event.evidence.get("source") == "log" and not _canary_timed_out(event):
        return "a stall read from a log alone is not confirmed by a real completion (canary)"
    if is_gpu_fault(event) or escalates(event):
        if event.gpu and event.gpu not in gpus_seen:
            return f"{event.gpu} is not a GPU this machine has had since gpuwarden started"
        if not gpus_seen:
            return "no GPU was ever seen on this machine"
    return None


def _uses(engine: EngineView, gpu: str | None) -> bool:
    """A fault that names no GPU, or an engine whose GPUs are unknown, counts as a match."""
    return gpu is None or engine.gpus is None or gpu in engine.gpus


def record_of(action: Action) -> dict:
    """An action as the event that caused it records it (`evidence["decision"]`): what, for which engine, why."""
    if isinstance(action, Refuse | AlertOnly):
        inner = action.action
        name = "refuse" if isinstance(action, Refuse) else "alert_only"
        return {"action": name, "engine": getattr(inner, "engine", None), "reason": action.reason,
                "by_hand": isinstance(action, Refuse) and action.by_hand, "dry_run": getattr(inner, "dry_run", False)}
    if isinstance(action, Quarantine):
        return {"action": "quarantine", "engine": None, "reason": action.reason, "by_hand": False,
                "dry_run": action.dry_run}
    name = "restart" if getattr(action, "restart", False) else type(action).__name__.lower()  # kill, suspect
    return {"action": name, "engine": action.engine, "reason": action.reason, "by_hand": False,
            "dry_run": bool(getattr(action, "dry_run", False))}
