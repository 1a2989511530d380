"""The engines component: scrape each engine, detect stalls, exits and crash loops, and report them. It never
kills: the policy decides and the actuator kills, through `inspect` for a fresh look at the processes."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from urllib.parse import urlsplit

import psutil

from gpuwarden import conditions, enginekinds, families
from gpuwarden.config import SCHEME_PORTS, EngineConfig, EnginesConfig, user_id
from gpuwarden.engine import lifecycle as lc
from gpuwarden.engine.canary import CanaryResult, api_for, canary
from gpuwarden.engine.discovery import Found, discover, probe_order, with_source
from gpuwarden.engine.kfd import pasids_of
from gpuwarden.engine.logs import LogRefused, LogScraper
from gpuwarden.engine.metrics import EngineSample
from gpuwarden.engine.processes import TargetSpec, Tracker, cpu_percents, gpus_in_use, resolve
from gpuwarden.engine.scraper import ScrapeError, Scraper
from gpuwarden.engine.slots import SlotsScraper
from gpuwarden.engine.stall import StallDetector, Verdict, next_look
from gpuwarden.gpu import nvidia
from gpuwarden.logsetup import redact
from gpuwarden.model import Event, Severity, Sink
from gpuwarden.offloop import Busy, OffLoop
from gpuwarden.policy import EngineView
from gpuwarden.sockets import pinned

log = logging.getLogger(__name__)

SPINNING_PERCENT = 75.0  # near a full core (a loaded box gives a spinning process less than one)
# How long a fault with no owner keeps an engine under suspicion (each new one starts it again): a GPU that a
# fault left hanging shows it within seconds; a suspicion for ever would judge every long request on the floor.
SUSPICION = 300.0
_INSPECT_DEADLINE = 10.0
_CANARY_EVERY = 2.0  # at most this often a starting engine that answers is asked for a completion
_INSPECTS = OffLoop("process look-up", limit=64)  # one per engine: a hung NVML holds one thread each, no more
_DISCOVERY = OffLoop("discovery", limit=2)  # a /proc walk and one probe at a time
_DISCOVERY_DEADLINE = 30.0
_NVML_CALL = threading.Lock()  # and at most one of them waits inside NVML; the others skip it


_ENDPOINT = {"slots": "/slots", "log": "its log", "metrics": "/metrics"}  # where a source reads progress


@dataclass
class EngineState:
    config: EngineConfig
    scraper: Scraper | LogScraper | SlotsScraper
    lifecycle: lc.Lifecycle
    tracker: Tracker = field(default_factory=Tracker)
    procs: list[psutil.Process] = field(default_factory=list)
    instance: lc.Instance = frozenset()  # its processes' (pid, start time) at the last look
    refused: list[str] = field(default_factory=list)  # candidates the target named but may not be killed
    looking: asyncio.Future | None = None  # the look-up of the engine's processes under way
    gpus: frozenset[str] | None = None
    cpus: list[float] = field(default_factory=list)  # each process's share of a core since the last look
    canary_at: float = -1e9  # monotonic time of the last canary
    canary_progress: float | None = None  # the progress counter then: moved since means busy and progressing
    canary_failed: bool = False
    pasids: frozenset[int] | None = None  # its processes' KFD pasids (AMD); None: none to read
    suspect_until: float = 0.0  # monotonic: under suspicion until then (a fault with no owner on its GPU)
    suspicion: str = ""  # why
    suspect_canary: bool = False  # a canary is due for the suspicion
    checking: asyncio.Future | None = None  # the suspicion's canary under way
    log_refused: str | None = None  # why its log file was last refused (said once)
    lookalike: bool = False  # discovered, and not an installed engine's program: its events are never pages

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def cpu(self) -> float | None:
        return max(self.cpus) if self.cpus else None

    @property
    def gpu(self) -> str | None:
        """Its GPU when it uses exactly one."""
        return next(iter(self.gpus)) if self.gpus and len(self.gpus) == 1 else None

    @property
    def sample(self) -> EngineSample | None:
        return self.lifecycle.sample

    def view(self) -> EngineView:
        cfg, life = self.config, self.lifecycle
        return EngineView(self.name, self.gpus, cfg.on_stall, cfg.on_gpu_fault, cfg.on_unresponsive, cfg.dry_run,
                          cfg.kill_budget, cfg.kill_budget_window, life.kills,
                          pids=frozenset(p.pid for p in self.procs), restart_failed=life.restart_refused,
                          pasids=self.pasids, suspect=self.suspected(time.monotonic()))

    def suspected(self, now: float) -> bool:
        return now < self.suspect_until


@dataclass(frozen=True, slots=True)
class KillTarget:
    """What the actuator needs to kill (and restart) an engine: a fresh look, and its configuration."""

    procs: list[psutil.Process]
    refused: list[str]
    gpu: str | None
    config: EngineConfig


def target_spec(config: EngineConfig) -> TargetSpec:
    t, url = config.target, urlsplit(pinned(config.metrics_url))
    return TargetSpec(t.kind, port=url.port or SCHEME_PORTS[url.scheme], host=url.hostname, pidfile=t.pidfile,
                      pattern=t.pattern, unit=t.unit, cgroup=t.cgroup, container=t.container,
                      docker_socket=t.docker_socket, uid=user_id(t.user) if t.user else None)


def base_url(config: EngineConfig) -> str:
    """The engine's API: `url`, else metrics_url's scheme, host and port."""
    if config.url:
        return pinned(config.url.rstrip("/"))
    parts = urlsplit(pinned(config.metrics_url))
    return f"{parts.scheme}://{parts.netloc}"


def source_of(config: EngineConfig, owner=lambda: None) -> Scraper | LogScraper | SlotsScraper:
    """`owner`: the engine's user as known now (a log file is read only when root's or that user's)."""
    if config.source == "log":
        return LogScraper.of(config.log_file, config.log_unit, config.profile, config.log_container,
                             config.target.docker_socket, owner)
    if config.source == "slots":
        return SlotsScraper(base_url(config), config.scrape_timeout, config.max_body_bytes)
    return Scraper(pinned(config.metrics_url), config.profile, config.scrape_timeout, config.max_body_bytes)


def stall_floor(config: EngineConfig) -> float:
    """A log says progress only every so often (vLLM: every 10 s): a stall is at least two such intervals."""
    if config.source != "log":
        return config.min_stall
    kind = enginekinds.named(config.profile)
    logs = [kind.log] if kind else [k.log for k in enginekinds.all_kinds() if k.log]
    return max(config.min_stall, *(2 * p.interval for p in logs))


def rules_of(config: EngineConfig) -> lc.Rules:
    return lc.Rules(config.unresponsive_after, config.kill_grace, config.crash_loop_exits, config.crash_loop_window,
                 config.restart_timeout, max(config.scrape_interval, _CANARY_EVERY), config.kill_budget_window)


def new_state(config: EngineConfig) -> EngineState:
    floor = stall_floor(config)
    lifecycle = lc.Lifecycle(rules_of(config), lambda: StallDetector(config.stall_multiple, floor, config.max_stall))
    tracker = Tracker()
    configured = user_id(config.target.user) if config.target.user else None
    return EngineState(config, source_of(config, lambda: configured if configured is not None else tracker.uid),
                       lifecycle, tracker=tracker, gpus=frozenset(config.gpus) if config.gpus else None)


class EngineWatch:
    name = "engines"

    def __init__(self, settings: EnginesConfig, engines: list[EngineConfig], sink: Sink, nvml: bool = True) -> None:
        self.settings, self.sink = settings, sink
        self.engines: dict[str, EngineState] = {e.name: new_state(e) for e in engines}
        self._tasks: asyncio.TaskGroup | None = None
        self._nvml = None if nvml else False  # loaded on first use; False when off ([gpu] nvml) or no driver
        self._unwatchable: set[str] = set()  # discovered engines already said to offer no source
        self._skipped: set[str] = set()  # discovered engines already said to be past max_discovered
        self._probed: dict[str, float] = {}  # when each discovered server was last probed for a source
        self._watching: dict[str, asyncio.Task] = {}  # each discovered engine's watch
        self._flooded = False  # the discovery_flood alert was sent for the crowd now skipped

    def reconfigured(self, settings: EnginesConfig, engines: list[EngineConfig], nvml: bool = True) -> EngineWatch:
        """A watch for a new configuration that keeps the kill budgets and process trackers of engines that
        stay (a reload must not reset how often an engine may be killed)."""
        new = EngineWatch(settings, engines, self.sink, nvml)
        for name, state in new.engines.items():
            if name in self.engines:
                state.lifecycle.kept(self.engines[name].lifecycle)
                state.tracker = self.engines[name].tracker
        return new

    def samples(self) -> dict[str, dict]:
        """Each engine's last scrape (for incident reports); None where none succeeded yet."""
        return {name: asdict(s.sample) if s.sample else None for name, s in self.engines.items()}

    def views(self) -> list[EngineView]:
        return [s.view() for s in self.engines.values()]

    # --- the actuator's port: a fresh look before a kill, and being told of it ---------------------------

    async def target(self, name: str) -> KillTarget | None:
        state = self.engines.get(name)
        if state is None:
            return None
        await self.inspect(state)
        return KillTarget(list(state.procs), list(state.refused), state.gpu, state.config)

    def killing(self, name: str, restart: bool) -> None:
        """A real kill of it begins: its processes going now is our doing, and it is down until back."""
        if state := self.engines.get(name):
            state.lifecycle.killing(time.monotonic(), restart)

    def restart_failed(self, name: str) -> None:
        if state := self.engines.get(name):
            state.lifecycle.restart_failed()

    def suspect(self, name: str, reason: str, fault: Event) -> Event | None:
        """The policy's `Suspect`: watch the engine closely for SUSPICION seconds (its stall threshold at the
        floor, a canary at the next look). Returns the engine_suspect event to record; None for an engine this
        watch does not have, or one already under suspicion (a storm of faults extends it and says nothing more)."""
        state = self.engines.get(name)
        if state is None:
            return None
        now = time.monotonic()
        if state.suspected(now):
            state.suspect_until = now + SUSPICION
            return None
        state.suspect_until, state.suspicion, state.suspect_canary = now + SUSPICION, reason, True
        floor = state.lifecycle.detector.floor
        evidence = {"reason": reason, "fault": {"kind": fault.kind, "gpu": fault.gpu, "message": fault.message},
                    "seconds": SUSPICION, "floor_seconds": floor}
        if "incident" in fault.evidence:  # what this fault did belongs to its incident
            evidence["incident"] = fault.evidence["incident"]
        return Event("engine_suspect", Severity.WARNING,
                     f"{name} is under suspicion ({reason}): its stall threshold drops to "
                     f"{floor:.0f} s and a canary runs; it is killed only if it then stops "
                     "progressing or does not answer", time.time(), engine=name, gpu=fault.gpu or state.gpu,
                     evidence=evidence)

    def user(self, name: str) -> int | None:
        """The engine's user: configured, else the one its processes were last seen as (None: not known)."""
        state = self.engines.get(name)
        if state is None:
            return None
        return user_id(state.config.target.user) if state.config.target.user else state.tracker.uid

    async def run(self) -> None:
        self.sink.engines(self.views(), self.samples())
        async with asyncio.TaskGroup() as tasks:
            self._tasks = tasks
            for state in self.engines.values():
                tasks.create_task(self._watch(state))
            if not self.engines and self.settings.discover:
                tasks.create_task(self._discover())

    async def _discover(self) -> None:
        first = True
        while True:
            try:
                found = await _DISCOVERY.run("processes", _DISCOVERY_DEADLINE, discover)
            except (Busy, TimeoutError):
                log.warning("looking for engine servers took longer than %.0f s; trying again", _DISCOVERY_DEADLINE)
                await asyncio.sleep(self.settings.discover_interval)
                continue
            # Anyone can start servers that look like engines: root watches (and probes) a bounded number.
            cap = self.settings.max_discovered
            for f in probe_order([f for f in found if f.name not in self.engines], self._probed)[:cap]:
                if len(self.engines) >= cap and not (f.installed and self._make_room()):
                    break
                self._probed[f.name] = time.monotonic()
                try:
                    f = await _DISCOVERY.run("probe", _DISCOVERY_DEADLINE, with_source, f)
                except (Busy, TimeoutError):
                    continue  # probed again on a later round
                if f.source == "none":
                    if f.name not in self._unwatchable:
                        self._unwatchable.add(f.name)
                        log.warning("discovered %s serving on port %d (%s), but no source to watch it through "
                                    "answers: %s", f.profile, f.port, f.place, f.more)
                    continue
                log.info("discovered %s serving on port %d (%s): watching it through %s, alerts only; for more: "
                         "%s", f.profile, f.port, f.place, f.through, f.more)
                # Alert-only: anyone can start a server that looks like an engine; kills need a configuration.
                state = self.engines[f.name] = new_state(EngineConfig(
                    name=f.name, metrics_url=f.metrics_url, profile=f.profile, source=f.source, log_unit=f.log_unit,
                    log_container=f.log_container, canary_interval=enginekinds.named(f.profile).idle_canary,
                    on_stall="alert", on_gpu_fault="alert", on_unresponsive="alert", target=f.target))
                state.lookalike = not f.installed
                self._watching[f.name] = self._tasks.create_task(self._watch(state))
            skipped = [f for f in found if f.name not in self.engines] if len(self.engines) >= cap else []
            self._say_skipped(skipped, cap)
            if first and not found:
                log.info("no engines configured and none found running (%s)",
                         ", ".join(k.title for k in enginekinds.all_kinds()))
            first = False
            await asyncio.sleep(self.settings.discover_interval)

    def _make_room(self) -> bool:
        """Stop watching one discovered look-alike, for an installed engine; False when none is watched."""
        name = next((n for n, s in self.engines.items() if s.lookalike and n in self._watching), None)
        if name is None:
            return False
        self._watching.pop(name).cancel()
        del self.engines[name]
        # its series go with it (each engine left says its own again at its next scrape)
        self.sink.replace_series(families.ENGINE_UP, {(n,): float(s.sample is not None)
                                                      for n, s in self.engines.items()})
        log.info("no longer watching %s, a server that only looks like an engine: an installed engine needs its place",
                 name)
        return True

    def _say_skipped(self, skipped: list[Found], cap: int) -> None:
        if not skipped:
            self._flooded = False  # the crowd is gone: a new one is news again
            return
        new = [f for f in skipped if f.name not in self._skipped]
        if new:
            self._skipped.update(f.name for f in new)
            names = ", ".join(f"{f.name} ({f.place})" for f in new[:10]) + (f" and {len(new) - 10} more"
                                                                           if len(new) > 10 else "")
            log.warning("discovered more engine servers than [engines] max_discovered (%d) watches; not watching "
                        "%s. Configure the engines to watch ([[engine]]): configured ones are always watched",
                        cap, names)
            if self._flooded:
                return
            self._flooded = True  # one alert for a crowd: look-alikes are cheap to start, none is a page
            self._record(Event("discovery_flood", Severity.WARNING,
                               f"{len(new)} more engine-like servers than [engines] max_discovered ({cap}) watches: "
                               "not watched; configure the engines to watch ([[engine]])", time.time(),
                               evidence={"skipped": [f.name for f in new], "max_discovered": cap}))

    # --- one engine ---------------------------------------------------------------------------------

    async def _watch(self, state: EngineState) -> None:
        interval = state.config.scrape_interval
        tick = time.monotonic()  # the stall detector's clock
        try:
            while True:
                await self._poll(state)
                now = time.monotonic()
                if now >= tick:  # the regular look (an early one, at a stall's threshold, leaves it due)
                    tick += interval
                await asyncio.sleep(max(0.0, next_look(tick, state.lifecycle.detector.due, now) - now))
        finally:
            await state.scraper.close()

    async def _poll(self, state: EngineState) -> None:
        name = state.name
        error = ""
        try:
            sample = await state.scraper.scrape()
        except ScrapeError as exc:
            sample, error = None, redact(str(exc))
            self.sink.count(families.ENGINE_SCRAPE_FAILURES, name, exc.reason)
            if isinstance(exc, LogRefused) and state.log_refused != error:  # said once, again when it changes
                state.log_refused = error
                self._record(Event("log_refused", Severity.WARNING, f"{name}: not reading its log: {error}",
                                   time.time(), engine=name, evidence={"error": error}))
        else:
            state.log_refused = None
        looked = await self.inspect(state)
        spinning = is_spinning(state.cpus)
        life = state.lifecycle
        now = time.monotonic()
        changes = life.observe(lc.Look(now, sample, state.instance if looked else None, spinning,
                                       state.suspected(now)))
        self._export(state, sample)
        self.sink.engines(self.views(), self.samples())  # the hub's situation for the events that follow
        for change in changes:
            await self._on(state, change, error, spinning)
        if sample is None or life.phase != "watching":
            return
        if state.suspect_canary:  # beside the scrapes: a stall meanwhile is still seen within the floor
            state.suspect_canary = False
            spawn = self._tasks.create_task if self._tasks else asyncio.ensure_future
            state.checking = spawn(self._suspect_canary(state, sample))
        else:
            await self._idle_canary(state, sample, time.monotonic())

    async def _on(self, state: EngineState, change: lc.Transition, error: str, spinning: bool) -> None:
        """What a transition of its lifecycle means: an event, a resolution, a log line, a canary."""
        name, endpoint = state.name, _ENDPOINT[state.config.source]
        match change:
            case lc.Judged(verdict):
                self.sink.metric(families.ENGINE_STALLED, 1 if verdict.stalled else 0, name)
                self.sink.metric(families.ENGINE_STALL_THRESHOLD, verdict.threshold, name)
            case lc.Stalled(verdict):
                await self._stalled(state, verdict, spinning)
            case lc.Progressing():
                self.sink.resolve(conditions.stalled(name), f"{name} is making progress again")
            case lc.Silent(failures):
                log.warning("engine %s: cannot read its progress from %s (%d tries, last: %s); watching on",
                            name, endpoint, failures, error)
            case lc.Unresponsive():
                self._record(self._unresponsive_event(state, error, change))
            case lc.Answers(was_unresponsive):
                if was_unresponsive:
                    self.sink.resolve(conditions.unresponsive(name), f"{name} answers {endpoint} again")
                log.info("engine %s: %s answers again", name, endpoint)
            case lc.Exited(exits):
                self._record(Event("engine_exited", Severity.WARNING, f"{name}'s processes are gone", time.time(),
                                   engine=name, evidence={"exits_in_window": exits}))
            case lc.CrashLoop(exits):
                self._record(Event("engine_crash_loop", Severity.CRITICAL, f"{name} exited {exits} times within "
                                   f"{state.config.crash_loop_window:.0f} s", time.time(), engine=name,
                                   evidence={"exits": exits}))
            case lc.Starting(processes):
                log.info("engine %s: a new instance (%d process(es)) is starting: judged by its own figures, back "
                         "once a real completion returns", name, processes)
            case lc.CanaryDue():
                result = await self._canary(state)
                for back in state.lifecycle.canaried(result, time.monotonic()):
                    self._record(self._back_event(state, back))
            case lc.RestartFailed():
                self._record(self._restart_failed_event(state, change))

    async def _stalled(self, state: EngineState, verdict: Verdict, spinning: bool) -> None:
        event = self._stall_event(state, state.sample, verdict, spinning)
        if state.config.source == "log":  # the engine's word alone: a real completion confirms it first
            result = await self._canary(state)
            if result.outcome == "ok":
                log.info("%s: its log shows no progress for %.0f s, but a real completion returned (%s)",
                         state.name, verdict.stalled_for, result.detail)
                state.scraper.reader.nudge()
                return
            event = replace(event, message=f"{event.message}; canary: {result.detail or result.outcome}",
                            evidence={**event.evidence, "canary": asdict(result)})
        self._record(event)

    # --- the canary -----------------------------------------------------------------------------------

    async def _canary(self, state: EngineState) -> CanaryResult:
        """One at a time per engine: the engine's own poll loop awaits it."""
        cfg = state.config
        state.canary_at = time.monotonic()
        if cfg.canary == "off":
            return CanaryResult("off", 0.0, "the canary is off")
        api = api_for(cfg.canary, state.sample.profile.split()[0] if state.sample else cfg.profile)
        result = await canary(base_url(cfg), api, cfg.canary_timeout)
        self.sink.count(families.ENGINE_CANARIES, state.name, result.outcome)
        return result

    async def _suspect_canary(self, state: EngineState, before: EngineSample) -> None:
        """Once per suspicion: a real completion. One that does not return is the engine not answering, unless
        the engine showed work meanwhile (a long prefill holds a canary back, and is no hang)."""
        started = time.monotonic()
        result = await self._canary(state)
        life = state.lifecycle
        if not state.procs or life.phase != "watching" or (life.kills and life.kills[-1] >= started):
            return  # gone or killed meanwhile: nothing left to judge
        if result.outcome != "timeout":
            log.info("%s under suspicion: canary %s (%s)", state.name, result.outcome, result.detail)
            return
        try:
            after = await state.scraper.scrape()
        except ScrapeError:
            after = None
        if after is not None and (after.progress != before.progress or after.activity != before.activity):
            log.info("%s under suspicion: the canary did not return in time, but it works on (%s)", state.name,
                     result.detail)
            return
        state.canary_failed = True
        self._record(self._canary_event(state, before, result))

    async def _idle_canary(self, state: EngineState, sample: EngineSample, now: float) -> None:
        """Every canary_interval while the engine shows no progress (idle, or running without progress), never
        while it progresses: the progress counter moved since the last look. The look after a canary starts
        afresh, since the canary's own request moves the counter."""
        cfg = state.config
        if cfg.canary == "off" or not cfg.canary_interval or now - state.canary_at < cfg.canary_interval:
            return
        first, progressed = state.canary_progress is None, sample.progress != state.canary_progress
        state.canary_progress = sample.progress
        if first or progressed:
            state.canary_at = now
            return
        state.canary_progress = None
        result = await self._canary(state)
        if result.outcome == "timeout" and not state.canary_failed:
            state.canary_failed = True
            self._record(self._canary_event(state, sample, result))
        elif result.outcome == "ok" and state.canary_failed:
            state.canary_failed = False
            self.sink.resolve(conditions.unresponsive(state.name), f"{state.name} completes a request again")

    async def inspect(self, state: EngineState) -> bool:
        """Find the engine's processes, their CPU and GPUs, off the loop and with a deadline; False when the
        look-up did not answer. A kill that comes while the scrape's look-up runs waits for that one (its answer
        is the one it needs), never for nothing."""
        if state.looking is None or state.looking.done():
            state.looking = asyncio.ensure_future(self._look(state))
        return await asyncio.shield(state.looking)

    async def _look(self, state: EngineState) -> bool:
        def look():
            found = resolve(target_spec(state.config))
            procs = state.tracker.refresh(found)
            gpus = frozenset(state.config.gpus) if state.config.gpus else self._gpus_of(procs)
            return (procs, instance_of(procs), found.refused, cpu_percents(procs), gpus,
                    pasids_of([p.pid for p in procs]))
        try:
            state.procs, state.instance, state.refused, state.cpus, gpus, state.pasids = await _INSPECTS.run(
                state.name, _INSPECT_DEADLINE, look)
        except TimeoutError:
            log.warning("looking at %s's processes took longer than %.0f s", state.name, _INSPECT_DEADLINE)
            return False
        except Busy:
            return False  # a look-up that outran its deadline holds its thread (a hung NVML): keep what we know
        state.gpus = frozenset(gpus) if gpus else None
        if state.cpus:
            self.sink.metric(families.ENGINE_CPU, state.cpu / 100, state.name)  # psutil's percent: 100 = a core
        return True

    def _gpus_of(self, procs: list[psutil.Process]) -> set[str] | None:
        """From the device files they hold open, and for NVIDIA from NVML's process lists."""
        found = gpus_in_use(procs) or set()
        if self._nvml is None:
            self._nvml = nvidia.load() or False
        if self._nvml and _NVML_CALL.acquire(blocking=False):
            try:
                by_pid = nvidia.gpus_of_processes(self._nvml)
            finally:
                _NVML_CALL.release()
            found |= {by_pid[p.pid] for p in procs if p.pid in by_pid}
        return found or None

    def _export(self, state: EngineState, sample: EngineSample | None) -> None:
        """Its own figures; while it is down or starting, nothing of the dead instance's (nothing runs, nothing
        is stalled: a gauge of a killed engine must not read as still stalled)."""
        name = state.name
        self.sink.metric(families.ENGINE_UP, 1 if sample else 0, name)
        if state.lifecycle.in_grace:
            self.sink.metric(families.ENGINE_STALLED, 0, name)
            for metric in (families.ENGINE_REQUESTS_RUNNING, families.ENGINE_REQUESTS_WAITING):
                self.sink.metric(metric, 0, name)
        if sample is None:
            return
        for metric, value in ((families.ENGINE_REQUESTS_RUNNING, sample.running),
                              (families.ENGINE_REQUESTS_WAITING, sample.waiting),
                              (families.ENGINE_GENERATED_TOKENS, sample.generated)):
            if value is not None:
                self.sink.metric(metric, value, name)

    def _stall_event(self, state: EngineState, sample: EngineSample, verdict: Verdict, spinning: bool) -> Event:
        message = (f"{state.name}: {sample.running:.0f} request(s) running and no token processed for "
                   f"{verdict.stalled_for:.0f} s (threshold {verdict.threshold:.0f} s)")
        if spinning:
            message += f"; a process spins at {state.cpu:.0f} % CPU: the classic hang"
        suspect = state.suspected(time.monotonic())
        if suspect:
            message += f"; under suspicion since {state.suspicion}"
        figures = {"running": sample.running, "waiting": sample.waiting, "tokens_processed": sample.progress,
                   "generated_tokens": sample.generated, "stalled_seconds": round(verdict.stalled_for, 1),
                   "threshold_seconds": round(verdict.threshold, 1),
                   f"typical_{'token' if verdict.per_step else 'request'}_seconds": verdict.typical,
                   "cpu_percent": state.cpu}
        source = state.config.source
        if source == "log":
            message += f" (read from {state.scraper.where})"
        return Event("engine_stall", Severity.CRITICAL, message, time.time(), engine=state.name,
                     gpu=state.gpu, evidence={"figures": figures, "spinning": spinning, "source": source,
                                              **({"suspicion": state.suspicion} if suspect else {})})

    def _canary_event(self, state: EngineState, sample: EngineSample, result: CanaryResult) -> Event:
        message = (f"{state.name}: {result.detail} (a one-token canary) while its {len(state.procs)} process(es) "
                   f"live" + (f"; a process spins at {state.cpu:.0f} % CPU" if is_spinning(state.cpus) else ""))
        figures = {"canary_seconds": round(result.seconds, 1), "running": sample.running, "cpu_percent": state.cpu,
                   "processes": len(state.procs)}
        return Event("engine_unresponsive", Severity.CRITICAL, message, time.time(), engine=state.name,
                     gpu=state.gpu, evidence={"canary": asdict(result), "figures": figures,
                                                      "requests_running": sample.running or 0})

    def _unresponsive_event(self, state: EngineState, error: str, change: lc.Unresponsive) -> Event:
        """/metrics hangs or fails while the engine's processes live. Whether requests were running when this
        instance last answered decides whether this is as stuck as a stall (the policy kills) or an idle engine
        (alert)."""
        last = change.last
        running = last.running if last else None
        was = (f"{running:.0f} request(s) were running when it last answered" if running
               else "no request was running when it last answered" if last else "it has never answered")
        endpoint = _ENDPOINT[state.config.source]
        message = (f"{state.name} has not answered {endpoint} for {change.silent_for:.0f} s ({change.failures} "
                   f"tries, last: {error}) while its {len(state.procs)} process(es) live; {was}")
        figures = {"failures": change.failures, "silent_seconds": round(change.silent_for, 1), "running": running,
                   "cpu_percent": state.cpu, "processes": len(state.procs)}
        return Event("engine_unresponsive", Severity.CRITICAL if running else Severity.WARNING, message, time.time(),
                     engine=state.name, gpu=state.gpu,
                     evidence={"error": error, "figures": figures, "requests_running": running or 0})

    def _back_event(self, state: EngineState, back: lc.Back) -> Event:
        name, result = state.name, back.canary
        when = (f"{back.since_kill:.0f} s after the kill" if back.since_kill is not None
                else f"{back.since_start:.0f} s after it started again")
        proof = "first completion" if result.outcome == "ok" else "answers again (the canary is off)"
        return Event("engine_back", Severity.INFO, f"{name} back: {proof} {when}" +
                     (f" ({result.detail})" if result.detail else ""), time.time(), engine=name, gpu=state.gpu,
                     evidence={"seconds_since_kill": None if back.since_kill is None else round(back.since_kill, 1),
                               "seconds_since_start": round(back.since_start, 1), "canary": asdict(result)})

    def _restart_failed_event(self, state: EngineState, failed: lc.RestartFailed) -> Event:
        cfg = state.config
        who = "gpuwarden restarted it" if failed.by_us else "its supervisor started it again"
        how = ("its processes started but it never completed a request" if failed.started
               else "no process of it started")
        tail = "; gpuwarden will not restart it again" if failed.by_us else ""
        return Event("engine_restart_failed", Severity.CRITICAL, f"{state.name} is not back {failed.waited:.0f} s "
                     f"after {who} (restart_timeout {cfg.restart_timeout:.0f} s): {how}{tail}", time.time(),
                     engine=state.name, gpu=state.gpu,
                     evidence={"waited_seconds": round(failed.waited, 1), "by_gpuwarden": failed.by_us,
                               "started": failed.started, "processes": len(state.procs)})

    def _record(self, event: Event) -> None:
        """A discovered server that only looks like an engine (anyone can start one) is never a page."""
        state = self.engines.get(event.engine or "")
        if state is not None and state.lookalike:
            event = replace(event, severity=min(event.severity, Severity.WARNING),
                            message=f"{event.message} (a discovered server not installed as an engine)",
                            evidence={**event.evidence, "lookalike": True})
        self.sink.record([event])


def instance_of(procs: list[psutil.Process]) -> lc.Instance:
    """Its processes by pid and start time: a new pid, or the same pid started anew, is a new instance."""
    keys = set()
    for proc in procs:
        try:
            keys.add((proc.pid, proc.create_time()))
        except psutil.Error:
            continue
    return frozenset(keys)


def is_spinning(cpus: list[float]) -> bool:
    """A process of the engine runs near a full core with no progress: the seed incident's hang (both processes
    at 200 % and no throughput; a hung GPU's waiter spins). A stopped or frozen engine does not spin."""
    return bool(cpus) and max(cpus) >= SPINNING_PERCENT

