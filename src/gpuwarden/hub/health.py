"""gpuwarden's own health: the event loop's lag, systemd's STATUS line and WATCHDOG pings, components that
fail, and a store that cannot be written. Its loops are supervised components like the others; what goes wrong
is reported through the sink as events (watchdog_error, store_unwritable, clock_step)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from gpuwarden.config.settings import DaemonConfig
from gpuwarden.core import conditions, families
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.core.model import Event, Severity, Sink
from gpuwarden.runtime.sdnotify import Notifier
from gpuwarden.runtime.supervise import Supervisor
from gpuwarden.runtime.ticks import next_tick
from gpuwarden.store.sqlite import QueuedStore

log = logging.getLogger("gpuwarden")

LAG_PROBE = 0.5  # a block longer than loop_lag_warn + this is always seen
CLOCK_STEP = 5.0  # the wall clock moving this much against the boot clock between two looks is a step


class WallClock:
    """Steps of the wall clock (a time sync that steps it, someone setting the date, a dead RTC fixed at boot):
    its offset from CLOCK_BOOTTIME, which nothing sets and which runs on through a suspend (CLOCK_MONOTONIC
    stops: a resume would read as a step), moving between two looks. NTP's slewing moves it by milliseconds."""

    def __init__(self, wall: Callable[[], float] = time.time,
                 boot: Callable[[], float] = lambda: time.clock_gettime(time.CLOCK_BOOTTIME)) -> None:
        self._wall, self._boot = wall, boot
        self._offset = wall() - boot()

    def step(self) -> Event | None:
        """A clock_step event when the wall clock stepped since the last look, else None."""
        now = self._wall()
        offset = now - self._boot()
        step, self._offset = offset - self._offset, offset
        if abs(step) < CLOCK_STEP:
            return None
        size = f"{abs(step):.0f} s" + (f" ({abs(step) / 3600:.1f} h)" if abs(step) >= 3600 else "")
        return Event("clock_step", Severity.WARNING, f"the wall clock stepped {'back' if step < 0 else 'forward'} "
                     f"{size}: times before and after it do not compare (events, pages and incident folders keep "
                     "the time the clock said; incident bundles are kept in the order they were written). Check "
                     "that the clock is synchronised (`timedatectl`)", now,
                     evidence={"step_seconds": round(step, 3)})


class Loop:
    """A supervised component made of one coroutine function."""

    def __init__(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        self.name, self._body = name, body

    async def run(self) -> None:
        await self._body()


class Components:
    """The supervisor's reports: a component that failed is an event, each one's state two gauges."""

    def __init__(self, sink: Sink, metrics: SelfMetrics) -> None:
        self.sink, self.metrics = sink, metrics

    def crashed(self, name: str, exc: BaseException) -> None:
        try:
            self.sink.record([Event("watchdog_error", Severity.WARNING, f"component {name} failed: {exc}",
                                    time.time(), evidence={"component": name, "error": repr(exc)})])
        except Exception:
            log.exception("could not record the failure of %s", name)

    def component_state(self, name: str, up: bool, restarts: int) -> None:
        self.metrics.set(families.COMPONENT_UP, 1 if up else 0, name)
        self.metrics.set(families.COMPONENT_RESTARTS, restarts, name)


class StoreHealth:
    """The store's reports (called on the loop): writing started failing, or works again. `changed` wakes the
    STATUS line (Health), which says it at once."""

    def __init__(self, sink: Sink, metrics: SelfMetrics, path: Path) -> None:
        self.sink, self.metrics, self.path = sink, metrics, path
        self.error: str | None = None  # why the store cannot be written now; None while it can
        self.changed = asyncio.Event()

    def __call__(self, error: str | None) -> None:
        was, self.error = self.error, error
        if error and not was:
            self.sink.record([Event("store_unwritable", Severity.WARNING,
                                    f"events cannot be stored: {error}. They are logged, alerted and acted on, kept "
                                    "in memory and written when the store works again", time.time(),
                                    evidence={"error": error, "store": str(self.path)})])
        elif was and not error:
            log.info("the store is written again")
            self.sink.resolve(conditions.STORE, f"the store is written again ({self.path.parent})")
        self.metrics.set(families.STORE_WRITABLE, 0 if error else 1)
        self.changed.set()


class LoopLag:
    """How late the event loop is, readable from any thread: the lateness so far of the probe that is due (a
    block going on, which the blocked loop cannot say itself) or the last one measured, whichever is larger. The
    exporter computes it at each scrape (`SelfMetrics.live`): no thread of its own wakes to keep it current."""

    def __init__(self) -> None:
        self.last = 0.0  # the last probe's lateness, seconds
        self.due: float | None = None  # when the next probe is due (the loop's clock, monotonic); None: no probe

    def __call__(self) -> float:
        due = self.due
        return self.last if due is None else max(self.last, time.monotonic() - due)


class Health:
    def __init__(self, config: DaemonConfig, sink: Sink, metrics: SelfMetrics, notifier: Notifier,
                 supervisor: Supervisor, store: QueuedStore, store_health: StoreHealth,
                 summary: Callable[[], str]) -> None:
        """`summary`: the daemon's one-line state, for STATUS. `config` is replaced on a reload."""
        self.config, self.sink, self.metrics, self.notifier, self.summary = config, sink, metrics, notifier, summary
        self.supervisor = supervisor  # the watchdog pings only while the supervisor is healthy
        self.store, self.store_health = store, store_health
        self.loop_lag = LoopLag()  # its own object: the metrics hold it, and it holds nothing back
        self.clock = WallClock()
        metrics.live(families.LOOP_LAG, self.loop_lag)

    def configure(self, config: DaemonConfig) -> None:
        """A reload's [daemon] settings."""
        self.config = config

    def loops(self) -> list[Loop]:
        loops = [Loop("loop_lag", self.watch_loop_lag), Loop("status", self.report_status)]
        if self.notifier.watchdog_seconds:
            loops.append(Loop("watchdog", self.ping_watchdog))
        return loops

    # --- the loops ---------------------------------------------------------------------------------

    async def watch_loop_lag(self) -> None:
        loop, lag = asyncio.get_running_loop(), self.loop_lag
        try:
            while True:  # due on the shared grid (ticks.py): at most LAG_PROBE from now, with the GPU round
                lag.due = next_tick(loop.time(), LAG_PROBE)
                await asyncio.sleep(lag.due - loop.time())
                lag.last = max(0.0, loop.time() - lag.due)
                self._lag_measured(lag.last)
        finally:
            lag.due = None  # not probing (stopped, or restarting after a crash): the last lateness stays

    def _lag_measured(self, lag: float) -> None:
        if lag > self.config.loop_lag_warn:
            self.metrics.inc(families.LOOP_BLOCKED)
            self.sink.record([Event("watchdog_error", Severity.WARNING,
                                    f"the event loop was blocked for {lag:.2f} s", time.time(),
                                    evidence={"loop_lag_seconds": round(lag, 3)})])

    async def report_status(self) -> None:
        while True:
            try:  # every status_interval, and at once when the store's health changes
                await asyncio.wait_for(self.store_health.changed.wait(), self.config.status_interval)
            except TimeoutError:
                pass
            self.store_health.changed.clear()
            if stepped := self.clock.step():
                self.sink.record([stepped])
            self.notifier.status(self.summary())
            self.metrics.set(families.STORE_PENDING_WRITES, self.store.pending)
            self.metrics.set(families.STORE_DROPPED_WRITES, self.store.dropped)

    async def ping_watchdog(self) -> None:
        """Ping at half the timeout, only while the loop is responsive and no component is crash-looping."""
        period = self.notifier.watchdog_seconds / 2
        while True:
            if self.supervisor.healthy() and self.loop_lag.last < period:
                self.notifier.watchdog()
            else:
                log.error("not pinging the watchdog: %s, loop lag %.2f s", self.supervisor.summary(),
                          self.loop_lag.last)
            await asyncio.sleep(period)
