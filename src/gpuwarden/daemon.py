"""The daemon: builds components from the config, supervises them, talks to systemd, reloads on SIGHUP."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path

from gpuwarden import config as configuration
from gpuwarden import families, logsetup, policy, reloads, report
from gpuwarden.act.guard_watch import GuardWatch
from gpuwarden.act.quarantine import cache_dirs, quarantine_all
from gpuwarden.alert.alerter import Alerter
from gpuwarden.alert.targets import build as build_targets
from gpuwarden.config import Config, ConfigError
from gpuwarden.engine.watch import EngineWatch
from gpuwarden.exporter import Exporter, SelfMetrics
from gpuwarden.gpu import pci
from gpuwarden.gpu.discovery import discover
from gpuwarden.gpu.recorder import FlightRecorder
from gpuwarden.gpu.uevents import UeventWatch
from gpuwarden.gpu.watch import GpuWatch
from gpuwarden.kernel.watch import KernelWatch
from gpuwarden.model import Event, Severity
from gpuwarden.offloop import Busy, OffLoop
from gpuwarden.sdnotify import Notifier
from gpuwarden.sockets import holder
from gpuwarden.store import QueuedStore, Store
from gpuwarden.supervise import Supervisor

log = logging.getLogger("gpuwarden")

_LOG_LEVEL = {Severity.INFO: logging.INFO, Severity.WARNING: logging.WARNING, Severity.CRITICAL: logging.ERROR}
_LAG_PROBE = 0.5  # a block longer than loop_lag_warn + this is always seen
_REDISCOVER_SECONDS = 5.0
_STOP_GRACE = 3.0  # components get this long to end after their cancellation
_STOP_DEADLINE = 10.0  # then the process ends, whatever still runs (systemd's TimeoutStopSec is 15 s)
_CONFIRMS = OffLoop("reload-confirm", limit=1)  # a small file in state_dir; a hung disk holds one thread


def _describe(action: policy.Kill | policy.Quarantine) -> str:
    if isinstance(action, policy.Kill):
        return f"would kill {action.engine}: {action.reason}"
    return f"would quarantine caches: {action.reason}"


class _Loop:
    """A supervised component made of one coroutine function."""

    def __init__(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        self.name, self._body = name, body

    async def run(self) -> None:
        await self._body()


class Daemon:
    def __init__(self, config: Config, config_arg: Path | None, notifier: Notifier | None = None) -> None:
        self.config = config
        self.config_arg = config_arg  # what --config said; None: the default path or built-in defaults
        self.notifier = notifier or Notifier()
        self.metrics = SelfMetrics()
        self.supervisor = Supervisor(self._crashed, self._component_state)
        self.store: Store | QueuedStore | None = None
        self.store_error: str | None = None  # why the store cannot be written now; None while it can
        self.alerter: Alerter | None = None
        self.engines: EngineWatch | None = None
        self.guard: GuardWatch | None = None
        self.recorder = FlightRecorder(config.gpu.recorder_window)
        self.recent_lines: deque[tuple[float, str]] = deque(maxlen=report.KERNEL_LINES)
        self.incidents = report.Incidents(config.daemon.state_dir / "incidents", self._incident)
        self._actions: set[asyncio.Task] = set()
        self.exporter: Exporter | None = None
        self.kernel: KernelWatch | None = None
        self.uevents: UeventWatch | None = None
        self.gpus: list = []
        self.gpus_seen: set[str] = set()  # every GPU discovered since start: a fault may kill only for these
        self.started = time.monotonic()  # kernel lines logged before this are history
        self.lag = 0.0
        self._stopping = asyncio.Event()
        self._reload_lock = asyncio.Lock()

    # --- the sink that components report to ------------------------------------------------------

    def record(self, events: list[Event], cursor: tuple[str, str] | None = None) -> list[int]:
        """Hand events (and the cursor of the source that read them) to the store, then log, count, alert and
        act on them. The store never refuses and never waits: what it cannot write yet it keeps and retries."""
        ids = self.store.add_events(events, cursor)
        for event, event_id in zip(events, ids, strict=True):
            if event.live:  # history beside today's telemetry would mislead: it is alerted, not bundled
                self.incidents.offer(event, event_id)
        if self.alerter and events:
            self.alerter.submit(events, ids)
        for event in events:
            self.metrics.inc(families.EVENTS, event.kind, str(event.severity), by=event.count)
            log.log(_LOG_LEVEL[event.severity], "%s %s: %s", event.severity, event.kind, event.message,
                    extra=logsetup.event_fields(event.kind, event.gpu, event.engine))
            self._act(event)
        return ids

    def _act(self, event: Event) -> None:
        """The policy's actions for a stored event, started in the background."""
        views = self.engines.views() if self.engines else []
        for action in policy.decide(event, views, frozenset(self.gpus_seen)):
            if isinstance(action, policy.Kill):
                self._background(self.engines.kill(action.engine, action.reason))
            elif isinstance(action, policy.Quarantine):
                self._background(self._quarantine(action.reason))
            else:
                log.warning("not acting on %s (%s): %s", event.kind, _describe(action.action), action.why)

    def _background(self, action: Awaitable[None]) -> None:
        task = asyncio.get_running_loop().create_task(action)
        self._actions.add(task)
        task.add_done_callback(self._actions.discard)

    async def _quarantine(self, reason: str) -> None:
        """Move poisoned compile caches aside (a scan can take a while: off the loop)."""
        cfg = self.config.cache
        dry_run = cfg.dry_run or cfg.on_crash_loop == "alert"
        event = await asyncio.to_thread(quarantine_all, cache_dirs(cfg), reason, time.time(), dry_run)
        if event:
            self.record([event])
        else:
            log.info("%s: no zero-byte file in the compile caches", reason)

    def resolve(self, dedupe_key: str, message: str) -> None:
        if self.alerter:
            self.alerter.resolve(dedupe_key, message)

    def metric(self, family: families.Family, value: float, *labels: str) -> None:
        self.metrics.set(family, value, *labels)

    def replace_series(self, family: families.Family, series: dict[tuple[str, ...], float]) -> None:
        self.metrics.replace(family, series)

    def set_count(self, row_id: int, event: Event) -> None:
        """A stored event's storm closed at `event.count` lines."""
        self.store.set_count(row_id, event.count)
        if self.alerter:
            self.alerter.repeated(event)

    def count(self, family: families.Family, *labels: str, by: float = 1) -> None:
        if by:
            self.metrics.inc(family, *labels, by=by)

    def gpus_behind(self, port: str) -> list[str]:
        return pci.behind(self.config.gpu.sysfs_root, port, [g.pci for g in self.gpus])

    def kernel_lines(self, now: float, texts: list[str]) -> None:
        self.recent_lines.extend((now, text) for text in texts)

    def _incident(self, trigger: Event, trigger_id: int, opened: float) -> dict:
        """An incident bundle's content, gathered now (on the loop: the recorder and the lines live here)."""
        since = opened - report.BEFORE
        events = self.store.events(since=since)
        telemetry = {gpu: self.recorder.history(gpu) for gpu in self.recorder.latest()}
        lines = [line for line in self.recent_lines if line[0] >= since]
        return report.bundle(report.row(trigger, trigger_id), events, lines, telemetry,
                             self.engines.samples() if self.engines else {}, self.config.alerts.hostname)

    def polled(self, source: str) -> None:
        self.metrics.set(families.SOURCE_LAST_SUCCESS, time.time(), source)

    def _crashed(self, name: str, exc: BaseException) -> None:
        try:
            self.record([Event("watchdog_error", Severity.WARNING, f"component {name} failed: {exc}",
                               time.time(), evidence={"component": name, "error": repr(exc)})])
        except Exception:
            log.exception("could not record the failure of %s", name)

    def _store_health(self, error: str | None) -> None:
        """Writing to the store started failing (`error`) or works again (None): one alert, one STATUS line."""
        was, self.store_error = self.store_error, error
        if error and not was:
            self.record([Event("store_unwritable", Severity.WARNING,
                               f"events cannot be stored: {error}. They are logged, alerted and acted on, kept in "
                               "memory and written when the store works again", time.time(),
                               evidence={"error": error, "store": str(self.store.path)})])
        elif was and not error:
            log.info("the store is written again")
            self.resolve(Event("store_unwritable", Severity.WARNING, "", 0).dedupe_key,
                         f"the store is written again ({self.config.daemon.state_dir})")
        self.metrics.set(families.STORE_WRITABLE, 0 if error else 1)
        self.notifier.status(self.summary())

    def _component_state(self, name: str, up: bool, restarts: int) -> None:
        self.metrics.set(families.COMPONENT_UP, 1 if up else 0, name)
        self.metrics.set(families.COMPONENT_RESTARTS, restarts, name)

    # --- lifecycle --------------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self.store = QueuedStore(self.config.daemon.state_dir / "gpuwarden.db", loop, self._store_health)
        self.metrics.set(families.STORE_WRITABLE, 1)
        self.alerter = Alerter(self.config.alerts, build_targets(self.config.alerts), self.store, self.metrics,
                               self.incidents.folder_for)
        self.engines = EngineWatch(self.config.engines, self.config.engine, self, nvml=self.config.gpu.nvml)
        self._start_exporter()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop_signal)
        loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self.reload()))
        self._start_components()
        await asyncio.sleep(0)  # let each component's task build its component before we say READY
        self.notifier.ready()
        self.notifier.status(self.summary())
        log.info("gpuwarden running: %s", self.summary())
        await self._stopping.wait()
        log.info("stopping")
        self.notifier.stopping()
        deadline = threading.Timer(_STOP_DEADLINE, _exit_now, (f"not stopped after {_STOP_DEADLINE:.0f} s",))
        deadline.daemon = True
        deadline.start()
        if stuck := await self.supervisor.stop(_STOP_GRACE):
            log.error("stopping without waiting for %s", ", ".join(stuck))
        self.incidents.stop()
        if self.exporter:
            self.exporter.stop()
        self.store.close(timeout=min(5.0, _STOP_DEADLINE - _STOP_GRACE - 1))
        return 0

    def stop(self) -> None:
        self._stopping.set()

    def _stop_signal(self) -> None:
        """The first SIGTERM/SIGINT stops in order; a second one while stopping ends the process at once."""
        if self._stopping.is_set():
            _exit_now("a second stop signal while stopping")
        self._stopping.set()

    def _start_exporter(self, retry: bool = False) -> None:
        """The port is unprivileged: another user may hold it (a boot, a restart). Then the daemon runs on without
        its metrics, which matter less than its watch and its killer, and takes the port when it is free. Held
        by root or by us (another gpuwarden, a wrong `listen`) it is an error, as ever."""
        cfg = self.config.exporter
        if not cfg.enabled:
            return
        exporter = Exporter(self.metrics, cfg.listen, cfg.port)
        try:
            exporter.start()
        except OSError as exc:
            if retry:
                return
            uid = holder(cfg.listen, cfg.port)
            if uid is None or uid in (0, os.geteuid()):
                raise  # another gpuwarden, or this configuration's mistake: not a user's doing
            log.error("%s: uid %d holds it; running on without metrics, trying again every %.0f s", exc, uid,
                      self.config.daemon.status_interval)
            return
        self.exporter = exporter
        host = f"[{cfg.listen}]" if ":" in cfg.listen else cfg.listen  # an IPv6 address goes in brackets in a URL
        log.info("serving metrics on http://%s:%d/metrics", host, self.exporter.port)

    def _start_components(self) -> None:
        gpus = self._discover()
        log.info("found %s", ", ".join(f"{g.vendor} GPU {g.pci} ({g.driver or 'no driver'})" for g in gpus)
                 if gpus else "no GPUs")
        self.guard = None
        self.supervisor.start("kernel", self._kernel_watch)
        self.supervisor.start("alerts", lambda: self.alerter)  # one alerter: its storm state outlives restarts
        self.supervisor.start("engines", lambda: self.engines)  # kill budgets outlive restarts too
        self.supervisor.start("gpus", lambda: GpuWatch(self.config.gpu, self._current_gpus, self, self.recorder,
                                                       xid_overrides=self.config.kernel.xid_overrides()))
        self.supervisor.start("uevents", self._uevent_watch)
        guard = self.config.guard
        if guard.enabled or (guard.enabled is None and os.geteuid() == 0):
            self.guard = GuardWatch(guard, self.config.gpu.sysfs_root, lambda: list(self._guarded_devices()),
                                    self)
            self.supervisor.start("guard", lambda: self.guard)
        self.supervisor.start("loop_lag", lambda: _Loop("loop_lag", self._watch_loop_lag))
        self.supervisor.start("status", lambda: _Loop("status", self._report_status))
        if self.notifier.watchdog_seconds:
            self.supervisor.start("watchdog", lambda: _Loop("watchdog", self._ping_watchdog))

    def _discover(self) -> list:
        self.gpus = discover(self.config.gpu.sysfs_root)
        self.gpus_seen.update(g.pci for g in self.gpus)
        self._discovered_at = time.monotonic()
        return self.gpus

    def _current_gpus(self) -> list:
        """The GPUs, looked for again every few seconds: a GPU can vanish without a uevent reaching us."""
        if time.monotonic() - self._discovered_at > _REDISCOVER_SECONDS:
            self._discover()
        return self.gpus

    def _guarded_devices(self) -> set[str]:
        return set(self.config.guard.devices or (g.pci for g in self.gpus))

    def _pci_changed(self) -> None:
        """A GPU came, went, or was (un)bound: look for GPUs again and re-check the guard at once."""
        self._discover()
        if self.guard:
            self.guard.recheck.set()

    def _kernel_watch(self) -> KernelWatch:
        watch = KernelWatch(self.config.kernel, self, self.store.cursor("journal"), live_since=self.started)
        self.kernel = watch
        return watch

    def _uevent_watch(self) -> UeventWatch:
        self.uevents = UeventWatch(self, self._guarded_devices, self._pci_changed)
        return self.uevents

    def summary(self) -> str:
        gpus = len(self.gpus)
        store = f"; STORE UNWRITABLE ({self.store_error})" if self.store_error else ""
        uevents = f"; uevents unavailable ({self.uevents.unavailable})" if self.uevents and self.uevents.unavailable \
            else ""
        kernel = self.kernel.status if self.kernel else "none"
        return (f"kernel source {kernel}; {gpus} GPU{'s' if gpus != 1 else ''}; "
                f"{self.supervisor.summary()}{store}{uevents}")

    async def reload(self) -> None:
        async with self._reload_lock:
            began = time.clock_gettime_ns(time.CLOCK_MONOTONIC)  # before the file is read: `gpuwarden reload`
            self.notifier.reloading()
            def load():  # off the loop: `listen` may need a name look-up, a config_file is read
                new, path = configuration.load(self.config_arg)
                return new, path, build_targets(new.alerts)
            try:
                async with asyncio.timeout(_STOP_DEADLINE):
                    new, path, targets = await asyncio.to_thread(load)
            except Exception as exc:  # ConfigError, or anything a target's library raises: READY=1 must follow
                if not isinstance(exc, ConfigError):
                    log.exception("reload failed")
                log.error("reload failed, the running configuration stays:\n%s", exc)
                self.notifier.status(f"reload failed, old configuration kept: {str(exc).splitlines()[0]}")
                self.notifier.ready()
                await self._confirm_reload(began, str(exc), None)
                return
            await self.supervisor.stop()
            exporter_changed = new.exporter != self.config.exporter
            self.config = new
            self.alerter.configure(new.alerts, targets)
            self.engines = self.engines.reconfigured(new.engines, new.engine, new.gpu.nvml)
            if exporter_changed:
                if self.exporter:
                    self.exporter.stop()
                    self.exporter = None
                try:
                    self._start_exporter()
                except OSError as exc:  # the components must come back all the same
                    log.error("the exporter cannot serve on the new address: %s", exc)
            logsetup.setup(new.daemon.log_level)
            self._start_components()
            await asyncio.sleep(0)
            log.info("reloaded %s", path or "built-in defaults")
            self.notifier.ready()
            self.notifier.status(self.summary())
            await self._confirm_reload(began, None, str(path or "built-in defaults"))

    async def _confirm_reload(self, began: int, error: str | None, config: str | None) -> None:
        """Tell `gpuwarden reload` (ExecReload) that the reload that began at `began` is done."""
        state_dir = self.store.path.parent  # where this daemon writes, whatever a new config says
        try:
            await _CONFIRMS.run("confirm", 5.0, reloads.confirm, state_dir, os.getpid(), began, error, config)
        except (OSError, TimeoutError, Busy) as exc:
            log.error("cannot confirm the reload in %s: %s", state_dir, exc)

    # --- small loops --------------------------------------------------------------------------------

    async def _watch_loop_lag(self) -> None:
        loop = asyncio.get_running_loop()
        beat = [time.monotonic()]  # when the loop last woke the probe, for the thread that exports the lag
        stop = threading.Event()
        threading.Thread(target=self._export_loop_lag, args=(beat, stop), name="loop-lag", daemon=True).start()
        try:
            while True:
                start = loop.time()
                await asyncio.sleep(_LAG_PROBE)
                beat[0] = time.monotonic()
                self.lag = max(0.0, loop.time() - start - _LAG_PROBE)
                self._lag_measured()
        finally:
            stop.set()

    def _export_loop_lag(self, beat: list[float], stop: threading.Event) -> None:
        """From a thread: a loop that is blocked right now cannot say so itself. The gauge is the larger of the
        lateness so far of the probe that is due (a block in progress) and the last one measured."""
        while not stop.wait(_LAG_PROBE / 2):
            late = max(0.0, time.monotonic() - beat[0] - _LAG_PROBE)
            self.metrics.set(families.LOOP_LAG, max(late, self.lag))

    def _lag_measured(self) -> None:
        self.metrics.set(families.LOOP_LAG, self.lag)
        if self.lag > self.config.daemon.loop_lag_warn:
            self.metrics.inc(families.LOOP_BLOCKED)
            self.record([Event("watchdog_error", Severity.WARNING,
                               f"the event loop was blocked for {self.lag:.2f} s", time.time(),
                               evidence={"loop_lag_seconds": round(self.lag, 3)})])

    async def _report_status(self) -> None:
        while True:
            await asyncio.sleep(self.config.daemon.status_interval)
            if self.exporter is None and self.config.exporter.enabled:
                async with self._reload_lock:  # a reload starts its own
                    if self.exporter is None:
                        await asyncio.to_thread(self._start_exporter, True)  # `listen` may need a name look-up
            self.notifier.status(self.summary())
            if isinstance(self.store, QueuedStore):
                self.metrics.set(families.STORE_PENDING_WRITES, self.store.pending)
                self.metrics.set(families.STORE_DROPPED_WRITES, self.store.dropped)

    async def _ping_watchdog(self) -> None:
        """Ping at half the timeout, only while the loop is responsive and no component is crash-looping."""
        period = self.notifier.watchdog_seconds / 2
        while True:
            if self.supervisor.healthy() and self.lag < period:
                self.notifier.watchdog()
            else:
                log.error("not pinging the watchdog: %s, loop lag %.2f s", self.supervisor.summary(), self.lag)
            await asyncio.sleep(period)


def _exit_now(why: str) -> None:
    """The hard end of a stop that hangs: the recovery guard was released when its component was cancelled."""
    log.critical("exiting now: %s", why)
    logging.shutdown()
    os._exit(1)
