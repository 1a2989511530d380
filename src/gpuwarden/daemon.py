"""The daemon: lifecycle and wiring only. It builds the components from the config and connects them to the hub
(where their events go), the policy and the actuator; supervises them, talks to systemd, reloads on SIGHUP."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from functools import partial
from pathlib import Path

from gpuwarden.act.actuator import Actuator
from gpuwarden.act.guard_watch import GuardWatch
from gpuwarden.alert.alerter import Alerter
from gpuwarden.alert.host import AlertContext
from gpuwarden.alert.targets import build as build_targets
from gpuwarden.config import settings as configuration
from gpuwarden.config import web as webconfig
from gpuwarden.config.settings import Config, ConfigError
from gpuwarden.core import families
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.core.model import ConditionKind
from gpuwarden.core.registry import Registry
from gpuwarden.engine.watch import EngineWatch
from gpuwarden.gpu.guarded import Guarded, PciChanged
from gpuwarden.gpu.inventory import GpuInventory
from gpuwarden.gpu.recorder import FlightRecorder
from gpuwarden.gpu.recovery import Recovery, boot_began
from gpuwarden.gpu.rules import TelemetryRules
from gpuwarden.gpu.uevents import UeventWatch
from gpuwarden.gpu.watch import GpuWatch
from gpuwarden.gpu.xidmerge import XidMerge
from gpuwarden.hub import snapshot
from gpuwarden.hub.health import Current, Health, Loop, Summary
from gpuwarden.hub.hub import Evidence, Hub
from gpuwarden.hub.queue import Outbox, Report
from gpuwarden.hub.tracker import IncidentTracker
from gpuwarden.kernel.clock import kernel_now
from gpuwarden.kernel.watch import POSITION, KernelWatch
from gpuwarden.runtime import logsetup, reloads
from gpuwarden.runtime.offloop import Busy, OffLoop
from gpuwarden.runtime.sdnotify import Notifier
from gpuwarden.runtime.sockets import holder
from gpuwarden.runtime.supervise import Components, Supervisor
from gpuwarden.store import bundles as report
from gpuwarden.store.health import StoreHealth
from gpuwarden.store.sqlite import QueuedStore, private_folder
from gpuwarden.web.exporter import STATUS_SOCKET, Exporter, LocalStatus, port_taken

log = logging.getLogger("gpuwarden")

_STOP_GRACE = 3.0  # components get this long to end after their cancellation
_STOP_DEADLINE = 10.0  # then the process ends, whatever still runs (systemd's TimeoutStopSec is 15 s)
_CONFIG = OffLoop("configuration", limit=2)  # a reload's read and name look-ups; the exporter's bind
_CONFIRMS = OffLoop("reload-confirm", limit=1)  # a small file in state_dir; a hung disk holds one thread
_RESUME = OffLoop("resume", limit=1)  # the store's reads at a start that scan events (a week of them may be many)
_STATUS_DEADLINE = 2.0  # the status page waits this long for the loop, then says it did not answer
_STATUS_FRESH = 1.0  # a snapshot this young is served again: a client asking in a loop costs the loop little


class Daemon:
    """Builds the object graph one way: each part gets what it uses at construction, and nothing is set on a
    part afterwards (a reload passes new settings through the parts' own `configure`). Components report
    through their own outbox onto one queue (reports.py); the hub is its only consumer and owns the actuator,
    whose outcomes come back as reports. tests/integration/test_object_graph.py holds the graph acyclic."""

    def __init__(self, config: Config, config_arg: Path | None, notifier: Notifier | None = None,
                 log_level: str | None = None) -> None:
        self.settings = Settings(config)  # the configuration now: a reload replaces it here, for every reader
        self.config_arg = config_arg  # what --config said; None: the default path or built-in defaults
        self.log_level = log_level  # what --log-level said: it outlives reloads; None: [daemon] log_level
        self._loop: asyncio.AbstractEventLoop | None = None
        self.notifier = notifier or Notifier()
        self.metrics = SelfMetrics()
        self.reports: asyncio.Queue[Report] = asyncio.Queue()  # unbounded: a fault is never dropped (reports.py)
        self.recorder = FlightRecorder(config.gpu.recorder_window)
        self.telemetry = TelemetryRules(config.gpu)  # what is open outlives the GPU watch's restarts and reloads
        self.inventory = GpuInventory(config.gpu.sysfs_root)
        components = Components(self._outbox("supervisor"), self.metrics)  # the supervisor's reports
        self.supervisor = Supervisor(components.crashed, components.component_state)
        self.store_health = StoreHealth(self._outbox("store"), self.metrics,
                                        config.daemon.state_dir / "gpuwarden.db")
        # built in run(), on the loop, in this order: store, health, engines, actuator, alerter, hub
        self.store: QueuedStore | None = None
        self.health: Health | None = None
        self.engines: EngineWatch | None = None
        self.actuator: Actuator | None = None
        self.alerter: Alerter | None = None
        self.alert_context: AlertContext | None = None
        self.hub: Hub | None = None
        self.recovery: Recovery | None = None  # the confirmation after a reboot, run once at the start
        self.exporter: Exporter | None = None
        self.local_status: LocalStatus | None = None  # `gpuwarden status` reads the daemon here, not on the port
        self.status: Status | None = None
        self.registry = Registry()  # each component's own state, for the status page (core/registry.py)
        self.current = Current(self.registry)  # the kernel, uevent and guard watches the supervisor built last
        self.summary = Summary(self.inventory, self.store_health, self.supervisor, self.current)
        self.started = time.monotonic()
        self.live_since = _live_from_now(config.kernel.source)  # kernel lines logged before this are history
        self._printk_ahead = self.live_since - time.monotonic()  # printk's clock against CLOCK_MONOTONIC (or 0)
        self._kernel_floor = self.live_since  # the same, for a kernel watch after one that read no kernel log
        self.xids = XidMerge()  # one event per Xid: the kernel log's copy and NVML's
        self._stopping = asyncio.Event()
        self._reload_lock = asyncio.Lock()
        self._recovery: asyncio.Task | None = None
        self._reloading: asyncio.Future | None = None

    @property
    def config(self) -> Config:
        return self.settings.config

    def _outbox(self, source: str) -> Outbox:
        """A component's own sink: its reports go on the one queue, its metrics to its own handles."""
        return Outbox(source, self.reports, self.metrics)

    async def _confirm_recovery(self) -> None:
        """On a new boot after a lost GPU: are the GPUs back as before? (recovery.py; once, in the background)"""
        try:
            await self.recovery.run()
        except Exception:  # the daemon runs on without the confirmation; the log says why
            log.exception("the GPU check after the reboot failed")

    def _dry_run(self) -> bool:
        cache = self.config.cache
        return cache.dry_run or cache.on_crash_loop == "alert"

    def _build(self, loop: asyncio.AbstractEventLoop) -> None:
        """The parts that need the running loop, each given what it uses."""
        cfg = self.config
        self.store = QueuedStore(cfg.daemon.state_dir / "gpuwarden.db", loop, self.store_health)
        self.health = Health(cfg.daemon, self._outbox("health"), self.metrics, self.notifier, self.supervisor,
                             self.store, self.store_health, self.summary)
        self.engines = EngineWatch(cfg.engines, cfg.engine, self._outbox("engines"), nvml=cfg.gpu.nvml)
        self.registry.register("engines", self.engines)
        self.actuator = Actuator(self._outbox("actuator"), self.engines, cfg.cache)
        self.alert_context = AlertContext(self.recorder, self.inventory, cfg)  # the hub's evidence tells it
        evidence = Evidence(self.store, self.recorder, self.metrics, cfg.alerts.hostname, self.engines.views(),
                            self.alert_context)
        folders = report.Folders(cfg.daemon.state_dir / "incidents")  # what the alerts ask of the incidents
        incidents = IncidentTracker(folders, evidence, keep=cfg.daemon.incidents_keep)
        self.alerter = Alerter(cfg.alerts, build_targets(cfg.alerts), self.store, self.metrics, folders.folder_for,
                               folders.folder, self.alert_context, folders.is_open)
        self.hub = Hub(self.reports, self.store, self.alerter, self.actuator, self.inventory, incidents, evidence,
                       self.metrics, self._dry_run(), self.engines)
        self.status = Status(loop, self.settings, self.started, self.metrics, self.summary, self.health,
                             self.store_health, self.registry, self.hub, self.recorder, self.inventory)

    # --- lifecycle --------------------------------------------------------------------------------

    async def run(self) -> int:
        loop = self._loop = asyncio.get_running_loop()
        state_dir = self.config.daemon.state_dir
        if warning := private_folder(state_dir, ours=state_dir == configuration.default_state_dir()):
            log.warning("%s", warning)
        self._build(loop)
        self.metrics.set(families.STORE_WRITABLE, 1)
        await self.alerter.recover()  # before anything ends: the page that told it began hears it end
        # a GPU lost before this start is still lost, an engine stuck or down still is until seen otherwise
        self.hub.load(time.time(), self.engines.engines, not self.engines.engines and self.config.engines.discover)
        # the GPUs a reboot may have cured, as the store held them (given to the check, not asked of the hub)
        self.recovery = Recovery(state_dir, self.config.gpu.sysfs_root, self.hub.still_lost(boot_began()),
                                 self._outbox("recovery").record)
        # an engine down before it is down until back; the kills made before count in its budget
        self.engines.resume(self.hub.conditions, time.time(), await self._kills_before())
        self.telemetry.resume(k.subject for k in self.hub.conditions if k.kind == ConditionKind.GPU_DEGRADED)
        self.hub.evidence.engines(self.engines.views(), {}, whole=True)  # a fault may come before their report
        self._start_exporter()
        self._start_local_status(state_dir)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop_signal)
        loop.add_signal_handler(signal.SIGHUP, self._reload_signal)
        await self._start_components()
        self._recovery = loop.create_task(self._confirm_recovery())
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
        if self._recovery:
            self._recovery.cancel()
        if stuck := await self.supervisor.stop(_STOP_GRACE):
            log.error("stopping without waiting for %s", ", ".join(stuck))
        self.hub.drain()  # what the components said last is stored before the store closes
        self.hub.incidents.stop()
        if self.exporter:
            self.exporter.stop()
        if self.local_status:
            self.local_status.stop()
        self.store.close(timeout=min(5.0, _STOP_DEADLINE - _STOP_GRACE - 1))
        deadline.cancel()  # stopped in time (a daemon run in a test's process must not end that process later)
        return 0

    async def _kills_before(self) -> list[tuple[str, float]]:
        """The real kills the last gpuwarden made within the longest kill budget window (one bounded query, off
        the loop). Not read in time: none, said (the budgets start afresh, as a restart did before)."""
        windows = [e.kill_budget_window for e in self.config.engine]
        if not windows:
            return []
        try:
            return await _RESUME.run("kills", _STOP_DEADLINE, self.store.kills, time.time() - max(windows))
        except (TimeoutError, Busy) as exc:
            log.error("the kills made before this start were not read (kill budgets start afresh): %s", exc)
            return []

    def stop(self) -> None:
        self._stopping.set()

    def _reload_signal(self) -> None:
        self._reloading = asyncio.ensure_future(self.reload())  # held: a task only the loop holds may vanish

    def _stop_signal(self) -> None:
        """The first SIGTERM/SIGINT stops in order; a second one while stopping ends the process at once."""
        if self._stopping.is_set():
            _exit_now("a second stop signal while stopping")
        self._stopping.set()

    def _start_exporter(self, retry: bool = False, web: webconfig.WebConfig | None = None) -> None:
        """The port is unprivileged: another user may hold it (a boot, a restart). Then the daemon runs on without
        its metrics, which matter less than its watch and its killer, and takes the port when it is free. Held
        by root or by us (another gpuwarden, a wrong `listen`) it is an error, as ever."""
        cfg = self.config.exporter
        if not cfg.enabled:
            return
        if web is None and cfg.web_config_file:  # checked when the config was loaded; read now
            web = webconfig.load(cfg.web_config_file)
        exporter = Exporter(self.metrics, cfg.listen, cfg.port, self.status, self.hub.incidents.folder, web)
        try:
            exporter.start()
        except OSError as exc:
            if retry:
                return
            uid = holder(cfg.listen, cfg.port)
            if uid is None or uid in (0, os.geteuid()):
                raise  # another gpuwarden, or this configuration's mistake: not a user's doing
            self._exporter_port_taken(exc, uid)
            return
        self.exporter = exporter
        host = f"[{cfg.listen}]" if ":" in cfg.listen else cfg.listen  # an IPv6 address goes in brackets in a URL
        log.info("serving metrics on http://%s:%d/metrics", host, self.exporter.port)

    def _exporter_port_taken(self, exc: OSError, uid: int) -> None:
        """Another user serves on the exporter's port: said as an event and an alert, not a log line alone."""
        cfg, interval = self.config.exporter, self.config.daemon.status_interval
        who = port_taken(self._outbox("exporter"), cfg.listen, cfg.port, uid, interval)
        log.error("%s: %s holds it; running on without metrics, trying again every %.0f s", exc, who, interval)

    def _start_local_status(self, state_dir: Path) -> None:
        local = LocalStatus(self.metrics, state_dir / STATUS_SOCKET, self.status, self.hub.incidents.folder)
        try:
            local.start()
        except OSError as exc:  # `status` then says no daemon answers: the watch matters more
            log.error("`gpuwarden status` cannot reach this daemon: %s: %s", local.path, exc.strerror or exc)
            return
        self.local_status = local

    async def _start_components(self) -> None:
        gpus = await self.inventory.refresh()
        log.info("found %s", ", ".join(f"{g.vendor} GPU {g.pci} ({g.driver or 'no driver'})" for g in gpus)
                 if gpus else "no GPUs")
        self.current.built(guard=None)
        self.supervisor.start("hub", self.hub)  # the one consumer of the reports; the queue outlives restarts
        self.supervisor.start("kernel", self._kernel_watch)
        self.supervisor.start("alerts", self.alerter)  # one alerter: its storm state outlives restarts
        self.supervisor.start("engines", self.engines)  # kill budgets outlive restarts too
        self.supervisor.start("gpus", partial(GpuWatch, self.config.gpu, self.inventory.current, self._outbox("gpus"),
                                              self.recorder, xid_overrides=self.config.kernel.xid_overrides(),
                                              xid_merge=self.xids, rules=self.telemetry))
        guarded = Guarded(self.config.guard, self.inventory)
        guard = self.config.guard
        if guard.enabled or (guard.enabled is None and os.geteuid() == 0):
            self.current.built(guard=GuardWatch(guard, self.config.gpu.sysfs_root, guarded.listed,
                                                self._outbox("guard")))
            self.supervisor.start("guard", self.current.guard)
        self.supervisor.start("uevents", partial(self._uevent_watch, guarded))
        for loop in self.health.loops():
            self.supervisor.start(loop.name, loop)
        if self.exporter is None and self.config.exporter.enabled:
            self.supervisor.start("exporter", Loop("exporter", self._take_exporter_port))

    async def _take_exporter_port(self) -> None:
        """Another user held the exporter's port at the start: take it once it is free."""
        while self.exporter is None:
            await asyncio.sleep(self.config.daemon.status_interval)
            async with self._reload_lock:  # a reload starts its own
                if self.exporter is None:
                    # `listen` may need a name look-up
                    await _CONFIG.run("exporter", _STOP_DEADLINE, self._start_exporter, True)

    def _kernel_watch(self) -> KernelWatch:
        # A watch built again (a reload, a restart after a failure) resumes after the last line the one before read
        # (the stored position can be a second older, or still on the queue), lines live from the same point. One
        # of another source after a watch that read no kernel log (a file, a journal it could not open) resumes
        # from a position as old as that: what it reads from before the reload is history (reload()).
        before = self.current.kernel
        if before is None:
            cursor, live_since = self.store.cursor(POSITION), self.live_since
        elif before.watched_kernel_log or before.config.source == self.config.kernel.source:
            cursor, live_since = before.cursor, before.live_since
        else:
            cursor, live_since = before.cursor, self._kernel_floor
        watch = KernelWatch(self.config.kernel, self.xids.tap(self._outbox("kernel"), time.monotonic), cursor,
                            live_since=live_since, gpus_behind=self.inventory.behind)
        self.current.built(kernel=watch)
        return watch

    def _uevent_watch(self, guarded: Guarded) -> UeventWatch:
        guard = self.current.guard
        changed = PciChanged(self.inventory, guard.recheck if guard else None)
        watch = UeventWatch(self._outbox("uevents"), guarded.devices, changed.changed)
        self.current.built(uevents=watch)
        return watch

    async def reload(self) -> None:
        async with self._reload_lock:
            began = time.clock_gettime_ns(time.CLOCK_MONOTONIC)  # before the file is read: `gpuwarden reload`
            self.notifier.reloading()
            def load():  # off the loop: `listen` may need a name look-up, a config_file is read
                new, path = configuration.load(self.config_arg)
                web = webconfig.load(new.exporter.web_config_file) if new.exporter.web_config_file else None
                return new, path, build_targets(new.alerts), web
            try:
                async with asyncio.timeout(_STOP_DEADLINE):
                    new, path, targets, web = await _CONFIG.run("reload", _STOP_DEADLINE, load)
            except Exception as exc:  # ConfigError, or anything a target's library raises: READY=1 must follow
                if not isinstance(exc, ConfigError):
                    log.exception("reload failed")
                why = reloads.reason(exc)
                log.error("reload failed, the running configuration stays:\n%s", why)
                self.notifier.status(f"reload failed, old configuration kept: {why.splitlines()[0]}")
                self.notifier.ready()
                await self._confirm_reload(began, why, None)
                return
            await self.supervisor.stop()
            before = self.current.kernel
            if before is not None and not before.watched_kernel_log and before.config.source != new.kernel.source:
                self._kernel_floor = await self._kernel_clock(new.kernel.source)
            # a web config is read again at each reload: a renewed certificate or password takes effect
            exporter_changed = new.exporter != self.config.exporter or web is not None
            self.settings.replace(new)
            self.health.configure(new.daemon)
            self.telemetry.configure(new.gpu)
            self.alerter.configure(new.alerts, targets)
            self.alert_context.configure(new)
            gone = set(self.engines.engines)
            self.engines = self.engines.reconfigured(new.engines, new.engine, new.gpu.nvml)
            self.registry.register("engines", self.engines)
            self.actuator.configure(self.engines, new.cache)
            self.hub.configure(new.alerts.hostname, self._dry_run(), new.daemon.incidents_keep, self.engines)
            self.hub.unwatched(gone - set(self.engines.engines))
            self.engines.resume(self.hub.conditions, time.time())  # the new watch's lifecycles start afresh
            if exporter_changed:
                if self.exporter:
                    self.exporter.stop()
                    self.exporter = None
                try:
                    self._start_exporter(web=web)
                except OSError as exc:  # the components must come back all the same
                    log.error("the exporter cannot serve on the new address: %s", exc)
            logsetup.setup(self.log_level or new.daemon.log_level)
            await self._start_components()
            await asyncio.sleep(0)
            log.info("reloaded %s", path or "built-in defaults")
            self.notifier.ready()
            self.notifier.status(self.summary())
            await self._confirm_reload(began, None, str(path or "built-in defaults"))

    async def _kernel_clock(self, source: str) -> float:
        """_live_from_now off the loop (a write to /dev/kmsg is a printk, which a slow console can hold up), bounded;
        where it does not answer, CLOCK_MONOTONIC moved by how far printk's clock was from it at the start."""
        try:
            return await _CONFIG.run("kernel clock", 1.0, _live_from_now, source)
        except Exception as exc:  # a reload goes on: the components are stopped and must come back
            log.warning("the kernel log's clock could not be read (%s); counting from CLOCK_MONOTONIC", exc)
            return time.monotonic() + self._printk_ahead

    async def _confirm_reload(self, began: int, error: str | None, config: str | None) -> None:
        """Tell `gpuwarden reload` (ExecReload) that the reload that began at `began` is done."""
        state_dir = self.store.path.parent  # where this daemon writes, whatever a new config says
        try:
            await _CONFIRMS.run("confirm", 5.0, reloads.confirm, state_dir, os.getpid(), began, error, config)
        except (OSError, TimeoutError, Busy) as exc:
            log.error("cannot confirm the reload in %s: %s", state_dir, exc)


class Settings:
    """The configuration now, read by the parts that outlive a reload."""

    def __init__(self, config: Config) -> None:
        self.config = config

    def replace(self, config: Config) -> None:
        self.config = config


class Status:
    """The status page's snapshot, for the exporter's threads: gathered on the loop, where the state lives, from
    the parts snapshot.gather reads (the daemon holds the exporter, so this holds the parts and not the daemon)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, settings: Settings, started: float, metrics: SelfMetrics,
                 summary: Summary, health: Health, store_health: StoreHealth, registry: Registry, hub: Hub,
                 recorder: FlightRecorder, inventory: GpuInventory) -> None:
        self._loop, self.settings, self.started, self.metrics, self.summary = loop, settings, started, metrics, summary
        self.health, self.store_health, self.registry, self.hub = health, store_health, registry, hub
        self.recorder, self.inventory = recorder, inventory
        self._last: tuple[float, dict] = (-_STATUS_FRESH, {})  # (monotonic time, snapshot)

    @property
    def config(self) -> Config:
        return self.settings.config

    def __call__(self) -> dict:
        at, snap = self._last
        if time.monotonic() - at < _STATUS_FRESH:
            return snap

        async def gather() -> dict:
            return snapshot.gather(self)
        future = asyncio.run_coroutine_threadsafe(gather(), self._loop)
        try:
            snap = future.result(_STATUS_DEADLINE)
            self._last = (time.monotonic(), snap)
            return snap
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"the daemon's event loop did not answer within {_STATUS_DEADLINE:.0f} s (see "
                               "gpuwarden_loop_lag_seconds on /metrics)") from None


def _live_from_now(source: str) -> float:
    """Now on the kernel log's own clock (clock.py: a line written to /dev/kmsg and its stamp read back, bounded),
    from which its lines are live; CLOCK_MONOTONIC where /dev/kmsg cannot be written, or for a file, whose lines
    carry no kernel time."""
    return time.monotonic() if source == "file" else kernel_now()


def _exit_now(why: str) -> None:
    """The hard end of a stop that hangs: the recovery guard was released when its component was cancelled."""
    log.critical("exiting now: %s", why)
    logging.shutdown()
    os._exit(1)
