"""The actuator: the one place that carries out the policy's actions. Each runs once, in the background (a kill
waits for a fresh look at the engine's processes and its grace period; a cache scan can take a while), and its
outcome goes back to the hub as an event (engine_killed, kill_refused, cache_poisoned)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable

from gpuwarden import families, policy
from gpuwarden.act.killer import kill
from gpuwarden.act.quarantine import cache_dirs, quarantine_all
from gpuwarden.config import CacheConfig, user_id
from gpuwarden.engine.watch import EngineWatch
from gpuwarden.model import Event, Severity, Sink
from gpuwarden.offloop import Busy, OffLoop

log = logging.getLogger("gpuwarden")
# Their own pools: a stuck log read or NVML call elsewhere never delays a kill.
_KILLS = OffLoop("kill", limit=32)  # one per engine
_KILL_SLACK = 30.0  # SIGKILL's own wait (5 s) and the looks around it
_CACHES = OffLoop("cache quarantine", limit=1)
_CACHE_DEADLINE = 600.0


def describe(action: policy.Kill | policy.Quarantine) -> str:
    if isinstance(action, policy.Kill):
        return f"would kill {action.engine}: {action.reason}"
    return f"would quarantine caches: {action.reason}"


class Actuator:
    def __init__(self, sink: Sink, engines: EngineWatch | None, cache: CacheConfig) -> None:
        """`engines` and `cache` are replaced on a reload; kills under way finish with what they started."""
        self.sink, self.engines, self.cache = sink, engines, cache
        self._tasks: set[asyncio.Task] = set()

    def execute(self, action: policy.Action, event: Event) -> None:
        if isinstance(action, policy.Kill):
            self._background(self._kill(action))
        elif isinstance(action, policy.Quarantine):
            self._background(self._quarantine(action))
        elif isinstance(action, policy.Refuse) and action.by_hand:
            self._background(self._refused(action.action, action.reason))
        elif isinstance(action, policy.Refuse):
            log.warning("not acting on %s (%s): %s", event.kind, describe(action.action), action.reason)
        else:
            log.debug("alerting only on %s (%s): %s", event.kind, describe(action.action), action.reason)

    def _background(self, work: Awaitable[None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refused(self, action: policy.Kill, refusal: str, **evidence) -> None:
        self.sink.record([Event("kill_refused", Severity.CRITICAL, f"{action.engine} should be killed "
                                f"({action.reason}) but {refusal}: act by hand", time.time(), engine=action.engine,
                                evidence={"reason": action.reason, **evidence})])

    async def _kill(self, action: policy.Kill) -> None:
        """Kill only what a fresh look at the engine's target finds, as many as it may, once at a time."""
        engines = self.engines
        state = engines.engines.get(action.engine) if engines else None
        if state is None or state.killing:
            return
        name, reason, cfg = action.engine, action.reason, state.config
        state.killing = True
        try:
            await engines.inspect(state)
            if refusal := policy.target_refusal(len(state.procs), state.refused, cfg.max_kill_processes):
                await self._refused(action, refusal, refused=state.refused, processes=len(state.procs))
                return
            if not state.procs:
                log.warning("%s should be killed (%s) but none of its processes was found", name, reason)
                return
            if not action.dry_run:
                now = time.monotonic()
                state.kills = [t for t in state.kills if now - t <= cfg.kill_budget_window] + [now]
            try:
                report = await _KILLS.run(name, cfg.kill_grace + _KILL_SLACK, kill, state.procs, cfg.kill_grace,
                                          action.dry_run)
            except (Busy, TimeoutError) as exc:  # signals sent, but the wait for them never ended (a hung /proc?)
                log.error("killing %s (%s) did not finish: %s", name, reason, exc or "timed out")
                return
            if not action.dry_run:
                self.sink.count(families.ENGINE_KILLS, name)
            severity = Severity.CRITICAL if report.survivors else Severity.WARNING
            self.sink.record([Event("engine_killed", severity, f"{report.summary(name)} ({reason})", time.time(),
                                    engine=name, gpu=state.gpu,
                                    evidence={"reason": reason, "terminated": report.terminated,
                                              "killed": report.killed, "survivors": report.survivors,
                                              "dry_run": report.dry_run, "refused": state.refused})])
        finally:
            state.killing = False

    async def _quarantine(self, action: policy.Quarantine) -> None:
        """Move the engine's user's poisoned compile caches aside (a scan can take a while: off the loop)."""
        state = self.engines.engines.get(action.engine) if self.engines and action.engine else None
        configured = state and state.config.target.user
        owner = user_id(configured) if configured else state and state.tracker.uid
        if owner is None:
            log.warning("not moving caches (%s): the user of %s is not known", action.reason, action.engine)
            return
        try:
            event = await _CACHES.run("caches", _CACHE_DEADLINE, quarantine_all, cache_dirs(self.cache, owner),
                                      action.reason, time.time(), action.dry_run, owner)
        except (Busy, TimeoutError) as exc:
            log.error("moving poisoned caches (%s) did not finish: %s", action.reason, exc or "timed out")
            return
        if event:
            self.sink.record([event])
        else:
            log.info("%s: no zero-byte file in the compile caches", action.reason)
