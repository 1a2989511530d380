"""The engine watch's state as the status page and `gpuwarden status` show it: one plain row per engine, from
its lifecycle (the registry reads it through EngineWatch.state; nothing above reaches into a lifecycle)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from gpuwarden.runtime.logsetup import redact


def rows(states: Iterable[Any], now: float) -> list[dict[str, Any]]:
    """`states`: the watch's engines (engine/watch.py's EngineState); `now`: wall-clock seconds, for the
    lifecycle's monotonic times."""
    wall = lambda mono: None if mono is None else round(now - (time.monotonic() - mono), 3)  # noqa: E731
    found = []
    for state in states:
        life = state.lifecycle
        sample = life.sample
        found.append({
            "name": state.name,
            "url": redact(state.config.metrics_url),
            "state": engine_state(life),
            "running": sample and sample.running, "waiting": sample and sample.waiting,
            "generated_tokens": sample and sample.generated, "progress": sample and sample.progress,
            "last_progress": wall(life.detector.progress_at),
            "stall_threshold_seconds": round(life.detector.threshold(), 1),
            "last_answer": wall(life.answered),
            "cpu_ratio": None if state.cpu is None else round(state.cpu / 100, 3),
            "gpus": sorted(state.gpus or ()),
            "processes": len(state.procs),
            "kills_in_window": len(life.kills),
        })
    return found


def engine_state(life: Any) -> str:
    """One word for a person: what gpuwarden thinks of the engine now (its engine.lifecycle.Lifecycle)."""
    if life.phase != "watching":
        return "restart failed" if life.phase == "failed" else life.phase  # down, starting
    if life.unresponsive:
        return "unresponsive"
    if life.detector.stalled:
        return "stalled"
    if life.sample is None:
        return "not answering" if life.failures else "starting"
    if life.failures:
        return "not answering"
    running = life.sample.running
    return "unknown" if running is None else "running" if running > 0 else "idle"
