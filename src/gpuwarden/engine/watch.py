"""The engines component, thin I/O: scrape each engine, look at its processes, feed its lifecycle
(engine/lifecycle.py, pure: it decides stalls, unresponsiveness, exits, crash loops, start-up, back, every
canary), run the canaries it asks for and report what it returns. It never kills: the policy decides and the
actuator kills. A stall (or an engine that does not answer) is reported with the kill's target judged on the
look that found it (engine/targets.py, in the engine's view): the actuator kills that and asks nothing back, and
the lifecycle learns the kill from its outcome (`learn`, the hub's down-call). A fault's kill, whose report holds
no look of the engine, goes through a narrow port (`take`: a fresh look, judged, the lifecycle told before the
signals); `restart_failed`, `suspect`: what else the lifecycle learns. Discovery (engine/finder.py) is a
component of its own that hands it the engines it found."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import ClassVar
from urllib.parse import urlsplit

import psutil

from gpuwarden.config.schema import Secret
from gpuwarden.config.settings import EngineConfig, EnginesConfig, api_key, user_id
from gpuwarden.core import conditions, families
from gpuwarden.core.counts import plural
from gpuwarden.core.model import CROWD, Event, Severity, Sink
from gpuwarden.core.policy import EngineView, budget_spent
from gpuwarden.engine import lifecycle as lc
from gpuwarden.engine import looks, status, targets
from gpuwarden.engine.answering import Answering, Said, where
from gpuwarden.engine.canary import CanaryResult, Client, api_for, canary, key_in
from gpuwarden.engine.finder import Discovery
from gpuwarden.engine.logs import LogRefused
from gpuwarden.engine.looks import Looker
from gpuwarden.engine.metrics import EngineSample
from gpuwarden.engine.parts import Source, base_url, lifecycle_of, source_of, target_spec
from gpuwarden.engine.processes import TargetSpec, Tracker, serving_listeners
from gpuwarden.engine.saturation import Saturation, saturation
from gpuwarden.engine.scraper import ScrapeError
from gpuwarden.engine.stall import next_look
from gpuwarden.engine.targets import KillTarget, Refused
from gpuwarden.runtime.logsetup import redact
from gpuwarden.runtime.offloop import Busy, OffLoop
from gpuwarden.runtime.sockets import pinned
from gpuwarden.runtime.ticks import next_regular, phase_tick, spread

log = logging.getLogger(__name__)

SPINNING_PERCENT = 75.0  # near a full core (a loaded box gives a spinning process less than one)

_ENDPOINT = {"slots": "/slots", "log": "its log", "metrics": "/metrics"}  # where a source reads progress
# what a stall's lifecycle awaits after its report (a kill_not_done that is tried again is none yet)
_KILL_OUTCOMES = frozenset({"engine_killed", "kill_refused", "kill_not_done"})
_KILL_ASKERS = frozenset({"engine_stall", "engine_unresponsive"})  # reported with the kill's target
_LEARNT = _KILL_OUTCOMES | _KILL_ASKERS
_NEW = object()  # a socket on the engine's address that no look has judged yet
LOOK_FIRST = 0.1  # seconds a poll's scrape waits for its look to be done
LOOK_WAIT = 1.0  # seconds a poll waits for its look once the reading is in


@dataclass(eq=False, repr=False)
class EngineState:
    """What the engine watch holds of one engine between looks."""

    config: EngineConfig
    scraper: Source
    lifecycle: lc.Lifecycle
    tracker: Tracker = field(default_factory=Tracker)
    procs: list[psutil.Process] = field(default_factory=list)
    instance: lc.Instance = frozenset()  # its processes' (pid, start time) at the last look
    refused: list[str] = field(default_factory=list)  # candidates the target named but may not be killed
    looking: asyncio.Future | None = None  # the look-up of the engine's processes under way
    looking_wide: bool = False  # and whether it is a kill's (Looker.look's `wide`)
    gpus: frozenset[str] | None = None
    cpus: dict[int, float] = field(default_factory=dict)  # each process's share of a core since the last look
    busiest: str | None = None  # the process with the largest share (Processes.busiest)
    seen_at: float = -1e18  # when its processes were last looked at (monotonic)
    pasids: frozenset[int] | None = None  # its processes' KFD pasids (AMD); None: none to read
    log_refused: str | None = None  # why its log file was last refused (said once)
    saturated: Saturation | None = None  # it cannot accept, while it idles (engine_saturated said once)
    lookalike: bool = False  # discovered, and not an installed engine's program: its events are never pages
    answering: Answering | None = None  # whether it answers at all (engine_not_answering)
    crowd: str | None = None  # discovered: its user's servers page together (model.CROWD)
    sockets: frozenset[int] = frozenset()  # inodes of the sockets on its address a look proved its own
    taken: str | None = None  # who holds its address, when a look found it is not the engine (said once)
    taken_sockets: frozenset[int] = frozenset()  # the inodes that holder's sockets had
    taken_said: str | None = None  # the holder engine_port_taken named last
    stalled: bool = False  # its last reading said stalled (until one says not, or its processes are gone)
    unanswering: bool = False  # it did not answer while its processes lived, and has not answered since

    @functools.cached_property
    def spec(self) -> TargetSpec:
        """Its target as configured (its user looked up once, not on the loop at each look)."""
        return target_spec(self.config)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def cpu(self) -> float | None:
        return max(self.cpus.values()) if self.cpus else None

    def spinner(self) -> str:
        """Which process spins: `pid 4242 (VLLM::Worker) spins at 100 % CPU`."""
        return f"{self.busiest or 'a process'} spins at {self.cpu or 0:.0f} % CPU"

    @property
    def gpu(self) -> str | None:
        """Its GPU when it uses exactly one."""
        return next(iter(self.gpus)) if self.gpus and len(self.gpus) == 1 else None

    @property
    def sample(self) -> EngineSample | None:
        return self.lifecycle.sample

    def last_scrape(self) -> dict | None:
        """Its last scrape as a record (for incident reports); None where none succeeded yet. Field by field:
        its values are numbers, strings and tuples of them (asdict's deep copy was 64 µs of every poll)."""
        sample = self.sample
        return {f.name: getattr(sample, f.name) for f in fields(sample)} if sample else None

    def view(self, target: KillTarget | Refused | None = None) -> EngineView:
        """`target`: with a stall or silence it reports, the kill's target judged on the same look."""
        cfg, life = self.config, self.lifecycle
        return EngineView(self.name, self.gpus, cfg.on_stall, cfg.on_gpu_fault, cfg.on_unresponsive, cfg.dry_run,
                          cfg.kill_budget, cfg.kill_budget_window, life.kills,
                          pids=frozenset(p.pid for p in self.procs), restart_failed=life.restart_refused,
                          pasids=self.pasids, suspect=life.suspected(time.monotonic()), target=target)

    def target(self, late: str = "") -> KillTarget | Refused:
        """What a kill would take on its last good look, judged (engine/targets.py: its own processes, not too
        many); `late`: why that look is not the one just asked for."""
        return targets.judged(KillTarget(list(self.procs), list(self.refused), self.gpu, self.config, late))

    @property
    def stuck(self) -> bool:
        return self.stalled or self.unanswering


def new_state(config: EngineConfig) -> EngineState:
    tracker = Tracker()
    configured = user_id(config.target.user) if config.target.user else None
    return EngineState(config, source_of(config, lambda: configured if configured is not None else tracker.uid),
                       lifecycle_of(config), tracker=tracker, gpus=frozenset(config.gpus) if config.gpus else None,
                       answering=Answering(config.restart_timeout, None))


class EngineWatch:
    name = "engines"

    def __init__(self, settings: EnginesConfig, engines: list[EngineConfig], sink: Sink, nvml: bool = True) -> None:
        self.settings, self.sink = settings, sink
        self.engines: dict[str, EngineState] = {e.name: new_state(e) for e in engines}
        self._tasks: asyncio.TaskGroup | None = None
        self._looker = Looker(nvml)
        self._watching: dict[str, asyncio.Task] = {}  # each discovered engine's watch
        self._started = 0  # engine watches started: each gets its own phase of the scrape interval (_watch)

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
        return {name: s.last_scrape() for name, s in self.engines.items()}

    def views(self) -> list[EngineView]:
        return [s.view() for s in self.engines.values()]

    def state(self) -> dict:
        """Its state for the registry (core/registry.py): one row per engine (engine/status.py)."""
        return {"engines": status.rows(self.engines.values(), time.time())}

    # --- the actuator's port: a fault's kill, then what the lifecycle learns ---------------------------

    async def take(self, name: str, restart: bool, dry_run: bool) -> KillTarget | Refused | None:
        """A kill of it is asked for with no target (a fault's: its report holds no look of the engine): a fresh
        look at its processes, judged (engine/targets.py); a target it may kill is handed over, and unless this
        is a dry run its lifecycle learns now, before any signal, that its processes going is our doing (else it
        would report an exit). A refused target, or none found, leaves the lifecycle as it was. None: an engine
        this watch does not have."""
        state = self.engines.get(name)
        if state is None:
            return None
        looked = await self.inspect(state, wide=True)
        judged = state.target("" if looked else self._late(state))
        if isinstance(judged, KillTarget) and judged.procs and not dry_run:
            state.lifecycle.killing(time.monotonic(), restart)
        return judged

    # --- the hub's down-call: an action's outcome -------------------------------------------------------

    def learn(self, event: Event) -> None:
        """An event of this engine the hub did nothing about. A kill's outcome (engine_killed, kill_refused) is
        what a stall's lifecycle awaited since its report (a real kill is ours; a refusal or a dry run leaves an
        exit held meanwhile an exit); its own stall or silence decided without a kill says at once that no outcome
        will come. Any other teaches it nothing."""
        state = self.engines.get(event.engine or "")
        if state is None or event.kind not in _LEARNT or event.evidence.get("retrying"):
            return
        killed = event.kind == "engine_killed" and not event.evidence.get("dry_run")
        for change in state.lifecycle.learned(killed, bool(event.evidence.get("restart")), time.monotonic()):
            self._record(self._exit_event(state, change))  # on the hub's turn: said now, awaiting nothing

    def restart_failed(self, name: str) -> bool:
        """Asking its supervisor failed for good; False when its lifecycle had said the restart failed already
        (its own deadline, seen at a look just before): said once."""
        if (state := self.engines.get(name)) is None or state.lifecycle.phase == "failed":
            return False
        state.lifecycle.restart_failed()
        return True

    def kill_wanted(self, name: str, stuck: bool) -> str | None:
        """Why a kill decided for it and not done yet is no longer to be tried again (None: it is): no longer
        watched, its kill budget spent meanwhile, or (`stuck`: a kill for a stall or silence) it works again or its
        processes are gone."""
        state = self.engines.get(name)
        if state is None:
            return "it is no longer watched"
        cfg = state.config
        if budget_spent(state.view(), time.monotonic()):
            return f"its kill budget is spent ({plural(cfg.kill_budget, 'kill')} within {cfg.kill_budget_window:.0f} s)"
        if stuck and not state.stuck:
            return "it is no longer stalled or unanswering"
        return None

    def _late(self, state: EngineState) -> str:
        seen = (f"its last good look, {time.monotonic() - state.seen_at:.0f} s old"
                if state.seen_at > 0 else "no earlier look: it was never seen")
        return f"the look at its processes missed its {looks.DEADLINE:.0f} s deadline ({seen})"

    def resume(self, state: conditions.State, now: float, kills: Iterable[tuple[str, float]] = ()) -> None:
        """At a start (and after a reload, whose lifecycles start afresh): the engines left down (their open
        engine_down conditions) are down until back, so that their return is an engine_back that ends the
        incident, not a silent new instance; those left stalled or unresponsive end when it sees them progress
        (or gone), as a live one does, and their page hears it. `kills`: (engine, wall-clock time) of the real
        kills the last gpuwarden made (a start; a reload keeps its budgets), so that a daemon restarted in a
        loop beside a flapping engine does not kill it without bound."""
        to_monotonic = time.monotonic() - now  # the condition's time is wall-clock, the lifecycle's monotonic
        for name, at in kills:
            if engine := self.engines.get(name):
                engine.lifecycle.killed_before(at + to_monotonic)
        for key, down in state.items():
            if key.kind == conditions.Kind.ENGINE_DOWN and (engine := self.engines.get(key.subject)):
                engine.lifecycle.resumed(down.since + to_monotonic, "engine_killed" in down.causes,
                                         conditions.restarting(key.subject) in state,
                                         "engine_restart_failed" in down.causes)
        for name, engine in self.engines.items():  # stuck ones end, or stay, on what its lifecycle sees
            engine.lifecycle.resumed_stuck(conditions.stalled(name) in state, conditions.unresponsive(name) in state)

    def suspect(self, name: str, reason: str, fault: Event) -> Event | None:
        """The policy's `Suspect`, learnt by the engine's lifecycle: its stall threshold at the floor, a canary at
        the next look, for its rules' `suspicion` seconds. Returns the engine_suspect event to record; None for an
        engine this watch does not have, or one already under suspicion (a storm of faults extends it and says
        nothing more)."""
        state = self.engines.get(name)
        if state is None or not state.lifecycle.suspect(time.monotonic(), reason):
            return None
        floor = state.lifecycle.detector.floor
        evidence = {"reason": reason, "fault": {"kind": fault.kind, "gpu": fault.gpu, "message": fault.message},
                    "seconds": state.lifecycle.rules.suspicion, "floor_seconds": floor}
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

    # --- discovery's port: the engines it found -----------------------------------------------------------

    def adopt(self, config: EngineConfig, lookalike: bool, crowd: str | None = None) -> None:
        state = self.engines[config.name] = new_state(config)
        state.lookalike, state.crowd = lookalike, crowd
        self._watching[config.name] = self._tasks.create_task(self._watch(state))

    def drop(self, name: str) -> None:
        self._watching.pop(name).cancel()
        del self.engines[name]
        self.sink.engines(self.views(), self.samples(), whole=True)  # the hub forgets it too
        # its series go with it (each engine left says its own again at its next scrape)
        self.sink.replace_series(families.ENGINE_UP, {(n,): float(s.sample is not None)
                                                      for n, s in self.engines.items()})

    async def run(self) -> None:
        self.sink.engines(self.views(), self.samples(), whole=True)
        async with asyncio.TaskGroup() as tasks:
            self._tasks = tasks
            for state in self.engines.values():
                tasks.create_task(self._watch(state))
            if not self.engines and self.settings.discover:
                tasks.create_task(Discovery(self.settings, self, self.sink).run())

    # --- one engine ---------------------------------------------------------------------------------

    async def _watch(self, state: EngineState) -> None:
        interval = state.config.scrape_interval
        # The regular looks of each engine at a phase of its own, spread over the interval: engines started
        # together looked together, 32 looks at once in 32 threads every 5 s, and the loop waited up to 127 ms for
        # its turn at the GIL (a look took 19-33 ms then). On the one-second grid (runtime/ticks.py), the looks
        # due together are a fifth of them at 5 s, and they wake the loop with the GPU round and the lag probe: at
        # phases of their own, 32 engines woke it 6.4 times a second. The first look comes at once all the same.
        phase = spread(self._started, interval)
        self._started += 1
        # the stall detector's clock; the first regular look half an interval after the first at least
        tick = phase_tick(time.monotonic() + interval / 2, interval, phase)
        if state.config.source != "log":  # each look proves its address first; a reconnect within a scrape too
            state.scraper.reconnect_only_if(lambda: self._not_its_socket(state) is None)
        try:
            while True:
                looked = await self._poll(state)
                now = time.monotonic()
                if now >= tick:  # the regular look (an early one, at a stall's threshold, leaves it due)
                    tick = next_regular(tick, now, interval, phase)  # on the grid: a sum would drift off it
                await asyncio.sleep(max(0.0, next_look(tick, state.lifecycle.detector.due, looked, now) - now))
        finally:
            await state.scraper.close()

    async def _poll(self, state: EngineState) -> float:
        """One look: look at the processes, then scrape, feed the lifecycle, carry out what it returns. The scrape
        waits for the look up to LOOK_FIRST: side by side, the look's thread and the loop handed the GIL back and
        forth at each of the look's hundred-odd system calls (64 futex calls a scrape with 32 engines), where a look
        alone takes about a millisecond; a late look (a hung NVML, a loaded box) holds the scrape back no longer.
        The engine's address is asked only when the socket that serves it is the engine's (`_not_its_socket`: a
        socket no earlier look judged waits for this look). The look is dated when the scrape answered (what it
        shows was so by then): dated once the process look was done too, each stall's clock started that much late
        and its kill came that much later. Returns the look's date."""
        looking = asyncio.ensure_future(self.inspect(state))
        await asyncio.wait({looking}, timeout=LOOK_FIRST)
        asks = state.config.source != "log"  # a log is the engine's own: only its address can be someone else's
        why = self._not_its_socket(state) if asks else None
        if why is _NEW:  # a socket no look has judged yet: this look proves it the engine's, or names its holder
            why = self._not_its_socket(state) if await looking else _NEW
        if why is _NEW:  # no look proved it (late, or it changed meanwhile): its owner's word
            why = self._by_owner(state)
        if why is None:
            sample, error, answered = await self._scrape(state)
        else:  # no request to it: nothing read, no credential sent
            sample, error, answered = None, why, time.monotonic()
        # a look still under way this long after the reading is late: the reading is judged now, on what is known
        # of its processes (a stall is not seen a look's deadline late); the look goes on and counts when done
        await asyncio.wait({looking}, timeout=LOOK_WAIT)
        if looking.done():
            looked = await looking
        else:
            looked = False
            looking.add_done_callback(_retrieved)
        if asks and state.taken and sample is not None:  # the look, done meanwhile, found it is not the engine
            sample, error = None, self._taken_error(state)
        self._say_taken(state)
        if asks and state.taken and state.instance:
            # its own processes live but do not serve its address: neither stalled nor unresponsive on a reading
            # that is not its own (engine_port_taken says it); only its exit is news
            self._export(state, None)
            return answered
        if sample is None and asks and await self._saturated(state):
            self._export(state, sample)
            return answered  # it cannot accept while it idles: no failure counts toward unresponsive
        look = lc.Look(answered, sample, state.instance if looked else None, is_spinning(state.cpus))
        if looked and not state.instance:
            state.stalled = state.unanswering = False  # nothing of it runs: nothing left to kill
        changes = state.lifecycle.observe(look)
        self._answering(state, sample is not None, answered, error)
        self._export(state, sample)
        # the hub's situation for the events that follow: this engine's view only (all of them from each
        # engine's poll would cost engines² per interval)
        self.sink.engines([state.view()], {state.name: state.last_scrape()}, whole=False)
        await self._carry_out(state, changes, error)
        return answered

    def _not_its_socket(self, state: EngineState) -> str | object | None:
        """Why its address may not be asked now: None, it may (the socket that serves it is one a look proved
        the engine's, or nothing here listens on it: an engine on another host, or none at all); _NEW, a socket no
        look has judged; else the reason (a holder that is not the engine). Read on the loop from the kernel's
        socket table (its cost: the host's sockets, never their descriptors); a host that is a name is resolved
        only by the look, whose verdict stands."""
        spec = state.spec
        listening = serving_listeners(spec.host, spec.port, lookup=False)
        if listening is None:  # a name: the last look's verdict
            return self._taken_error(state) if state.taken else None
        inodes = frozenset(listener.inode for listener in listening)
        if not inodes or inodes <= state.sockets:
            return None
        if state.taken and inodes <= state.taken_sockets:
            return self._taken_error(state)
        return _NEW

    def _by_owner(self, state: EngineState) -> str | None:
        """With no look to prove it (late, or the socket changed since): the socket's owner in the kernel's table
        must be the engine's user (configured, or as its processes were last seen; none known yet: the first
        server seen is the engine's, as ever)."""
        spec = state.spec
        uid = spec.uid if spec.uid is not None else state.tracker.uid
        for listener in serving_listeners(spec.host, spec.port, lookup=False) or ():
            if uid is not None and listener.uid != uid and not (spec.kind == "docker" and listener.uid == 0):
                return f"its address is held by uid {listener.uid}, not by the engine's user (uid {uid})"
        return None

    def _taken_error(self, state: EngineState) -> str:
        return f"its address is held by {state.taken}, not by the engine"

    def _say_taken(self, state: EngineState) -> None:
        """engine_port_taken once per holder; said in the log when the engine has its address again."""
        said = state.taken_said
        if state.taken == said:
            return
        state.taken_said = state.taken
        if state.taken is None:
            log.info("engine %s: its address is served by the engine again", state.name)
            return
        spec = state.spec
        address = f"{spec.host}:{spec.port}"
        self._record(Event("engine_port_taken", Severity.CRITICAL,
                           f"{state.name}: {address} is held by {state.taken}, not by a process of the engine: "
                           "not read, not asked, no credential sent; the engine counts as down (if the engine "
                           "now runs as this user, set [engine.target] user)", time.time(), engine=state.name,
                           evidence={"holder": state.taken, "address": address,
                                     "sockets": sorted(state.taken_sockets)}))

    async def _scrape(self, state: EngineState) -> tuple[EngineSample | None, str, float]:
        """Its figures, or None and why not (a refused log file said once, again when the reason changes), and
        when they came."""
        try:
            sample = await state.scraper.scrape()
        except ScrapeError as exc:
            answered = time.monotonic()
            error = redact(str(exc))
            self.sink.count(families.ENGINE_SCRAPE_FAILURES, state.name, exc.reason)
            if isinstance(exc, LogRefused) and state.log_refused != error:
                state.log_refused = error
                self._record(Event("log_refused", Severity.WARNING, f"{state.name}: not reading its log: {error}",
                                   time.time(), engine=state.name, evidence={"error": error}))
            return None, error, answered
        answered, state.log_refused = time.monotonic(), None
        return sample, "", answered

    def _answering(self, state: EngineState, answered: bool, now: float, error: str) -> None:
        """A configured engine silent past its bound: one page per silence, its end said when it answers."""
        life = state.lifecycle
        if state.answering is None or state.lookalike:
            return
        said = state.answering.observe(answered, now, life.awaits_start or life.phase == "failed")
        if said is Said.ANSWERS:
            self.sink.resolve(conditions.down(state.name), f"{state.name} answers {_ENDPOINT[state.config.source]}")
        elif said is Said.NOT_ANSWERING:
            self._record(self._not_answering_event(state, error, state.answering.silent_for(now)))

    async def _carry_out(self, state: EngineState, changes: list[lc.Transition], error: str) -> None:
        """Each transition its lifecycle returned: an event, a resolution, a gauge, a log line, or a canary
        whose answer goes back to the lifecycle (and what that returns is carried out in turn)."""
        for change in changes:
            await self._ON[type(change)](self, state, change, error)

    async def _judged(self, state: EngineState, change: lc.Judged, error: str) -> None:
        state.stalled = change.verdict.stalled
        self.sink.metric(families.ENGINE_STALLED, 1 if change.verdict.stalled else 0, state.name)
        self.sink.metric(families.ENGINE_STALL_THRESHOLD, change.verdict.threshold, state.name)

    async def _stalled(self, state: EngineState, change: lc.Stalled, error: str) -> None:
        await self._record_with_target(state, self._stall_event(state, change))

    async def _confirm_stall(self, state: EngineState, change: lc.ConfirmStall, error: str) -> None:
        result = await self._canary(state)
        await self._carry_out(state, state.lifecycle.stall_canaried(change, result, time.monotonic()), error)

    async def _stall_denied(self, state: EngineState, change: lc.StallDenied, error: str) -> None:
        log.info("%s: its log shows no progress for %.0f s, but a real completion returned (%s)", state.name,
                 change.verdict.stalled_for, change.canary.detail)
        state.scraper.reader.nudge()

    async def _progressing(self, state: EngineState, change: lc.Progressing, error: str) -> None:
        self.sink.resolve(conditions.stalled(state.name), f"{state.name} is making progress again")

    async def _silent(self, state: EngineState, change: lc.Silent, error: str) -> None:
        log.warning("engine %s: cannot read its progress from %s (%d tries, last: %s); watching on", state.name,
                    _ENDPOINT[state.config.source], change.failures, error)

    async def _unresponsive(self, state: EngineState, change: lc.Unresponsive, error: str) -> None:
        state.unanswering = True
        await self._record_with_target(state, self._unresponsive_event(state, error, change))

    async def _answers(self, state: EngineState, change: lc.Answers, error: str) -> None:
        name, endpoint = state.name, _ENDPOINT[state.config.source]
        state.unanswering = False
        if change.was_unresponsive:
            self.sink.resolve(conditions.unresponsive(name), f"{name} answers {endpoint} again")
        log.info("engine %s: %s answers again", name, endpoint)

    async def _exited(self, state: EngineState, change: lc.Exited | lc.CrashLoop, error: str) -> None:
        self._record(self._exit_event(state, change))

    async def _starting(self, state: EngineState, change: lc.Starting, error: str) -> None:
        log.info("engine %s: a new instance (%d process(es)) is starting: judged by its own figures, back once its "
                 "tokens move or a real completion returns", state.name, change.processes)

    async def _canary_due(self, state: EngineState, change: lc.CanaryDue, error: str) -> None:
        """Beside the scrapes: its progress meanwhile proves it back, and a stall after that is judged on time."""
        spawn = self._tasks.create_task if self._tasks else asyncio.ensure_future
        spawn(self._start_canary(state, change))

    async def _start_canary(self, state: EngineState, due: lc.CanaryDue) -> None:
        result = await self._canary(state)
        await self._carry_out(state, state.lifecycle.canaried(result, time.monotonic(), due), "")

    async def _canary_misconfigured(self, state: EngineState, change: lc.CanaryMisconfigured, error: str) -> None:
        self._record(Event("canary_misconfigured", Severity.WARNING, f"{state.name}: the canary cannot ask it for "
                           f"a completion: {change.canary.detail}. Its own progress still proves it serves; a "
                           "stall is still judged by it", time.time(), engine=state.name, gpu=state.gpu,
                           evidence={"canary": asdict(change.canary)}))

    async def _unproven(self, state: EngineState, change: lc.Unproven, error: str) -> None:
        cfg = state.config
        self._record(Event("canary_misconfigured", Severity.WARNING, f"{state.name} is not proven back "
                           f"{change.waited:.0f} s after it started again (restart_timeout "
                           f"{cfg.restart_timeout:.0f} s): it answers but has processed no token, and the canary "
                           f"cannot ask it ({change.canary.detail}); watched as any engine, back at its first "
                           "tokens", time.time(), engine=state.name, gpu=state.gpu,
                           evidence={"unproven": True, "waited_seconds": round(change.waited, 1),
                                     "canary": asdict(change.canary)}))

    async def _back(self, state: EngineState, change: lc.Back, error: str) -> None:
        self._record(self._back_event(state, change))

    async def _restart_failed(self, state: EngineState, change: lc.RestartFailed, error: str) -> None:
        self._record(self._restart_failed_event(state, change))

    async def _suspect_canary_due(self, state: EngineState, change: lc.SuspectCanaryDue, error: str) -> None:
        """Beside the scrapes: a stall meanwhile is still seen within the floor."""
        spawn = self._tasks.create_task if self._tasks else asyncio.ensure_future
        spawn(self._suspect_canary(state, change))

    async def _suspect_canary(self, state: EngineState, due: lc.SuspectCanaryDue) -> None:
        result = await self._canary(state)
        after = None
        if result.outcome == "timeout":  # whether it works on meanwhile (a long prefill holds a canary back)
            try:
                after = await state.scraper.scrape()
            except ScrapeError:
                pass
        await self._carry_out(state, state.lifecycle.suspect_canaried(due, result, after, time.monotonic()), "")

    async def _suspicion_eased(self, state: EngineState, change: lc.SuspicionEased, error: str) -> None:
        if change.working:
            log.info("%s under suspicion: the canary did not return in time, but it works on (%s)", state.name,
                     change.canary.detail)
        else:
            log.info("%s under suspicion: canary %s (%s)", state.name, change.canary.outcome, change.canary.detail)

    async def _idle_canary_due(self, state: EngineState, change: lc.IdleCanaryDue, error: str) -> None:
        """Beside the scrapes, as the suspicion's: a stall while it waits out its timeout is judged meanwhile."""
        spawn = self._tasks.create_task if self._tasks else asyncio.ensure_future
        spawn(self._idle_canary(state, change))

    async def _idle_canary(self, state: EngineState, due: lc.IdleCanaryDue) -> None:
        result = await self._canary(state)
        await self._carry_out(state, state.lifecycle.idle_canaried(due, result, time.monotonic()), "")

    async def _canary_unanswered(self, state: EngineState, change: lc.CanaryUnanswered, error: str) -> None:
        state.unanswering = True
        await self._record_with_target(state, self._canary_event(state, change.last, change.canary))

    async def _completes_again(self, state: EngineState, change: lc.CompletesAgain, error: str) -> None:
        state.unanswering = False
        self.sink.resolve(conditions.unresponsive(state.name), f"{state.name} completes a request again")

    _ON: ClassVar[dict] = {
        lc.Judged: _judged, lc.Stalled: _stalled, lc.ConfirmStall: _confirm_stall, lc.StallDenied: _stall_denied,
        lc.Progressing: _progressing, lc.Silent: _silent, lc.Unresponsive: _unresponsive, lc.Answers: _answers,
        lc.Exited: _exited, lc.CrashLoop: _exited, lc.Starting: _starting, lc.CanaryDue: _canary_due,
        lc.Back: _back, lc.RestartFailed: _restart_failed, lc.SuspectCanaryDue: _suspect_canary_due,
        lc.SuspicionEased: _suspicion_eased, lc.IdleCanaryDue: _idle_canary_due,
        lc.CanaryUnanswered: _canary_unanswered, lc.CompletesAgain: _completes_again,
        lc.CanaryMisconfigured: _canary_misconfigured, lc.Unproven: _unproven}

    # --- the canary -----------------------------------------------------------------------------------

    async def _canary(self, state: EngineState) -> CanaryResult:
        """One at a time per engine: the engine's own poll loop awaits it (the suspicion's runs beside it)."""
        cfg = state.config
        if cfg.canary == "off":
            return CanaryResult("off", 0.0, "the canary is off")
        why = self._not_its_socket(state)
        if why is _NEW:  # changed since the last look: its owner's word
            why = self._by_owner(state)
        if why is not None:  # a completion asked of whoever holds its address proves nothing of the engine's
            return CanaryResult("skipped", 0.0, why)
        api = api_for(cfg.canary, state.sample.profile.split()[0] if state.sample else cfg.profile)
        client = client_of(cfg, state.procs)
        if isinstance(client, CanaryResult):
            self.sink.count(families.ENGINE_CANARIES, state.name, client.outcome)
            return client
        # looked at before and after: an engine frees places now and then (a client's read timeout) and a crowd
        # takes them again, so the one look at the end may fall in such a gap
        before = await self._saturation(state)
        result = await canary(base_url(cfg), api, cfg.canary_timeout, client)
        if result.outcome == "timeout" and (full := await self._saturated(state, before)):
            # not a completion that did not return: one that could not be asked (the lifecycle judges nothing by it)
            result = CanaryResult("saturated", result.seconds, f"{result.detail}: it cannot accept: {full.reason}")
        elif result.outcome == "ok":
            state.saturated = None
        self.sink.count(families.ENGINE_CANARIES, state.name, result.outcome)
        return result

    async def _saturation(self, state: EngineState) -> Saturation | None:
        """The engine cannot accept a connection now while it idles (its last figures show no request running or
        waiting). One that was working when it stopped answering is not asked about: judged as before."""
        last, port = state.sample, urlsplit(base_url(state.config)).port
        if last is None or last.running != 0 or last.waiting or port is None:
            return None
        try:
            return await _SATURATION.run(state.name, 5.0, saturation, port, [p.pid for p in state.procs])
        except (Busy, TimeoutError):
            return None

    async def _saturated(self, state: EngineState, before: Saturation | None = None) -> Saturation | None:
        """Whether a canary or scrape failed because the engine cannot accept (now, or `before` it began): then
        it is `engine_saturated`, said once an episode, and never unresponsive for it."""
        found = await self._saturation(state) or before
        if found and not state.saturated:
            self._record(Event("engine_saturated", Severity.WARNING,
                               f"{state.name} cannot accept a connection while it idles: {found.describe()}. Not "
                               "killed for it: clients holding every connection it can take are not a hang (the "
                               "canary and the scrapes need one)", time.time(), engine=state.name,
                               evidence={"reason": found.reason, "peers": found.peers, "port": found.port}))
        state.saturated = found
        return found

    async def inspect(self, state: EngineState, wide: bool = False) -> bool:
        """Find the engine's processes, their CPU and GPUs, off the loop and with a deadline; False when the
        look-up did not answer. `wide`: a kill's look, whose tree includes what only a read of all of the
        engine user's processes finds (Tracker.refresh); a scrape's look under way is awaited first, then one
        taken for the kill. Another kill's look under way is the one it needs: awaited, never for nothing."""
        while wide and state.looking is not None and not state.looking.done() and not state.looking_wide:
            await asyncio.wait({state.looking})  # bounded: a look has its deadline
        if state.looking is None or state.looking.done():
            state.looking, state.looking_wide = asyncio.ensure_future(self._look(state, wide)), wide
        return await asyncio.shield(state.looking)

    async def _look(self, state: EngineState, wide: bool = False) -> bool:
        seen = await self._looker.look(state.name, state.config, state.tracker, wide)
        if seen is None:
            return False
        state.procs, state.instance, state.refused, state.cpus = seen.procs, seen.instance, seen.refused, seen.cpus
        state.busiest = seen.busiest
        state.gpus, state.pasids, state.seen_at = seen.gpus, seen.pasids, time.monotonic()
        state.taken = seen.taken
        if seen.taken:
            state.sockets, state.taken_sockets = frozenset(), seen.sockets
        else:
            state.sockets, state.taken_sockets = seen.sockets, frozenset()
        if state.cpus:
            self.sink.metric(families.ENGINE_CPU, state.cpu / 100, state.name)  # psutil's percent: 100 = a core
        elif not state.procs:  # none of its processes lives: not the dead instance's last figure
            self.sink.metric(families.ENGINE_CPU, 0, state.name)
        return True

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

    def _stall_event(self, state: EngineState, stalled: lc.Stalled) -> Event:
        sample, verdict, spinning, life = state.sample, stalled.verdict, stalled.spinning, state.lifecycle
        message = (f"{state.name}: {plural(sample.running or 0, 'request')} running and no token processed for "
                   f"{verdict.stalled_for:.0f} s (threshold {verdict.threshold:.0f} s)")
        if spinning:
            message += f"; {state.spinner()}: the classic hang"
        suspect = life.suspected(time.monotonic())
        if suspect:
            message += f"; under suspicion since {life.suspicion}"
        figures = {"running": sample.running, "waiting": sample.waiting, "tokens_processed": sample.progress,
                   "generated_tokens": sample.generated, "stalled_seconds": round(verdict.stalled_for, 1),
                   "threshold_seconds": round(verdict.threshold, 1),
                   f"typical_{'token' if verdict.per_step else 'request'}_seconds": verdict.typical,
                   "cpu_percent": state.cpu}
        source = state.config.source
        evidence = {"figures": figures, "spinning": spinning, "busiest": state.busiest, "source": source,
                    **({"suspicion": life.suspicion} if suspect else {})}
        if source == "log":
            message += f" (read from {state.scraper.where})"
        if stalled.canary is not None:  # the log's word, confirmed by a canary that did not complete
            message += f"; canary: {stalled.canary.detail or stalled.canary.outcome}"
            evidence["canary"] = asdict(stalled.canary)
        return Event("engine_stall", Severity.CRITICAL, message, time.time(), engine=state.name,
                     gpu=state.gpu, evidence=evidence)

    def _exit_event(self, state: EngineState, change: lc.Exited | lc.CrashLoop) -> Event:
        if isinstance(change, lc.Exited):
            return Event("engine_exited", Severity.WARNING, f"{state.name}'s processes are gone", time.time(),
                         engine=state.name, evidence={"exits_in_window": change.exits})
        return Event("engine_crash_loop", Severity.CRITICAL, f"{state.name} exited {change.exits} times within "
                     f"{state.config.crash_loop_window:.0f} s", time.time(), engine=state.name,
                     evidence={"exits": change.exits})

    def _canary_event(self, state: EngineState, sample: EngineSample, result: CanaryResult) -> Event:
        message = (f"{state.name}: {result.detail} (a one-token canary) while its "
                   f"{plural(len(state.procs), 'process')} {_live(state.procs)}"
                   + (f"; {state.spinner()}" if is_spinning(state.cpus) else ""))
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
        was = (f"{plural(running, 'request')} {'was' if round(running) == 1 else 'were'} running when it last "
               "answered" if running
               else "no request was running when it last answered" if last else "it has never answered")
        endpoint = _ENDPOINT[state.config.source]
        message = (f"{state.name} has not answered {endpoint} for {change.silent_for:.0f} s "
                   f"({plural(change.failures, 'try', 'tries')}, last: {error}) while its "
                   f"{plural(len(state.procs), 'process')} {_live(state.procs)}; {was}")
        figures = {"failures": change.failures, "silent_seconds": round(change.silent_for, 1), "running": running,
                   "cpu_percent": state.cpu, "processes": len(state.procs)}
        return Event("engine_unresponsive", Severity.CRITICAL if running else Severity.WARNING, message, time.time(),
                     engine=state.name, gpu=state.gpu,
                     evidence={"error": error, "figures": figures, "requests_running": running or 0})

    def _not_answering_event(self, state: EngineState, error: str, silent: float) -> Event:
        cfg, answering = state.config, state.answering
        address = where(cfg.metrics_url) if cfg.source == "metrics" else where(cfg.url or cfg.metrics_url) \
            if cfg.source == "slots" else "its log"
        processes = f"{plural(len(state.procs), 'process')} of it {_live(state.procs)}" if state.procs else \
            "no process of it was found"
        message = (f"{state.name} has not answered at {address} for {silent:.0f} s, since {answering.began} "
                   f"(last error: {error or 'none'}); {processes}")
        return Event("engine_not_answering", Severity.CRITICAL, message, time.time(), engine=state.name,
                     gpu=state.gpu, evidence={"error": error, "where": address, "since": answering.began,
                                              "figures": {"silent_seconds": round(silent, 1),
                                                          "processes": len(state.procs)}})

    def _back_event(self, state: EngineState, back: lc.Back) -> Event:
        """Says how it was proven: the canary's completion, or the tokens it served."""
        name, result = state.name, back.canary
        when = (f"{back.since_kill:.0f} s after the kill" if back.since_kill is not None
                else f"{back.since_start:.0f} s after it started again")
        if result is None:
            message = f"{name} back: {plural(back.tokens, 'token')} in its first {back.serving:.0f} s ({when})"
        else:
            proof = "first completion" if result.outcome == "ok" else "answers again (the canary is off)"
            message = f"{name} back: {proof} {when}" + (f" ({result.detail})" if result.detail else "")
        return Event("engine_back", Severity.INFO, message, time.time(), engine=name, gpu=state.gpu,
                     evidence={"seconds_since_kill": None if back.since_kill is None else round(back.since_kill, 1),
                               "seconds_since_start": round(back.since_start, 1),
                               "proof": "tokens" if result is None else "canary",
                               "canary": asdict(result) if result else None,
                               **({"tokens": back.tokens, "serving_seconds": round(back.serving, 1)}
                                  if result is None else {})})

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

    async def _record_with_target(self, state: EngineState, event: Event) -> None:
        """An event the policy may kill for, reported with the kill's target (in its view, the same report: the
        actuator kills that target and asks nothing back), judged on a look taken now, a kill's (wide: a scrape's
        look walks the engine's tree alone, Tracker.refresh)."""
        late = ""
        if not await self.inspect(state, wide=True):
            late = self._late(state)  # the kill takes the last good look's processes: said if there are none
        self.sink.engines([state.view(state.target(late))], {state.name: state.last_scrape()}, whole=False)
        self._record(event)

    def _record(self, event: Event) -> None:
        """A discovered server that only looks like an engine (anyone can start one) is never a page; those of
        one user are alerted together (a user can start sixteen of root's own llama-server and stall them)."""
        state = self.engines.get(event.engine or "")
        if state is not None and state.crowd:
            event = replace(event, message=f"{event.message} (one of the {state.crowd}, alerted together)",
                            evidence={**event.evidence, CROWD: state.crowd})
        if state is not None and state.lookalike:
            event = replace(event, severity=min(event.severity, Severity.WARNING),
                            message=f"{event.message} (a discovered server not installed as an engine)",
                            evidence={**event.evidence, "lookalike": True})
        self.sink.record([event])


_SATURATION = OffLoop("saturation", limit=2)  # /proc/net/tcp and an engine's descriptors


def client_of(cfg: EngineConfig, procs: list[psutil.Process]) -> Client | CanaryResult:
    """What the canary sends as the engine's clients do; a key file it may not use is a misconfigured canary.
    Without a key file, the `--api-key` on the command line of the engine's own processes (`procs`: those
    serving metrics_url) is sent back to that same server only: never to a `url` elsewhere."""
    headers = tuple(cfg.canary_headers.items())
    if cfg.canary_api_key_file is not None:
        try:
            key = api_key(cfg.canary_api_key_file)
        except ValueError as exc:
            return CanaryResult("misconfigured", 0.0, f"canary_api_key_file: {exc}")
        return Client(key, headers, cfg.canary_model, cfg.canary_route, f"from {cfg.canary_api_key_file}")
    key = None
    if urlsplit(base_url(cfg)).netloc == urlsplit(pinned(cfg.metrics_url)).netloc:
        for proc in procs:
            try:
                if proc.is_running() and (key := key_in(proc.cmdline())):  # is_running: the pid not reused
                    break
            except psutil.Error:
                continue
    return Client(key and Secret(key), headers, cfg.canary_model, cfg.canary_route,
                  "from its command line (--api-key)" if key else "")


def _retrieved(task: asyncio.Future) -> None:
    """A late look's outcome, taken when it comes (its state is written by the look itself)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("a look at an engine's processes failed: %s", exc)


def _live(procs: list) -> str:
    return "lives" if len(procs) == 1 else "live"


def is_spinning(cpus: Mapping[int, float]) -> bool:
    """A process of the engine runs near a full core with no progress: the seed incident's hang (both processes
    at 200 % and no throughput; a hung GPU's waiter spins). A stopped or frozen engine does not spin."""
    return bool(cpus) and max(cpus.values()) >= SPINNING_PERCENT

