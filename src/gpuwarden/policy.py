"""Which events make gpuwarden act, pure: an engine that stalls, and a GPU fault under an engine, get the
engine killed (or only alerted, as each engine's config says); an engine in a crash loop gets its poisoned
compile caches moved aside."""

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


def is_gpu_fault(event: Event) -> bool:
    return event.kind in GPU_FAULT_KINDS or (event.kind == "xid" and event.severity == Severity.CRITICAL)


def kills(event: Event, engines: list[EngineView]) -> list[tuple[str, str]]:
    """(engine, reason) for each engine this event should kill."""
    if event.kind == "engine_stall":
        return [(e.name, "stalled") for e in engines if e.name == event.engine and e.on_stall == "kill"]
    if is_gpu_fault(event):
        where = f" on {event.gpu}" if event.gpu else ""
        return [(e.name, f"kernel reported {event.kind}{where}") for e in engines
                if e.on_gpu_fault == "kill" and _uses(e, event.gpu)]
    return []


def quarantines(event: Event) -> str | None:
    """The reason to quarantine poisoned caches after this event, or None."""
    return event.kind.replace("engine_", "") if event.kind in QUARANTINE_KINDS else None


def _uses(engine: EngineView, gpu: str | None) -> bool:
    """A fault that names no GPU, or an engine whose GPUs are unknown, counts as a match."""
    return gpu is None or engine.gpus is None or gpu in engine.gpus
