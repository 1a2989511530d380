"""What gpuwarden does about an event, pure: the event and plain views of the engines and GPUs in, typed
actions out.

- An engine that stalls, or whose /metrics hangs while requests were running, or that lets a real one-token
  completion (the canary) time out, is killed (or only alerted, as its config says); so is an engine on a GPU
  that the kernel reports hanging or faulting. A stall read from a log alone kills only once a canary confirmed
  it: a log is the engine's word, a completion is proof.
- An engine in a crash loop gets its poisoned compile caches moved aside.
- Only live, local evidence acts: an event from a line logged before gpuwarden started (journal look-back,
  catch-up after a restart) is history, and a kernel fault acts only for a GPU this daemon has seen on this
  machine since it started (it may be gone now: a GPU off the bus is exactly the case) or for a line that
  names none on a box that has GPUs. What the config asks for but the evidence does not allow is a `Hold`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwarden.model import Event, Severity

# Kernel faults after which an engine on that GPU is killed at once: the GPU is hanging or faulting and a
# hung engine is how GPUs get lost. Xids count when their catalog severity is critical (79, 119, 95...).
GPU_FAULT_KINDS = frozenset({"sq_intr", "ring_timeout", "page_fault"})
# Events after which the poisoned compile caches are moved aside: an engine that keeps dying.
QUARANTINE_KINDS = frozenset({"engine_crash_loop"})


@dataclass(frozen=True, slots=True)
class EngineView:
    name: str
    gpus: frozenset[str] | None  # None: unknown, so every GPU
    on_stall: str  # kill | alert
    on_gpu_fault: str
    on_unresponsive: str = "kill"


@dataclass(frozen=True, slots=True)
class Kill:
    engine: str
    reason: str


@dataclass(frozen=True, slots=True)
class Quarantine:
    reason: str


@dataclass(frozen=True, slots=True)
class Hold:
    """An action the config asks for that the evidence does not allow: reported, never done."""

    action: Kill | Quarantine
    why: str


Action = Kill | Quarantine | Hold


def is_gpu_fault(event: Event) -> bool:
    return event.kind in GPU_FAULT_KINDS or (event.kind == "xid" and event.severity == Severity.CRITICAL)


def decide(event: Event, engines: list[EngineView], gpus_seen: frozenset[str]) -> list[Action]:
    wanted = _wanted(event, engines)
    why = _not_allowed(event, gpus_seen)
    return [Hold(action, why) for action in wanted] if why else wanted


def _canary_timed_out(event: Event) -> bool:
    return (event.evidence.get("canary") or {}).get("outcome") == "timeout"


def _wanted(event: Event, engines: list[EngineView]) -> list[Kill | Quarantine]:
    if event.kind == "engine_stall":
        return [Kill(e.name, "stalled") for e in engines if e.name == event.engine and e.on_stall == "kill"]
    if event.kind == "engine_unresponsive":
        if not event.evidence.get("requests_running") and not _canary_timed_out(event):
            return []  # an idle engine whose /metrics hangs: reported, not killed
        reason = "a real completion did not return" if _canary_timed_out(event) else \
            "unresponsive with requests running"
        return [Kill(e.name, reason) for e in engines if e.name == event.engine and e.on_unresponsive == "kill"]
    if is_gpu_fault(event):
        where = f" on {event.gpu}" if event.gpu else ""
        return [Kill(e.name, f"kernel reported {event.kind}{where}") for e in engines
                if e.on_gpu_fault == "kill" and _uses(e, event.gpu)]
    if event.kind in QUARANTINE_KINDS:
        return [Quarantine(event.kind.replace("engine_", ""))]
    return []


def _not_allowed(event: Event, gpus_seen: frozenset[str]) -> str | None:
    """Why this event may not act, or None."""
    if not event.live:
        return "history: logged before gpuwarden started"
    if event.kind == "engine_stall" and event.evidence.get("source") == "log" and not _canary_timed_out(event):
        return "a stall read from a log alone is not confirmed by a real completion (canary)"
    if is_gpu_fault(event):
        if event.gpu and event.gpu not in gpus_seen:
            return f"{event.gpu} is not a GPU this machine has had since gpuwarden started"
        if not gpus_seen:
            return "no GPU was ever seen on this machine"
    return None


def _uses(engine: EngineView, gpu: str | None) -> bool:
    """A fault that names no GPU, or an engine whose GPUs are unknown, counts as a match."""
    return gpu is None or engine.gpus is None or gpu in engine.gpus
