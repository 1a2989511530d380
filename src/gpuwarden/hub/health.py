"""gpuwarden's own health: the event loop's lag, systemd's STATUS line and WATCHDOG pings, components that
fail, and a store that cannot be written. Its loops are supervised components like the others; what goes wrong
is reported through the sink as events (watchdog_error, store_unwritable, clock_step)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from gpuwarden.act.guard_watch import GuardWatch
from gpuwarden.config.settings import DaemonConfig
from gpuwarden.core import families
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.core.model import Event, Severity, Sink
from gpuwarden.core.registry import Registry
from gpuwarden.gpu.inventory import GpuInventory
from gpuwarden.gpu.uevents import UeventWatch
from gpuwarden.kernel.watch import KernelWatch
from gpuwarden.runtime.looplag import LoopLag
from gpuwarden.runtime.sdnotify import Notifier
from gpuwarden.runtime.supervise import Supervisor
from gpuwarden.runtime.ticks import next_tick
from gpuwarden.store.health import StoreHealth
from gpuwarden.store.sqlite import QueuedStore

log = logging.getLogger("gpuwarden")

# A block longer than loop_lag_warn + this is always seen (a shorter one over loop_lag_warn when a probe falls
# due within it); the gauge shows one while it lasts. A second: due with the GPU round and the kernel source's
# tick, the probe costs no wake-up of its own (each is 0.1-2 ms of CPU on a VM whose caches go cold asleep).
LAG_PROBE = 1.0
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


class Current:
    """The watches the supervisor built last (a restart builds a new one): for the summary; each that reports
    its state takes its name's place in the components' registry (the status page reads that)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.kernel: KernelWatch | None = None
        self.uevents: UeventWatch | None = None
        self.guard: GuardWatch | None = None

    def built(self, **watches: KernelWatch | UeventWatch | GuardWatch | None) -> None:
        for name, watch in watches.items():
            setattr(self, name, watch)
            if isinstance(watch, KernelWatch | UeventWatch):
                self.registry.register(name, watch)


class Summary:
    """The daemon's one-line state, for STATUS and the log."""

    def __init__(self, inventory: GpuInventory, store_health: StoreHealth, supervisor: Supervisor,
                 current: Current) -> None:
        self.inventory, self.store_health, self.supervisor, self.current = inventory, store_health, supervisor, current

    def __call__(self) -> str:
        gpus = len(self.inventory.gpus)
        error = self.store_health.error
        store = f"; STORE UNWRITABLE ({error})" if error else ""
        uevents = self.current.uevents
        unavailable = f"; uevents unavailable ({uevents.unavailable})" if uevents and uevents.unavailable else ""
        kernel = self.current.kernel.status if self.current.kernel else "none"
        return (f"kernel source {kernel}; {gpus} GPU{'s' if gpus != 1 else ''}; "
                f"{self.supervisor.summary()}{store}{unavailable}")


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
