"""The actuator: the one place that carries out the policy's actions. Each runs once, in the background (a kill
waits for its grace period; a cache scan can take a while), and its outcome goes back to the hub as an event
(engine_killed, engine_restarting, engine_restart_failed, kill_refused, cache_poisoned). A stall's kill carries
its target (`Kill.target`, judged by the engine side on the look that found the stall): it is killed as it is,
with no call back, and the engine's lifecycle learns the kill from the outcome (through the hub). A fault's kill
carries none: the narrow port (`Engines.take`) gives a fresh look, judged, its lifecycle told when the kill goes
ahead. What the engine's lifecycle learns later (a restart could not be asked for, a suspicion) goes through the
port too; it keeps and writes nothing of theirs. psutil checks each process's start time before a signal: a
target's pid reused since its look is never hit (act/killer.py).

A decided kill is done, or said undone: one that cannot run (no process of it found, its look late, a signal
refused, its last kill still waiting) is a critical kill_not_done with the reason, and it is tried again on a fresh
look every scrape interval until it is done, or its engine's kill budget is spent, or (a stall's or silence's kill)
the engine works again or is gone; giving up is said too."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Protocol

import psutil

from gpuwarden.act import restart
from gpuwarden.act.killer import kill
from gpuwarden.config.settings import CacheConfig
from gpuwarden.core import families, policy
from gpuwarden.core.counts import plural
from gpuwarden.core.model import Event, Severity, Sink
from gpuwarden.engine.targets import KillTarget, Refused
from gpuwarden.runtime.offloop import Busy, OffLoop

log = logging.getLogger("gpuwarden")
# Their own pools: a stuck log read or NVML call elsewhere never delays a kill.
_KILLS = OffLoop("kill", limit=32)  # one per engine
_CACHES = OffLoop("cache quarantine", limit=1)
_CACHE_DEADLINE = 600.0


class Engines(Protocol):
    """What the actuator may ask of the engines component (engine/watch.py's EngineWatch)."""

    async def take(self, name: str, restart: bool, dry_run: bool) -> KillTarget | Refused | None: ...

    def restart_failed(self, name: str) -> bool: ...

    def kill_wanted(self, name: str, stuck: bool) -> str | None: ...

    def suspect(self, name: str, reason: str, fault: Event) -> Event | None: ...

    def user(self, name: str) -> int | None: ...


def describe(action: policy.Kill | policy.Quarantine | policy.Suspect) -> str:
    if isinstance(action, policy.Suspect):
        return f"would watch {action.engine} closely: {action.reason}"
    if isinstance(action, policy.Kill):
        return f"would {'kill and restart' if action.restart else 'kill'} {action.engine}: {action.reason}"
    return f"would quarantine caches: {action.reason}"


class Actuator:
    def __init__(self, sink: Sink, engines: Engines | None, cache: CacheConfig) -> None:
        """`engines` and `cache` are replaced on a reload; kills under way finish with what they started."""
        self.sink, self.engines, self.cache = sink, engines, cache
        self._tasks: set[asyncio.Task] = set()
        self._acting: set[str] = set()  # engines being killed (and restarted) now: one at a time each

    def configure(self, engines: Engines, cache: CacheConfig) -> None:
        """A reload's engine watch and settings."""
        self.engines, self.cache = engines, cache

    def execute(self, action: policy.Action, event: Event) -> None:
        if isinstance(action, policy.Kill):
            self._background(self._kill(action))
        elif isinstance(action, policy.Quarantine):
            self._background(self._quarantine(action))
        elif isinstance(action, policy.Suspect):  # watched closely from now on; its event follows
            if self.engines and (suspected := self.engines.suspect(action.engine, action.reason, event)):
                self._background(self._record(suspected))
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

    async def _record(self, event: Event) -> None:
        self.sink.record([event])

    async def _refused(self, action: policy.Kill, refusal: str, **evidence) -> None:
        self.sink.record([Event("kill_refused", Severity.CRITICAL, f"{action.engine} should be killed "
                                f"({action.reason}) but {refusal}: act by hand", time.time(), engine=action.engine,
                                evidence={"reason": action.reason, **evidence})])

    async def _kill(self, action: policy.Kill) -> None:
        """Kill only what the engine's target was judged to be on a look taken for this kill (the stall's own,
        or a fresh one), as many as it may, once at a time; then, when asked, start it again through its
        supervisor."""
        engines, name, since = self.engines, action.engine, time.monotonic()
        if engines is None or name in self._acting:
            return
        self._acting.add(name)
        stuck = isinstance(action.target, KillTarget | Refused)  # a stall's or silence's kill (a fault's has none)
        target, said, tries = action.target, None, 0
        try:
            while True:
                if not isinstance(target, KillTarget | Refused):
                    target = await engines.take(name, action.restart, action.dry_run)
                if target is None:
                    return
                if isinstance(target, Refused):
                    await self._refused(action, target.reason, refused=target.refused, processes=target.processes)
                    return
                tries += 1
                why = await self._attempt(action, target, since)
                if why is None:
                    return
                if said is None:
                    said = why
                    self._not_done(action, target, why, tries, "tries again at each next look")
                else:
                    log.warning("%s is still not killed (try %d): %s", name, tries, why)
                if action.dry_run:
                    return  # nothing is killed in a dry run: nothing to try again
                await asyncio.sleep(target.config.scrape_interval)
                if self.engines is not engines:
                    return  # reloaded meanwhile: the new watch decides afresh
                if stop := engines.kill_wanted(name, stuck):
                    self._not_done(action, target, f"{why}; not tried again: {stop}", tries, None)
                    return
                target = None
        finally:
            self._acting.discard(name)

    async def _attempt(self, action: policy.Kill, target: KillTarget, since: float) -> str | None:
        """The kill (and its restart) on one look; None when it was done (or its signals sent and said), else why
        it could not run."""
        if not target.procs:
            return "none of its processes was found" + (f": {target.late}" if target.late else "")
        done = await self._killed(action, target)
        if isinstance(done, str):
            return done
        if done and action.restart and not action.dry_run:
            await self._restart(action.engine, target, since)
        return None

    def _not_done(self, action: policy.Kill, target: KillTarget, why: str, tries: int, then: str | None) -> None:
        """A decided kill that did not happen, said as it is: a page to act by hand (a dry run's is a warning)."""
        name = action.engine
        message = (f"{name} NOT killed: {why} — act by hand" + (f" (gpuwarden {then})" if then else "") +
                   f"; it should be killed ({action.reason})")
        self.sink.record([Event("kill_not_done", Severity.WARNING if action.dry_run else Severity.CRITICAL, message,
                                time.time(), engine=name, gpu=target.gpu,
                                evidence={"reason": action.reason, "why": why, "tries": tries,
                                          "retrying": then is not None, "dry_run": action.dry_run,
                                          "refused": target.refused})])

    async def _killed(self, action: policy.Kill, target: KillTarget) -> bool | str:
        """The kill itself (the engine's lifecycle knows already, or learns it from engine_killed); False when
        the wait for the signals never ended (said as engine_killed, unfinished); why, when it did not start or a
        signal was refused (nothing said yet)."""
        name, cfg = action.engine, target.config
        deadline = cfg.kill_grace + policy.KILL_SLACK
        # a production engine killed is down: a page (a dry run is never one)
        severity = Severity.WARNING if action.dry_run else Severity.CRITICAL
        try:
            report = await _KILLS.run(name, deadline, kill, target.procs, cfg.kill_grace, action.dry_run)
        except Busy as exc:  # its last kill still waits on its signals: none sent now
            return f"the kill did not start: {exc}"
        except psutil.Error as exc:  # a signal refused (EPERM): what was sent before it is in the next try's look
            return f"a signal was refused: {exc}"
        except TimeoutError:  # signals sent, the wait for them never ended (a process stuck in the kernel?)
            if not action.dry_run:
                self.sink.count(families.ENGINE_KILLS, name)
            # still a kill (the budget counts it, the lifecycle learns it), not one to restart after
            self.sink.record([Event("engine_killed", severity, f"{name}: signals sent to "
                                    f"{plural(len(target.procs), 'process')} ({action.reason}) but they were not "
                                    f"seen gone within {deadline:.0f} s (stuck in the kernel?); not restarting it: "
                                    "look at it by hand", time.time(), engine=name, gpu=target.gpu,
                                    evidence={"reason": action.reason, "unfinished": True,
                                              "dry_run": action.dry_run, "refused": target.refused,
                                              "restart": False})])
            return False
        if not action.dry_run:
            self.sink.count(families.ENGINE_KILLS, name)
        then = f"; restarting it through its {restart.supervisor(cfg.target)}" if action.restart else ""
        self.sink.record([Event("engine_killed", severity, f"{report.summary(name)} ({action.reason}){then}",
                                time.time(), engine=name, gpu=target.gpu,
                                evidence={"reason": action.reason, "terminated": report.terminated,
                                          "killed": report.killed, "survivors": report.survivors,
                                          "dry_run": report.dry_run, "refused": target.refused,
                                          "restart": action.restart})])
        return True

    async def _restart(self, name: str, target: KillTarget, since: float) -> None:
        """Ask its supervisor until `restart_timeout` from `since` (the kill's start, as the lifecycle's own
        deadline): a supervisor's blip is asked again (one page says so), and only a deadline spent fails."""
        supervisor, cfg = restart.supervisor(target.config.target), target.config
        evidence = {"supervisor": supervisor, "command": restart.command(cfg.target)}
        self.sink.record([Event("engine_restarting", Severity.WARNING, f"{name}: asking its {supervisor} to start "
                                "it again; back once its tokens move or a real completion returns", time.time(),
                                engine=name, gpu=target.gpu, evidence=evidence)])

        def retrying(error: str) -> None:
            self.sink.record([Event("engine_restart_retrying", Severity.WARNING, f"{name}: its {supervisor} did "
                                    f"not start it ({error}); asking again with backoff until restart_timeout "
                                    f"({cfg.restart_timeout:.0f} s after the kill)", time.time(), engine=name,
                                    gpu=target.gpu, evidence={**evidence, "error": error, "runbook":
                                                              "restart_retrying"})])
        try:
            dead = frozenset(p.pid for p in target.procs)
            log.info("%s: %s", name, await restart.start(name, cfg.target, dead, since + cfg.restart_timeout,
                                                         retrying))
        except restart.RestartError as exc:
            if not self.engines.restart_failed(name):  # its lifecycle said it first (its deadline, at a look)
                log.warning("%s: not started again: %s", name, exc)
                return
            self.sink.record([Event("engine_restart_failed", Severity.CRITICAL, f"{name} could not be started "
                                    f"again within restart_timeout ({cfg.restart_timeout:.0f} s after the kill): "
                                    f"{exc}; gpuwarden will not restart it again", time.time(), engine=name,
                                    gpu=target.gpu, evidence={**evidence, "error": str(exc), "started": False,
                                                              "by_gpuwarden": True, "runbook": "restart_not_started"})])

    async def _quarantine(self, action: policy.Quarantine) -> None:
        """Move the engine's user's poisoned compile caches aside (a scan can take a while: off the loop)."""
        owner = self.engines.user(action.engine) if self.engines and action.engine else None
        if owner is None:
            log.warning("not moving caches (%s): the user of %s is not known", action.reason, action.engine)
            return
        try:
            event = await _CACHES.run("caches", _CACHE_DEADLINE, _quarantine_caches, self.cache, action.reason,
                                      time.time(), action.dry_run, owner, action.engine)
        except (Busy, TimeoutError) as exc:
            log.error("moving poisoned caches (%s) did not finish: %s", action.reason, exc or "timed out")
            return
        if event:
            self.sink.record([event])
        else:
            log.info("%s: no zero-byte file in the compile caches", action.reason)


def _quarantine_caches(cache: CacheConfig, reason: str, now: float, dry_run: bool, owner: int,
                       engine: str | None) -> Event | None:
    """In the cache pool: the caches are found (the user database read) and moved there, and quarantine.py (with
    ctypes) is imported there on first use: only a crash loop moves caches, and a daemon's start skips it."""
    from gpuwarden.act.quarantine import cache_dirs, quarantine_all

    return quarantine_all(cache_dirs(cache, owner), reason, now, dry_run, owner, engine)
