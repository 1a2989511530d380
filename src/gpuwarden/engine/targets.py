"""Whether a kill may go ahead on what a look at an engine found, pure: a target of its own processes, and not
too many. The engine watch asks this on the look that found a stall (the target travels with the stall in the
engine's view, and the kill takes it) and on a fresh look for a fault's kill (`EngineWatch.take`, where the
lifecycle is told of a kill only when one will really happen: a refused target leaves it untouched)."""

from __future__ import annotations

import psutil

from gpuwarden.config.settings import EngineConfig
from gpuwarden.core.plain import plain


@plain
class KillTarget:
    """What the actuator needs to kill (and restart) an engine: a look taken for the kill, and its configuration."""

    procs: list[psutil.Process]
    refused: list[str]  # candidates the target named but may not be killed
    gpu: str | None
    config: EngineConfig
    late: str = ""  # why the look it holds is not a fresh one (its look-up missed its deadline): said if empty


@plain
class Refused:
    """A kill that may not go ahead: why, and what the look found (for the kill_refused event)."""

    reason: str
    refused: list[str]
    processes: int


def refusal(processes: int, refused: list[str], max_processes: int) -> str | None:
    """Why a kill may not go ahead on what the engine's target resolved to now (None: it may)."""
    if not processes and refused:
        return f"its target was refused ({'; '.join(refused)})"
    if processes > max_processes:
        return f"its target resolves to {processes} processes, more than max_kill_processes ({max_processes})"
    return None


def judged(target: KillTarget) -> KillTarget | Refused:
    if reason := refusal(len(target.procs), target.refused, target.config.max_kill_processes):
        return Refused(reason, target.refused, len(target.procs))
    return target
