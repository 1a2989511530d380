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

from gpuwarden import families
from gpuwarden.config import SCHEME_PORTS, EngineConfig, EnginesConfig, user_id
from gpuwarden.engine.canary import CanaryResult, api_for, canary
from gpuwarden.engine.discovery import Found, discover, probe_order, with_source
from gpuwarden.engine.logprofiles import LOG_BY_NAME, LOG_PROFILES
from gpuwarden.engine.logs import LogScraper
from gpuwarden.engine.metrics import EngineSample
from gpuwarden.engine.processes import TargetSpec, Tracker, cpu_percents, gpus_in_use, resolve
from gpuwarden.engine.scraper import ScrapeError, Scraper
from gpuwarden.engine.slots import SlotsScraper
from gpuwarden.engine.stall import StallDetector, Verdict
from gpuwarden.gpu import nvidia
from gpuwarden.logsetup import redact
from gpuwarden.model import Event, Severity, Sink
from gpuwarden.offloop import Busy, OffLoop
from gpuwarden.policy import EngineView, exited

log = logging.getLogger(__name__)

SPINNING_PERCENT = 75.0  # near a full core (a loaded box gives a spinning process less than one)
_INSPECT_DEADLINE = 10.0
_INSPECTS = OffLoop("process look-up", limit=64)  # one per engine: a hung NVML holds one thread each, no more
_NVML_CALL = threading.Lock()  # and at most one of them waits inside NVML; the others skip it


_ENDPOINT = {"slots": "/slots", "log": "its log", "metrics": "/metrics"}  # where a source reads progress


@dataclass
class EngineState:
    config: EngineConfig
    scraper: Scraper | LogScraper | SlotsScraper
    detector: StallDetector
    tracker: Tracker = field(default_factory=Tracker)
    procs: list[psutil.Process] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # candidates the target named but may not be killed
    looking: asyncio.Future | None = None  # the look-up of the engine's processes under way
    gpus: frozenset[str] | None = None
    cpus: list[float] = field(default_factory=list)  # each process's share of a core since the last look
    failures: int = 0
    answered: float | None = None  # monotonic time of the last successful scrape
    watched_since: float | None = None  # monotonic time of the first scrape
    unresponsive: bool = False
    exits: tuple[float, ...] = ()  # monotonic times of its exits within the crash-loop window
    kills: list[float] = field(default_factory=list)  # monotonic times of its real kills within the budget window
    killing: bool = False  # the actuator is killing it now
    sample: EngineSample | None = None
    canary_at: float = -1e9  # monotonic time of the last canary
    canary_progress: float | None = None  # the progress counter then: moved since means busy and progressing
    canary_failed: bool = False

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

    def view(self) -> EngineView:
        cfg = self.config
        return EngineView(self.name, self.gpus, cfg.on_stall, cfg.on_gpu_fault, cfg.on_unresponsive, cfg.dry_run,
                          cfg.kill_budget, cfg.kill_budget_window, tuple(self.kills),
                          pids=frozenset(p.pid for p in self.procs))


def target_spec(config: EngineConfig) -> TargetSpec:
    t, url = config.target, urlsplit(config.metrics_url)
    return TargetSpec(t.kind, port=url.port or SCHEME_PORTS[url.scheme], host=url.hostname, pidfile=t.pidfile,
                      pattern=t.pattern, unit=t.unit, cgroup=t.cgroup, container=t.container,
                      docker_socket=t.docker_socket, uid=user_id(t.user) if t.user else None)


def base_url(config: EngineConfig) -> str:
    """The engine's API: `url`, else metrics_url's scheme, host and port."""
    if config.url:
        return config.url.rstrip("/")
    parts = urlsplit(config.metrics_url)
    return f"{parts.scheme}://{parts.netloc}"


def source_of(config: EngineConfig) -> Scraper | LogScraper | SlotsScraper:
    if config.source == "log":
        return LogScraper.of(config.log_file, config.log_unit, config.profile, config.log_container,
                             config.target.docker_socket)
    if config.source == "slots":
        return SlotsScraper(base_url(config), config.scrape_timeout, config.max_body_bytes)
    return Scraper(config.metrics_url, config.profile, config.scrape_timeout, config.max_body_bytes)


def stall_floor(config: EngineConfig) -> float:
    """A log says progress only every so often (vLLM: every 10 s): a stall is at least two such intervals."""
    if config.source != "log":
        return config.min_stall
    profiles = [LOG_BY_NAME[config.profile]] if config.profile in LOG_BY_NAME else LOG_PROFILES
    return max(config.min_stall, *(2 * p.interval for p in profiles))


def new_state(config: EngineConfig) -> EngineState:
    return EngineState(
        config, source_of(config), StallDetector(config.stall_multiple, stall_floor(config), config.max_stall),
        gpus=frozenset(config.gpus) if config.gpus else None)


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

    def reconfigured(self, settings: EnginesConfig, engines: list[EngineConfig], nvml: bool = True) -> EngineWatch:
        """A watch for a new configuration that keeps the kill budgets and process trackers of engines that
        stay (a reload must not reset how often an engine may be killed)."""
        new = EngineWatch(settings, engines, self.sink, nvml)
        for name, state in new.engines.items():
            if name in self.engines:
                state.kills, state.tracker = self.engines[name].kills, self.engines[name].tracker
        return new

    def samples(self) -> dict[str, dict]:
        """Each engine's last scrape (for incident reports); None where none succeeded yet."""
        return {name: asdict(s.sample) if s.sample else None for name, s in self.engines.items()}

    def views(self) -> list[EngineView]:
        return [s.view() for s in self.engines.values()]

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            self._tasks = tasks
            for state in self.engines.values():
                tasks.create_task(self._watch(state))
            if not self.engines and self.settings.discover:
                tasks.create_task(self._discover())

    async def _discover(self) -> None:
        first = True
        while True:
            found = await asyncio.to_thread(discover)
            # Anyone can start servers that look like engines: root watches (and probes) a bounded number.
            cap = self.settings.max_discovered
            for f in probe_order([f for f in found if f.name not in self.engines], self._probed)[:cap]:
                if len(self.engines) >= cap:
                    break
                self._probed[f.name] = time.monotonic()
                f = await asyncio.to_thread(with_source, f)
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
                    log_container=f.log_container, canary_interval=60.0 if f.profile == "ollama" else 0.0,
                    on_stall="alert", on_gpu_fault="alert", on_unresponsive="alert", target=f.target))
                self._tasks.create_task(self._watch(state))
            if len(self.engines) >= cap:
                self._say_skipped([f for f in found if f.name not in self.engines], cap)
            if first and not found:
                log.info("no engines configured and none found running (vLLM, SGLang, llama.cpp, TGI, Ollama)")
            first = False
            await asyncio.sleep(self.settings.discover_interval)

    def _say_skipped(self, skipped: list[Found], cap: int) -> None:
        new = [f for f in skipped if f.name not in self._skipped]
        if new:
            self._skipped.update(f.name for f in new)
            names = ", ".join(f"{f.name} ({f.place})" for f in new[:10]) + (f" and {len(new) - 10} more"
                                                                           if len(new) > 10 else "")
            log.warning("discovered more engine servers than [engines] max_discovered (%d) watches; not watching "
                        "%s. Configure the engines to watch ([[engine]]): configured ones are always watched",
                        cap, names)

    # --- one engine ---------------------------------------------------------------------------------

    async def _watch(self, state: EngineState) -> None:
        loop = asyncio.get_running_loop()
        interval = state.config.scrape_interval
        tick = loop.time()
        try:
            while True:
                await self._poll(state)
                tick += interval
                await asyncio.sleep(max(0.0, tick - loop.time()))
        finally:
            await state.scraper.close()

    async def _poll(self, state: EngineState) -> None:
        name = state.name
        state.watched_since = state.watched_since or time.monotonic()
        try:
            sample = await state.scraper.scrape()
        except ScrapeError as exc:
            sample = None
            state.failures += 1
            self.sink.count(families.ENGINE_SCRAPE_FAILURES, name, exc.reason)
            error = str(exc)
        had_procs = bool(state.procs)
        await self.inspect(state)
        now = time.monotonic()
        if had_procs and not state.procs:
            self._exited(state, now)
        spinning = is_spinning(state.cpus)
        endpoint = _ENDPOINT[state.config.source]
        if sample is None:
            self.sink.metric(families.ENGINE_UP, 0, name)
            if state.failures == state.config.unresponsive_after:  # once per outage; nothing else may say it
                log.warning("engine %s: cannot read its progress from %s (%d tries, last: %s); watching on",
                            name, endpoint, state.failures, redact(error))
            silent_for = now - (state.answered or state.watched_since)  # an engine hung before we came counts
            if (state.failures >= state.config.unresponsive_after and state.procs and not state.unresponsive
                    and silent_for >= state.detector.threshold(spinning)):
                state.unresponsive = True
                self._record(self._unresponsive_event(state, redact(error), silent_for))
            return
        if state.unresponsive:
            self.sink.resolve(f"engine_unresponsive:{name}", f"{name} answers /metrics again")
        if state.failures >= state.config.unresponsive_after:
            log.info("engine %s: %s answers again", name, endpoint)
        state.failures, state.unresponsive, state.sample, state.answered = 0, False, sample, now
        self._export(state, sample)
        verdict = state.detector.observe(sample, now, spinning)
        self.sink.metric(families.ENGINE_STALLED, 1 if verdict.stalled else 0, name)
        self.sink.metric(families.ENGINE_STALL_THRESHOLD, verdict.threshold, name)
        if verdict.new and verdict.stalled:
            event = self._stall_event(state, sample, verdict, spinning)
            if state.config.source == "log":  # the engine's word alone: a real completion confirms it first
                result = await self._canary(state)
                if result.outcome == "ok":
                    log.info("%s: its log shows no progress for %.0f s, but a real completion returned (%s)", name,
                             verdict.stalled_for, result.detail)
                    state.scraper.reader.nudge()
                    return
                event = replace(event, message=f"{event.message}; canary: {result.detail or result.outcome}",
                                evidence={**event.evidence, "canary": asdict(result)})
            self._record(event)
        elif verdict.new:
            self.sink.resolve(f"engine_stall:{name}", f"{name} is making progress again")
        await self._idle_canary(state, sample, now)

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
            self.sink.resolve(f"engine_unresponsive:{state.name}", f"{state.name} completes a request again")

    async def inspect(self, state: EngineState) -> None:
        """Find the engine's processes, their CPU and GPUs, off the loop and with a deadline. A kill that comes
        while the scrape's look-up runs waits for that one (its answer is the one it needs), never for nothing."""
        if state.looking is None or state.looking.done():
            state.looking = asyncio.ensure_future(self._look(state))
        await asyncio.shield(state.looking)

    async def _look(self, state: EngineState) -> None:
        def look():
            found = resolve(target_spec(state.config))
            procs = state.tracker.refresh(found)
            gpus = frozenset(state.config.gpus) if state.config.gpus else self._gpus_of(procs)
            return procs, found.refused, cpu_percents(procs), gpus
        try:
            state.procs, state.refused, state.cpus, gpus = await _INSPECTS.run(state.name, _INSPECT_DEADLINE, look)
        except TimeoutError:
            log.warning("looking at %s's processes took longer than %.0f s", state.name, _INSPECT_DEADLINE)
            return
        except Busy:
            return  # a look-up that outran its deadline still holds its thread (a hung NVML): keep what we know
        state.gpus = frozenset(gpus) if gpus else None
        if state.cpus:
            self.sink.metric(families.ENGINE_CPU, state.cpu / 100, state.name)  # psutil's percent: 100 = a core

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

    def _export(self, state: EngineState, sample: EngineSample) -> None:
        name = state.name
        self.sink.metric(families.ENGINE_UP, 1, name)
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
        figures = {"running": sample.running, "waiting": sample.waiting, "tokens_processed": sample.progress,
                   "generated_tokens": sample.generated, "stalled_seconds": round(verdict.stalled_for, 1),
                   "threshold_seconds": round(verdict.threshold, 1),
                   f"typical_{'token' if verdict.per_step else 'request'}_seconds": verdict.typical,
                   "cpu_percent": state.cpu}
        source = state.config.source
        if source == "log":
            message += f" (read from {state.scraper.where})"
        return Event("engine_stall", Severity.CRITICAL, message, time.time(), engine=state.name,
                     gpu=state.gpu, evidence={"figures": figures, "spinning": spinning,
                                                      "source": source})

    def _canary_event(self, state: EngineState, sample: EngineSample, result: CanaryResult) -> Event:
        message = (f"{state.name}: {result.detail} (a one-token canary) while its {len(state.procs)} process(es) "
                   f"live" + (f"; a process spins at {state.cpu:.0f} % CPU" if is_spinning(state.cpus) else ""))
        figures = {"canary_seconds": round(result.seconds, 1), "running": sample.running, "cpu_percent": state.cpu,
                   "processes": len(state.procs)}
        return Event("engine_unresponsive", Severity.CRITICAL, message, time.time(), engine=state.name,
                     gpu=state.gpu, evidence={"canary": asdict(result), "figures": figures,
                                                      "requests_running": sample.running or 0})

    def _unresponsive_event(self, state: EngineState, error: str, silent_for: float) -> Event:
        """/metrics hangs or fails while the engine's processes live. Whether requests were running when it last
        answered decides whether this is as stuck as a stall (the policy kills) or an idle engine (alert)."""
        last = state.sample
        running = last.running if last else None
        was = (f"{running:.0f} request(s) were running when it last answered" if running
               else "no request was running when it last answered" if last else "it has never answered")
        endpoint = _ENDPOINT[state.config.source]
        message = (f"{state.name} has not answered {endpoint} for {silent_for:.0f} s ({state.failures} tries, "
                   f"last: {error}) while its {len(state.procs)} process(es) live; {was}")
        figures = {"failures": state.failures, "silent_seconds": round(silent_for, 1), "running": running,
                   "cpu_percent": state.cpu, "processes": len(state.procs)}
        return Event("engine_unresponsive", Severity.CRITICAL if running else Severity.WARNING, message, time.time(),
                     engine=state.name, gpu=state.gpu,
                     evidence={"error": error, "figures": figures, "requests_running": running or 0})

    def _exited(self, state: EngineState, now: float) -> None:
        cfg = state.config
        exits = exited(state.exits, now, state.kills[-1] if state.kills else None, cfg.kill_grace,
                       cfg.crash_loop_window)
        if exits is None:
            return  # we killed it: not news
        state.exits = exits
        self._record(Event("engine_exited", Severity.WARNING, f"{state.name}'s processes are gone", time.time(),
                           engine=state.name, evidence={"exits_in_window": len(exits)}))
        if len(exits) >= cfg.crash_loop_exits:
            self._record(Event("engine_crash_loop", Severity.CRITICAL,
                               f"{state.name} exited {len(exits)} times within {cfg.crash_loop_window:.0f} s",
                               time.time(), engine=state.name, evidence={"exits": len(exits)}))
            state.exits = ()

    def _record(self, event: Event) -> None:
        self.sink.record([event])


def is_spinning(cpus: list[float]) -> bool:
    """A process of the engine runs near a full core with no progress: the seed incident's hang (both processes
    at 200 % and no throughput; a hung GPU's waiter spins). A stopped or frozen engine does not spin."""
    return bool(cpus) and max(cpus) >= SPINNING_PERCENT

