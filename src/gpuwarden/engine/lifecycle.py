"""An engine's life, pure: each look (the scrape's result, its processes with their start times, whether one
spins, `now`) in; what changed out, as typed transitions the watch turns into events. Nobody else writes it: the
kill is something it learns, as are a restart that could not be asked for (`restart_failed`), a suspicion
(`suspect`) and each canary's answer. It decides every canary: when one is due (start-up, a stall
read from a log, a suspicion, an idle engine) and what its answer means.

- watching: judged by its figures: a stall (the stall detector), unresponsive (scrapes fail while its processes
  live, for the stall threshold), progress again.
- down: killed, or exited (its processes gone, not by our kill; enough exits in a window: a crash loop).
- a kill learnt: a fault's kill before its signals (`killing`); a stall's kill as its outcome, after them
  (`learned`: the report of the stall carried the look the kill takes, so nothing is asked of the engine side
  between). From a stall (or no answer) whose setting may ask a real kill (`Rules.kill_stall`,
  `kill_silence`) until the outcome, for at most `kill_grace` + `KILL_SLACK` + `OUR_KILL_SLACK` seconds (the
  longest a kill's signals are waited for, and the way from the stall's look to the kill and back), its
  processes going is an exit held pending: down, but neither an exit nor ours yet. A real kill learnt makes
  it ours (the kill's time, for the budget and the restart's deadline, is the stall's); a refusal, a dry run
  or the bound passing judges it as any exit.
- starting: a new instance (none of its processes are the old instance's: new pids or start times) after a kill
  or an exit. It loads: 503, no /metrics yet. It is judged only by its own figures: the dead instance's last
  answer, requests running and stall detector are dropped, and nothing during start-up is held against it.
  It is back on the first proof that it serves: its own progress counter moving (tokens it processed since it
  first answered), or a real completion (the canary, asked beside the scrapes once it answers). From then it is
  judged as any running instance: one that progressed and then stalls with requests running is a stall. One
  that answers but neither progresses nor completes a canary is reported at `restart_timeout`.
- a canary that cannot authenticate (HTTP 401, 403, 404: a key, a model name or a route it lacks) is a
  configuration problem, said once (`CanaryMisconfigured`): never a stall, never unresponsive, never "not
  back". A starting instance that answers while its canary is misconfigured is not failed at `restart_timeout`:
  it is said unproven (`Unproven`), judged as any engine from then, and back once it progresses.
- canaries: a stall read from a log is the engine's word alone: a real completion is asked for first (ConfirmStall),
  and only one that does not return makes it a stall. Under suspicion (a fault with no owner on its GPU) one
  canary runs; one that times out while the engine shows no work is unresponsive. An engine that shows no
  progress is asked every `idle_canary_every`; a timeout is unresponsive, a later completion ends it.
- failed: a restart gpuwarden made (or a start its supervisor made) did not bring it back within
  `restart_timeout`: said once; it is then judged as any engine, and not restarted by gpuwarden again until a
  confirmed back (whoever started it: a person's start after a failed restart counts) clears that.

Times are monotonic seconds passed in; the lifecycle never reads a clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from gpuwarden.core.plain import plain
from gpuwarden.core.policy import KILL_SLACK, OUR_KILL_SLACK, exited
from gpuwarden.engine.canary import CanaryResult
from gpuwarden.engine.metrics import EngineSample
from gpuwarden.engine.stall import StallDetector, Verdict

Instance = frozenset[tuple[int, float]]  # (pid, start time) of each process
_UNPROVEN = ("starting", "failed", "unproven")  # not proven back since its start: a canary is asked, progress counts


@plain
class Rules:
    """An engine's settings as its lifecycle reads them."""

    unresponsive_after: int = 3  # failed scrapes in a row
    kill_grace: float = 10.0
    crash_loop_exits: int = 3
    crash_loop_window: float = 600.0
    restart_timeout: float = 600.0  # a restarted engine not back by then: the restart failed
    canary_every: float = 5.0  # how often a starting engine that answers is asked for a completion
    kill_budget_window: float = 3600.0
    confirm_stall: bool = False  # its progress is read from its log: a canary confirms a stall first
    idle_canary_every: float = 0.0  # 0: no canary while it shows no progress
    suspicion: float = 300.0  # how long a fault with no owner keeps it under suspicion (each fault anew)
    kill_stall: bool = False  # its stall may be killed (on_stall, not a dry run): the kill's outcome is awaited
    kill_silence: bool = False  # the same for no answer (on_unresponsive)


@plain
class Look:
    """One look at the engine: its scrape and its processes."""

    now: float
    sample: EngineSample | None  # None: the scrape failed
    processes: Instance | None  # None: the look-up did not answer (keep what is known)
    spinning: bool = False


# --- transitions -----------------------------------------------------------------------------------------

# A transition is a message, read by its type and fields once, where it is returned: a NamedTuple, immutable and
# the cheapest class to define (a frozen dataclass, even `plain`, compiles three methods at import: 3 ms over these).

class Judged(NamedTuple):
    """A scrape that answered outside start-up, and its verdict (for the gauges)."""

    verdict: Verdict


class Stalled(NamedTuple):
    """A stall, said (confirmed by a canary where its progress is read from a log)."""

    verdict: Verdict
    spinning: bool = False
    canary: CanaryResult | None = None  # the canary that confirmed a stall read from a log


class ConfirmStall(NamedTuple):
    """A stall read from its log: a real completion is asked for before it is said (answer: `stall_canaried`)."""

    verdict: Verdict
    spinning: bool


class StallDenied(NamedTuple):
    """Its log shows no progress, but a real completion returned."""

    verdict: Verdict
    canary: CanaryResult


class SuspectCanaryDue(NamedTuple):
    """Under suspicion: one canary, beside the scrapes (answer: `suspect_canaried`, with this)."""

    before: EngineSample
    epoch: int  # the instance it asks: killed or gone meanwhile, the answer judges nothing


class SuspicionEased(NamedTuple):
    """The suspicion's canary returned, or did not while the engine works on: nothing to say."""

    canary: CanaryResult
    working: bool


class IdleCanaryDue(NamedTuple):
    """No progress since the last look `idle_canary_every` ago (answer: `idle_canaried`). It runs beside the
    scrapes: a canary waiting out its timeout must not hold back the judgement of a stall."""

    sample: EngineSample
    epoch: int


class CanaryUnanswered(NamedTuple):
    """A canary timed out while its processes live (said once, until one completes again)."""

    canary: CanaryResult
    last: EngineSample


class CompletesAgain(NamedTuple):
    """A canary completes again after one timed out, or an engine said unresponsive progresses again."""


class Progressing(NamedTuple):
    """Progress again after a stall."""


class Silent(NamedTuple):
    """The scrape failed `unresponsive_after` times in a row (said once per outage)."""

    failures: int


class Unresponsive(NamedTuple):
    """Silent past the stall threshold while its processes live (said once per outage)."""

    silent_for: float  # since its last answer, or since this instance was first seen: never before it started
    failures: int
    last: EngineSample | None  # this instance's last answer


class Answers(NamedTuple):
    """It answers again after `unresponsive_after` failures; `was_unresponsive`: one was reported."""

    was_unresponsive: bool


class Exited(NamedTuple):
    """Its processes are gone."""

    exits: int  # within the crash-loop window, this one included


class CrashLoop(NamedTuple):
    """Too many exits within the crash-loop window."""

    exits: int


class Starting(NamedTuple):
    """A new instance is seen: its processes, before it answers."""

    processes: int


class CanaryDue(NamedTuple):
    """A starting engine answers: time to ask it for a real completion, beside the scrapes (answer: `canaried`,
    with this): its progress meanwhile proves it back as well."""

    epoch: int = 0  # the instance it asks: gone meanwhile, the answer judges nothing


class Back(NamedTuple):
    """The new instance proved it serves: its canary completed, or its own counters moved."""

    since_kill: float | None  # seconds since our kill; None when it had exited by itself
    since_start: float  # seconds since its new instance was first seen
    canary: CanaryResult | None  # the completion that proved it; None: its progress did
    tokens: float = 0.0  # tokens it processed since it first answered (the proof when no canary)
    serving: float = 0.0  # seconds since it first answered


class CanaryMisconfigured(NamedTuple):
    """The canary was refused (401, 403) or its route or model not found (404): said once, until one completes."""

    canary: CanaryResult


class Unproven(NamedTuple):
    """`restart_timeout` passed while it answers, with neither progress nor a completion, its canary
    misconfigured: not a failed restart (nothing says it does not serve), but not proven back either."""

    waited: float
    canary: CanaryResult


class RestartFailed(NamedTuple):
    """Not back within `restart_timeout` of its kill or exit."""

    waited: float
    by_us: bool  # gpuwarden restarted it (else its supervisor started it after an exit or a kill)
    started: bool  # a new instance was seen at all


Transition = (Judged | Stalled | ConfirmStall | StallDenied | Progressing | Silent | Unresponsive | Answers | Exited
              | CrashLoop | Starting | CanaryDue | Back | RestartFailed | SuspectCanaryDue | SuspicionEased
              | IdleCanaryDue | CanaryUnanswered | CompletesAgain | CanaryMisconfigured | Unproven)


class Lifecycle:
    def __init__(self, rules: Rules, detector: Callable[[], StallDetector]) -> None:
        self.rules, self._new_detector = rules, detector
        self.phase = "watching"  # watching | down | starting | failed | unproven
        self.detector = detector()
        self.kills: tuple[float, ...] = ()  # our real kills within the budget window
        self.restart_refused = False  # a restart failed: the policy restarts it no more
        self.sample: EngineSample | None = None  # this instance's last answer
        self._instance: Instance = frozenset()
        self._looked = False
        self._since: float | None = None  # when this instance was first seen (or watching began)
        self._answered: float | None = None
        self._failures = 0
        self._silent = False  # Silent was said: its answer is said too (Answers)
        self._unresponsive = False
        self._exits: tuple[float, ...] = ()
        self._killed_at: float | None = None
        self._restarting = False  # gpuwarden restarts it (after its kill)
        self._deadline: float | None = None  # back by then, or the restart failed
        self._canary_at = -1e18  # the last start-up canary
        self._start_out = False  # a start-up canary is out: one at a time
        self._first_answer: tuple[float, float] | None = None  # this instance's first answer: (progress, when)
        self.misconfigured: CanaryResult | None = None  # the canary's last refusal, said once (None: none since)
        self.epoch = 0  # instances seen down: an answer asked of an earlier one judges nothing
        self.suspicion = ""  # why it is under suspicion
        self._suspect_until = -1e18
        self._suspect_due = False  # the suspicion's canary is due at the next answer
        self._asked = -1e18  # the last canary of any kind
        self._idle_progress: float | None = None  # the progress counter at the idle canary's last look
        self._idle_out = False  # an idle canary is out: one at a time
        self.canary_failed = False  # a canary timed out and none completed since
        self._kill_asked: float | None = None  # a stall that may be killed was said: the kill's outcome is awaited
        self._held: tuple[float, ...] = ()  # when its processes went while the outcome was awaited (pending exits)
        self._stuck: frozenset[str] = frozenset()  # "stalled", "unresponsive": open when gpuwarden (re)started
        self._stuck_progress: float | None = None  # its progress counter at the first look since then

    # --- told --------------------------------------------------------------------------------------

    def killing(self, now: float, restart: bool) -> None:
        """Our real kill begins (a dry run is none): its processes going now is not news, and it is down."""
        self._kill_asked, self._held = None, ()  # told before the signals: no outcome to wait for
        self._killed(now, restart)
        self._deadline = now + self.rules.restart_timeout if restart else None
        self._down()

    def learned(self, killed: bool, restart: bool, now: float) -> list[Exited | CrashLoop]:
        """The outcome of the kill a stall's transition awaits: `killed`, a real kill (ours: down until back,
        timed from the stall); else refused or a dry run (an exit held pending is judged now). Nothing when no
        outcome was awaited (a fault's kill was told before its signals). Past the bound, where its going was
        judged an exit already, a real kill still counts toward the budget."""
        at, self._kill_asked = self._kill_asked, None
        if at is None:
            return []
        if not killed:
            return self._judge_pending()
        if not self._held and not self._awaiting_since(at, now):
            self.kills = (*self.kills, at)
            return []
        if not self._held:  # its processes have not gone yet (at the last look): as if told before
            self.killing(at, restart)
            return []
        self._held = ()  # gone already, and down: ours
        self._killed(at, restart)
        if restart and self.phase != "failed":  # a restart refused meanwhile is not waited for
            self._deadline = at + self.rules.restart_timeout
        return []

    def _killed(self, at: float, restart: bool) -> None:
        self.kills = (*(t for t in self.kills if at - t <= self.rules.kill_budget_window), at)
        self._killed_at, self._restarting = at, restart

    def _said(self, transition: Stalled | Unresponsive | CanaryUnanswered, now: float) -> Transition:
        """A transition the policy may kill for: where its setting may ask a real kill, its outcome is awaited
        from now (until then, for a bounded time, its processes going is neither an exit nor ours)."""
        if self.rules.kill_silence if isinstance(transition, Unresponsive | CanaryUnanswered) else \
                self.rules.kill_stall:
            self._kill_asked = now
        return transition

    def _awaiting(self, now: float) -> bool:
        """A kill's outcome is awaited, within the bound (module docstring)."""
        return self._kill_asked is not None and self._awaiting_since(self._kill_asked, now)

    def _awaiting_since(self, asked: float, now: float) -> bool:
        return now - asked < self.rules.kill_grace + KILL_SLACK + OUR_KILL_SLACK

    def _judge_pending(self) -> list[Exited | CrashLoop]:
        """The exits held pending are exits after all (each dated when it was seen)."""
        held, self._held = self._held, ()
        out: list[Transition] = []
        for gone in held:
            self._exited(exited(self._exits, gone, None, self.rules.kill_grace, self.rules.crash_loop_window), out)
        return out

    def resumed(self, since: float, killed: bool, restarting: bool, refused: bool) -> None:
        """gpuwarden restarted (or reloaded) while this engine was down (since `since`, killed by gpuwarden or not,
        a restart of gpuwarden's awaited, one that failed): down, as if this lifecycle had seen it go; back, or
        failed, as ever. The kill budget is not touched: a reload keeps it (`kept`), a restart reads it back
        (`killed_before`)."""
        self._down()
        if killed:
            self._killed_at, self._restarting = since, restarting
            self._deadline = since + self.rules.restart_timeout if restarting else None
        if refused:
            self.phase, self._deadline, self.restart_refused = "failed", None, True

    def resumed_stuck(self, stalled: bool, unresponsive: bool) -> None:
        """gpuwarden (re)started while this engine was stalled or unresponsive (its open conditions): they end as
        a live one ends, on evidence this lifecycle sees: progress (tokens processed since its first look; for a
        stall, no request running either) ends them, its processes gone at the first look is an exit, a stall
        found again is a stall (and the stall detector owns it from then)."""
        self._stuck = frozenset(name for name, is_open in (("stalled", stalled), ("unresponsive", unresponsive))
                                if is_open)

    def killed_before(self, at: float) -> None:
        """A real kill the last gpuwarden made (read back from the store at a start): it counts in the budget."""
        self.kills = tuple(sorted((*self.kills, at)))

    def suspect(self, now: float, reason: str) -> bool:
        """A fault with no owner on its GPU: judged on the floor, and one canary, for `suspicion` seconds. False
        when already under suspicion (a storm of faults extends it and is said once)."""
        new = not self.suspected(now)
        self._suspect_until = now + self.rules.suspicion
        if new:
            self.suspicion, self._suspect_due = reason, True
        return new

    def suspected(self, now: float) -> bool:
        return now < self._suspect_until

    def restart_failed(self) -> None:
        """Asking its supervisor to start it failed: nothing to wait for."""
        self.phase, self._deadline, self.restart_refused = "failed", None, True

    def kept(self, earlier: Lifecycle) -> None:
        """A reload: how often it was killed, whether a restart failed, and a kill's outcome awaited (a kill
        under way is counted), outlive the new configuration."""
        self.kills, self.restart_refused = earlier.kills, earlier.restart_refused
        self._kill_asked = earlier._kill_asked

    @property
    def answered(self) -> float | None:
        """When this instance last answered (for the status page)."""
        return self._answered

    @property
    def failures(self) -> int:
        """Failed scrapes in a row."""
        return self._failures

    @property
    def unresponsive(self) -> bool:
        return self._unresponsive

    @property
    def awaits_start(self) -> bool:
        """A start is being timed (a restart of ours, or its supervisor's): not back by then is restart_failed."""
        return self._deadline is not None

    @property
    def in_grace(self) -> bool:
        """Down or starting: no figure of the dead instance counts, and none of the new one yet."""
        return self.phase in ("down", "starting")

    # --- each look ---------------------------------------------------------------------------------

    def observe(self, look: Look) -> list[Transition]:
        out: list[Transition] = []
        if self._held and not self._awaiting(look.now):  # no outcome within the bound: exits after all
            out += self._judge_pending()
        if look.processes is not None:
            self._processes(look.processes, look.now, out)
        self._since = self._since if self._since is not None else look.now  # an engine hung before we came counts
        if self._deadline is not None and self.in_grace and look.now >= self._deadline:
            waited = look.now - (self._killed_at if self._restarting else self._since)
            if self.phase == "starting" and self.misconfigured is not None and self._answered is not None:
                out.append(Unproven(waited, self.misconfigured))  # it may serve: nothing here says otherwise
                self.phase, self._deadline = "unproven", None
            else:
                out.append(RestartFailed(waited, self._restarting, self.phase == "starting"))
                self.restart_refused = self.restart_refused or self._restarting
                self.phase, self._deadline = "failed", None
        if look.sample is None:
            self._failed(look, out)
        else:
            self._answered_with(look, out)
            self._canaries_due(look, out)
        return out

    def _canaries_due(self, look: Look, out: list[Transition]) -> None:
        if self.phase != "watching":
            return
        if self._suspect_due:  # beside the scrapes: a stall meanwhile is still seen within the floor
            self._suspect_due, self._asked = False, look.now
            out.append(SuspectCanaryDue(look.sample, self.epoch))
            return
        every = self.rules.idle_canary_every
        if not every or self._idle_out or look.now - self._asked < every:
            return
        first, progressed = self._idle_progress is None, look.sample.progress != self._idle_progress
        self._idle_progress = look.sample.progress
        if first or progressed:
            self._asked = look.now
            return
        self._idle_progress, self._asked = None, look.now  # the canary's own request moves the counter
        self._idle_out = True
        out.append(IdleCanaryDue(look.sample, self.epoch))

    def stall_canaried(self, confirm: ConfirmStall, result: CanaryResult, now: float) -> list[Transition]:
        """The answer to a ConfirmStall: a completion denies the log's word; a canary that could not ask (refused,
        or its route or model not found) confirms nothing, and is said; anything else confirms it."""
        if result.outcome == "misconfigured":
            return self._refused(result)
        if result.outcome == "ok":
            self.misconfigured = None
            return [StallDenied(confirm.verdict, result)]
        return [self._said(Stalled(confirm.verdict, confirm.spinning, result), now)]

    def _refused(self, result: CanaryResult) -> list[Transition]:
        """A canary that cannot authenticate (or finds no route or model): said once, until one completes."""
        new, self.misconfigured = self.misconfigured is None, result
        return [CanaryMisconfigured(result)] if new else []

    def idle_canaried(self, due: IdleCanaryDue, result: CanaryResult, now: float) -> list[Transition]:
        self._idle_out = False
        if due.epoch != self.epoch or self.phase != "watching":
            return []  # killed or gone meanwhile: an answer of the instance before judges nothing
        if result.outcome == "misconfigured":
            return self._refused(result)
        if result.outcome == "ok":
            self.misconfigured = None
        if result.outcome == "timeout" and not self.canary_failed:
            self.canary_failed = True
            return [self._said(CanaryUnanswered(result, due.sample), now)]
        if result.outcome == "ok" and self.canary_failed:
            self.canary_failed = False
            return [CompletesAgain()]
        return []

    def suspect_canaried(self, due: SuspectCanaryDue, result: CanaryResult, after: EngineSample | None,
                         now: float) -> list[Transition]:
        """`after`: a scrape once a timed-out canary returned (None: none, or it failed). A canary a long prefill
        holds back is no hang: work shown meanwhile eases the suspicion."""
        if due.epoch != self.epoch or self.phase != "watching" or not self._instance:
            return []  # killed or gone meanwhile: nothing left to judge
        if result.outcome == "misconfigured":
            return self._refused(result)
        if result.outcome != "timeout":
            return [SuspicionEased(result, False)]
        before = due.before
        if after is not None and (after.progress != before.progress or after.activity != before.activity):
            return [SuspicionEased(result, True)]
        self.canary_failed = True
        return [self._said(CanaryUnanswered(result, before), now)]

    def canaried(self, result: CanaryResult, now: float, due: CanaryDue | None = None) -> list[Transition]:
        """The answer to a CanaryDue: a completion (or, with the canary off, the answer itself) means back; a
        refusal is said once. An answer for an instance gone meanwhile judges nothing."""
        if due is None or due.epoch == self.epoch:
            self._start_out = False
        if (due is not None and due.epoch != self.epoch) or self.phase not in _UNPROVEN:
            return []
        if result.outcome == "misconfigured":
            return self._refused(result)
        if result.outcome not in ("ok", "off"):
            return []
        if result.outcome == "ok":
            self.misconfigured = None
        return [self._back(now, result)]

    def _back(self, now: float, canary: CanaryResult | None, tokens: float = 0.0, serving: float = 0.0) -> Back:
        """Proven back: judged as any running instance from now, and whoever started it, a failed restart
        before is forgotten (a later stall is killed and restarted again)."""
        back = Back(now - self._killed_at if self._killed_at is not None else None, now - self._since, canary,
                    tokens, serving)
        self.phase, self._deadline, self._restarting, self.restart_refused = "watching", None, False, False
        return back

    def _processes(self, current: Instance, now: float, out: list[Transition]) -> None:
        first, self._looked = not self._looked, True
        if first and self._stuck and not current and self.phase == "watching":
            self._stuck = frozenset()  # it was stuck when gpuwarden stopped: it exited since
            self._gone(now, out)
            return
        if self._instance and not self._instance & current:  # every process of the instance is gone
            self._instance = frozenset()
            self._gone(now, out)
        if current and not self._instance:
            self._instance = current
            if self.phase == "down" or (self.phase == "failed" and not first):
                self._start(now, current, out)
            elif not first and self.phase == "watching":
                # an engine that was not running (its first start): its silence and its tries count from now
                self._since, self._failures = now, 0
        else:
            self._instance |= current  # a worker it forked belongs to it

    def _gone(self, now: float, out: list[Transition]) -> None:
        exits = exited(self._exits, now, self._killed_at, self.rules.kill_grace, self.rules.crash_loop_window)
        if exits is None:
            return  # our kill
        if not self._restarting:  # a restart of ours that dies while it loads still has its deadline
            self._killed_at, self._deadline = None, None
        if self._awaiting(now):
            self._held += (now,)  # whose doing this is, the kill's outcome says
        else:
            self._exited(exits, out)
        self._down()

    def _exited(self, exits: tuple[float, ...], out: list[Transition]) -> None:
        self._exits = exits
        out.append(Exited(len(exits)))
        if len(exits) >= self.rules.crash_loop_exits:
            out.append(CrashLoop(len(exits)))
            self._exits = ()

    def _down(self) -> None:
        self.phase, self.epoch = "down", self.epoch + 1
        self._forget()

    def _start(self, now: float, current: Instance, out: list[Transition]) -> None:
        self.phase, self._since, self._canary_at, self._start_out = "starting", now, -1e18, False
        if self._deadline is None:  # a start its supervisor made: it is given as long as a restart of ours
            self._deadline = now + self.rules.restart_timeout
        self._forget()
        out.append(Starting(len(current)))

    def _forget(self) -> None:
        """Nothing of the dead instance is held against the next one."""
        self.detector, self.sample, self._answered = self._new_detector(), None, None
        self._failures, self._unresponsive, self._first_answer, self._silent = 0, False, None, False

    def _failed(self, look: Look, out: list[Transition]) -> None:
        if self.in_grace:
            return  # loading: 503, no /metrics yet
        self._failures += 1
        if self._failures >= self.rules.unresponsive_after and not self._silent:
            self._silent = True
            out.append(Silent(self._failures))
        silent_for = look.now - (self._answered if self._answered is not None else self._since)
        if (self._failures >= self.rules.unresponsive_after and self._instance and not self._unresponsive
                and not self._awaiting(look.now)  # silent while a kill's outcome is awaited: the kill at work
                and silent_for >= self.detector.threshold(look.spinning, self.suspected(look.now))):
            self._unresponsive = True
            out.append(self._said(Unresponsive(silent_for, self._failures, self.sample), look.now))

    def _answered_with(self, look: Look, out: list[Transition]) -> None:
        if self._silent or self._unresponsive:
            out.append(Answers(self._unresponsive))
        self._failures, self._unresponsive, self._silent, self._answered = 0, False, False, look.now
        if self.phase in _UNPROVEN:
            self.sample = look.sample  # its own figures; judged once it is back (failed, unproven: as ever)
            if back := self._progressed(look):
                out.append(back)
                self._judge(look, out)  # judged from this look on, as any running instance
                return
            if not self._start_out and look.now - self._canary_at >= self.rules.canary_every:
                self._canary_at = self._asked = look.now
                self._start_out = True
                out.append(CanaryDue(self.epoch))
            if self.phase == "starting":
                return
        if self.phase == "down":
            return  # the old instance still answers while it dies: nothing to judge
        self._judge(look, out)

    def _progressed(self, look: Look) -> Back | None:
        """Back, when its progress counter moved since it first answered: tokens it processed are proof that it
        serves (a canary that cannot authenticate, an engine whose users keep it busy, need nothing else). Not
        where progress is read from its log: that is the engine's word alone, and lines of the dead instance
        read late would pass for the new one's; there only a completion proves it."""
        progress = look.sample.progress
        if progress is None or self.rules.confirm_stall:
            return None
        first = self._first_answer
        if first is None or progress < first[0]:  # a counter that went down counts again from there
            self._first_answer = (progress, look.now)
            return None
        if progress == first[0]:
            return None
        return self._back(look.now, None, progress - first[0], look.now - first[1])

    def _judge(self, look: Look, out: list[Transition]) -> None:
        self.sample = look.sample
        verdict = self.detector.observe(look.sample, look.now, look.spinning, self.suspected(look.now))
        out.append(Judged(verdict))
        if self._stuck:
            self._still_stuck(look.sample, verdict, out)
        if not verdict.new:
            return
        if not verdict.stalled:
            out.append(Progressing())
        elif self.rules.confirm_stall:
            self._asked = look.now
            out.append(ConfirmStall(verdict, look.spinning))
        else:
            out.append(self._said(Stalled(verdict, look.spinning), look.now))

    def _still_stuck(self, sample: EngineSample, verdict: Verdict, out: list[Transition]) -> None:
        """A stall or unresponsiveness open when gpuwarden started, judged on what this lifecycle has seen since
        (the first look is only the counter to compare with): the live transition that ends it, once."""
        if verdict.stalled:
            self._stuck -= {"stalled"}  # stalled still: the detector's Stalled, and its Progressing later
            return
        if sample.progress is None or sample.running is None:
            return  # the engine does not say
        if self._stuck_progress is None:
            self._stuck_progress = sample.progress
            return
        moved = sample.progress > self._stuck_progress
        if "stalled" in self._stuck and (moved or sample.running <= 0):
            self._stuck -= {"stalled"}
            out.append(Progressing())
        if "unresponsive" in self._stuck and moved:
            self._stuck -= {"unresponsive"}
            out.append(CompletesAgain())
