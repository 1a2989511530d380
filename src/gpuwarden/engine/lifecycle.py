"""An engine's life, pure: each look (the scrape's result, its processes with their start times, whether one
spins, `now`) in; what changed out, as typed transitions the watch turns into events. Nobody else writes it: the
kill is something it is told (`killing`), the restart's failure too (`restart_failed`).

- watching: judged by its figures: a stall (the stall detector), unresponsive (scrapes fail while its processes
  live, for the stall threshold), progress again.
- down: killed, or exited (its processes gone, not by our kill; enough exits in a window: a crash loop).
- starting: a new instance (none of its processes are the old instance's: new pids or start times) after a kill
  or an exit. It loads: 503, no /metrics yet. It is judged only by its own figures: the dead instance's last
  answer, requests running and stall detector are dropped, and nothing during start-up is held against it.
  Once it answers, a real completion (the canary) is asked for; when one returns, it is back.
- failed: a restart gpuwarden made (or a start its supervisor made) did not bring it back within
  `restart_timeout`: said once; it is then judged as any engine, and never restarted by gpuwarden again.

Times are monotonic seconds passed in; the lifecycle never reads a clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuwarden.engine.canary import CanaryResult
from gpuwarden.engine.metrics import EngineSample
from gpuwarden.engine.stall import StallDetector, Verdict
from gpuwarden.policy import exited

Instance = frozenset[tuple[int, float]]  # (pid, start time) of each process


@dataclass(frozen=True, slots=True)
class Rules:
    unresponsive_after: int = 3  # failed scrapes in a row
    kill_grace: float = 10.0
    crash_loop_exits: int = 3
    crash_loop_window: float = 600.0
    restart_timeout: float = 600.0  # a restarted engine not back by then: the restart failed
    canary_every: float = 5.0  # how often a starting engine that answers is asked for a completion
    kill_budget_window: float = 3600.0


@dataclass(frozen=True, slots=True)
class Look:
    now: float
    sample: EngineSample | None  # None: the scrape failed
    processes: Instance | None  # None: the look-up did not answer (keep what is known)
    spinning: bool = False
    suspect: bool = False  # under suspicion (a fault with no owner on its GPU): judged on the floor


# --- transitions -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Judged:
    """A scrape that answered outside start-up, and its verdict (for the gauges)."""

    verdict: Verdict


@dataclass(frozen=True, slots=True)
class Stalled:
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class Progressing:
    pass


@dataclass(frozen=True, slots=True)
class Silent:
    """The scrape failed `unresponsive_after` times in a row (said once per outage)."""

    failures: int


@dataclass(frozen=True, slots=True)
class Unresponsive:
    silent_for: float  # since its last answer, or since this instance was first seen: never before it started
    failures: int
    last: EngineSample | None  # this instance's last answer


@dataclass(frozen=True, slots=True)
class Answers:
    """It answers again after `unresponsive_after` failures; `was_unresponsive`: one was reported."""

    was_unresponsive: bool


@dataclass(frozen=True, slots=True)
class Exited:
    exits: int  # within the crash-loop window, this one included


@dataclass(frozen=True, slots=True)
class CrashLoop:
    exits: int


@dataclass(frozen=True, slots=True)
class Starting:
    processes: int


@dataclass(frozen=True, slots=True)
class CanaryDue:
    pass


@dataclass(frozen=True, slots=True)
class Back:
    since_kill: float | None  # seconds since our kill; None when it had exited by itself
    since_start: float  # seconds since its new instance was first seen
    canary: CanaryResult


@dataclass(frozen=True, slots=True)
class RestartFailed:
    waited: float
    by_us: bool  # gpuwarden restarted it (else its supervisor started it after an exit or a kill)
    started: bool  # a new instance was seen at all


Transition = (Judged | Stalled | Progressing | Silent | Unresponsive | Answers | Exited | CrashLoop | Starting
              | CanaryDue | Back | RestartFailed)


class Lifecycle:
    def __init__(self, rules: Rules, detector: Callable[[], StallDetector]) -> None:
        self.rules, self._new_detector = rules, detector
        self.phase = "watching"  # watching | down | starting | failed
        self.detector = detector()
        self.kills: tuple[float, ...] = ()  # our real kills within the budget window
        self.restart_refused = False  # a restart failed: the policy restarts it no more
        self.sample: EngineSample | None = None  # this instance's last answer
        self._instance: Instance = frozenset()
        self._looked = False
        self._since: float | None = None  # when this instance was first seen (or watching began)
        self._answered: float | None = None
        self._failures = 0
        self._unresponsive = False
        self._exits: tuple[float, ...] = ()
        self._killed_at: float | None = None
        self._restarting = False  # gpuwarden restarts it (after its kill)
        self._deadline: float | None = None  # back by then, or the restart failed
        self._canary_at = -1e18

    # --- told --------------------------------------------------------------------------------------

    def killing(self, now: float, restart: bool) -> None:
        """Our real kill begins (a dry run is none): its processes going now is not news, and it is down."""
        self.kills = (*(t for t in self.kills if now - t <= self.rules.kill_budget_window), now)
        self._killed_at, self._restarting = now, restart
        self._deadline = now + self.rules.restart_timeout if restart else None
        self._down()

    def restart_failed(self) -> None:
        """Asking its supervisor to start it failed: nothing to wait for."""
        self.phase, self._deadline, self.restart_refused = "failed", None, True

    def kept(self, earlier: Lifecycle) -> None:
        """A reload: how often it was killed, and whether a restart failed, outlive the new configuration."""
        self.kills, self.restart_refused = earlier.kills, earlier.restart_refused

    @property
    def in_grace(self) -> bool:
        """Down or starting: no figure of the dead instance counts, and none of the new one yet."""
        return self.phase in ("down", "starting")

    # --- each look ---------------------------------------------------------------------------------

    def observe(self, look: Look) -> list[Transition]:
        out: list[Transition] = []
        if look.processes is not None:
            self._processes(look.processes, look.now, out)
        self._since = self._since if self._since is not None else look.now  # an engine hung before we came counts
        if self._deadline is not None and self.in_grace and look.now >= self._deadline:
            out.append(RestartFailed(look.now - (self._killed_at if self._restarting else self._since),
                                     self._restarting, self.phase == "starting"))
            self.restart_refused = self.restart_refused or self._restarting
            self.phase, self._deadline = "failed", None
        if look.sample is None:
            self._failed(look, out)
        else:
            self._answered_with(look, out)
        return out

    def canaried(self, result: CanaryResult, now: float) -> list[Transition]:
        """The answer to a CanaryDue: a completion (or, with the canary off, the answer itself) means back."""
        if self.phase not in ("starting", "failed") or result.outcome not in ("ok", "off"):
            return []
        back = Back(now - self._killed_at if self._killed_at is not None else None, now - self._since, result)
        self.phase, self._deadline, self._restarting = "watching", None, False
        return [back]

    def _processes(self, current: Instance, now: float, out: list[Transition]) -> None:
        first, self._looked = not self._looked, True
        if self._instance and not self._instance & current:  # every process of the instance is gone
            self._instance = frozenset()
            self._gone(now, out)
        if current and not self._instance:
            self._instance = current
            if self.phase == "down" or (self.phase == "failed" and not first):
                self._start(now, current, out)
            elif not first and self.phase == "watching":
                self._since = now  # an engine that was not running: its silence counts from now
        else:
            self._instance |= current  # a worker it forked belongs to it

    def _gone(self, now: float, out: list[Transition]) -> None:
        exits = exited(self._exits, now, self._killed_at, self.rules.kill_grace, self.rules.crash_loop_window)
        if exits is None:
            return  # our kill
        self._exits = exits
        if not self._restarting:  # a restart of ours that dies while it loads still has its deadline
            self._killed_at, self._deadline = None, None
        out.append(Exited(len(exits)))
        if len(exits) >= self.rules.crash_loop_exits:
            out.append(CrashLoop(len(exits)))
            self._exits = ()
        self._down()

    def _down(self) -> None:
        self.phase = "down"
        self._forget()

    def _start(self, now: float, current: Instance, out: list[Transition]) -> None:
        self.phase, self._since, self._canary_at = "starting", now, -1e18
        if self._deadline is None:  # a start its supervisor made: it is given as long as a restart of ours
            self._deadline = now + self.rules.restart_timeout
        self._forget()
        out.append(Starting(len(current)))

    def _forget(self) -> None:
        """Nothing of the dead instance is held against the next one."""
        self.detector, self.sample, self._answered = self._new_detector(), None, None
        self._failures, self._unresponsive = 0, False

    def _failed(self, look: Look, out: list[Transition]) -> None:
        if self.in_grace:
            return  # loading: 503, no /metrics yet
        self._failures += 1
        if self._failures == self.rules.unresponsive_after:
            out.append(Silent(self._failures))
        silent_for = look.now - (self._answered if self._answered is not None else self._since)
        if (self._failures >= self.rules.unresponsive_after and self._instance and not self._unresponsive
                and silent_for >= self.detector.threshold(look.spinning, look.suspect)):
            self._unresponsive = True
            out.append(Unresponsive(silent_for, self._failures, self.sample))

    def _answered_with(self, look: Look, out: list[Transition]) -> None:
        if self._failures >= self.rules.unresponsive_after or self._unresponsive:
            out.append(Answers(self._unresponsive))
        self._failures, self._unresponsive, self._answered = 0, False, look.now
        if self.phase in ("starting", "failed"):
            self.sample = look.sample  # its own figures, for the record; judged once it is back
            if look.now - self._canary_at >= self.rules.canary_every:
                self._canary_at = look.now
                out.append(CanaryDue())
            if self.phase == "starting":
                return
        if self.phase == "down":
            return  # the old instance still answers while it dies: nothing to judge
        self.sample = look.sample
        verdict = self.detector.observe(look.sample, look.now, look.spinning, look.suspect)
        out.append(Judged(verdict))
        if verdict.new:
            out.append(Stalled(verdict) if verdict.stalled else Progressing())
