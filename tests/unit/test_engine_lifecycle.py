"""The engine lifecycle, pure: looks with the time passed in, transitions out. A restarted engine is a new
instance, judged only by its own figures; it is back once a real completion returns."""

import pytest

from gpuwarden.engine.canary import CanaryResult
from gpuwarden.engine.lifecycle import (
    Answers,
    Back,
    CanaryDue,
    CanaryMisconfigured,
    CompletesAgain,
    ConfirmStall,
    CrashLoop,
    Exited,
    IdleCanaryDue,
    Judged,
    Lifecycle,
    Look,
    Progressing,
    RestartFailed,
    Rules,
    Silent,
    Stalled,
    Starting,
    SuspectCanaryDue,
    Unproven,
    Unresponsive,
)
from gpuwarden.engine.metrics import EngineSample
from gpuwarden.engine.stall import StallDetector

OLD = frozenset({(100, 1.0), (101, 1.5)})  # the first instance: pids and start times
NEW = frozenset({(200, 500.0)})
SAME_PID_NEW_START = frozenset({(100, 600.0)})  # a pid reused by a new process is a new instance
OK = CanaryResult("ok", 0.4, "a token in 0.4 s")
REFUSED = CanaryResult("misconfigured", 0.01, "HTTP 401: set canary_api_key_file")


def sample(running, progress):
    return EngineSample("vllm", running, 0.0, progress, progress, False, None)


def life(**rules):
    return Lifecycle(Rules(**{"unresponsive_after": 3, "kill_grace": 2.0, "crash_loop_exits": 3,
                              "crash_loop_window": 600.0, "restart_timeout": 100.0, "canary_every": 5.0, **rules}),
                     lambda: StallDetector(4.0, 10.0, 60.0))


def kinds(transitions):
    return [type(t) for t in transitions if not isinstance(t, Judged)]


def looks(lc, start, end, sample_=None, processes=OLD, step=1.0):
    """One look a second from `start` to `end` (excluded), all transitions."""
    out, t = [], start
    while t < end:
        out += lc.observe(Look(t, sample_, processes))
        t += step
    return out


def stalled_engine(lc, until=20.0):
    looks(lc, 0, 1, sample(4, 100))
    return looks(lc, 1, until, sample(4, 100))


def test_a_stall_and_its_end_are_said_once_each():
    lc = life()
    out = stalled_engine(lc)
    assert kinds(out) == [Stalled]
    assert kinds(lc.observe(Look(20, sample(4, 101), OLD))) == [Progressing]


def test_unresponsive_counts_from_its_last_answer_and_is_said_once():
    lc = life()
    looks(lc, 0, 1, sample(2, 100))
    out = looks(lc, 1, 30, None)
    assert kinds(out) == [Silent, Unresponsive]
    unresponsive = next(t for t in out if isinstance(t, Unresponsive))
    assert unresponsive.silent_for == 10.0 and unresponsive.last.running == 2
    assert kinds(lc.observe(Look(30, sample(0, 100), OLD))) == [Answers]


def test_an_engine_without_processes_is_never_unresponsive():
    lc = life()
    assert kinds(looks(lc, 0, 30, None, processes=frozenset())) == [Silent]


def test_our_kill_is_no_exit_and_the_dead_instances_figures_go_with_it():
    lc = life()
    stalled_engine(lc)
    lc.killing(20.0, restart=True)
    assert lc.in_grace and lc.sample is None and lc.kills == (20.0,)
    assert kinds(lc.observe(Look(21, None, frozenset()))) == []  # gone by our kill: not news


def test_a_restarted_engine_loading_for_60_s_is_not_judged_and_is_back_after_a_completion():
    """The H200 case: the old instance had 4 requests running and stalled; the new one answers 503 while it
    loads. Nothing of the old one counts and nothing during start-up is held against the new one."""
    lc = life()
    stalled_engine(lc)
    lc.killing(20.0, restart=True)
    lc.observe(Look(21, None, frozenset()))
    out = lc.observe(Look(22, None, NEW))
    assert kinds(out) == [Starting]
    out = looks(lc, 23, 83, None, processes=NEW)  # 503 "Loading model" for 60 s: no stall, no unresponsive
    assert kinds(out) == []
    out = lc.observe(Look(83, sample(0, 0), NEW))  # its own first answer: a counter at 0 is not "went down"
    assert kinds(out) == [CanaryDue] and lc.sample.running == 0
    assert lc.canaried(CanaryResult("error", 0.1, "HTTP 503"), 83.2) == []  # not yet
    assert kinds(looks(lc, 84, 89, sample(0, 0), processes=NEW)) == [CanaryDue]  # every canary_every
    [back] = lc.canaried(OK, 88.5)
    assert isinstance(back, Back) and back.since_kill == 68.5 and back.since_start == 66.5
    assert lc.phase == "watching"
    # judged afresh, by its own figures: running with progress is fine; its own stall is one
    out = looks(lc, 89, 95, sample(1, 10), processes=NEW)
    assert kinds(out) == []
    assert kinds(looks(lc, 95, 110, sample(1, 10), processes=NEW)) == [Stalled]


def test_unresponsive_of_a_new_instance_never_counts_time_before_it_started():
    lc = life(restart_timeout=30.0)
    looks(lc, 0, 5, sample(4, 100))
    lc.killing(5.0, restart=True)
    lc.observe(Look(6, None, NEW))
    out = looks(lc, 7, 36, None, processes=NEW)
    assert kinds(out) == [RestartFailed]
    # past its start-up it is judged as any engine, from its own start (t=6), with no requests of the dead one
    out = looks(lc, 36, 50, None, processes=NEW)
    [unresponsive] = [t for t in out if isinstance(t, Unresponsive)]
    assert unresponsive.last is None and unresponsive.silent_for >= 10 and unresponsive.silent_for <= 44 - 6 + 1


def test_a_restart_that_never_serves_fails_once_and_is_never_restarted_again():
    lc = life()
    stalled_engine(lc)
    lc.killing(20.0, restart=True)
    out = looks(lc, 21, 140, sample(0, 0), processes=frozenset())  # no process ever starts
    failed = [t for t in out if isinstance(t, RestartFailed)]
    assert len(failed) == 1 and failed[0].by_us and not failed[0].started and failed[0].waited == 100.0
    assert lc.restart_refused and lc.phase == "failed"


def test_a_restart_its_supervisor_could_not_start_is_not_waited_for():
    lc = life()
    stalled_engine(lc)
    lc.killing(20.0, restart=True)
    lc.restart_failed()
    assert lc.restart_refused and kinds(looks(lc, 21, 200, None, processes=frozenset())) == [Silent]


def test_an_exit_restarted_by_its_own_supervisor_gets_the_same_grace_and_is_back():
    lc = life()
    looks(lc, 0, 5, sample(2, 100))
    out = lc.observe(Look(5, None, NEW))  # between two looks: the old processes gone, new ones there
    assert kinds(out) == [Exited, Starting]
    assert kinds(looks(lc, 6, 60, None, processes=NEW)) == []
    assert kinds(lc.observe(Look(60, sample(0, 0), NEW))) == [CanaryDue]
    [back] = lc.canaried(OK, 61)
    assert back.since_kill is None and back.since_start == 56


def test_a_pid_reused_by_a_new_process_is_a_new_instance_and_forked_workers_are_not():
    lc = life()
    looks(lc, 0, 2, sample(0, 100))
    assert kinds(lc.observe(Look(2, sample(0, 100), OLD | {(102, 2.0)}))) == []  # a worker it forked
    assert kinds(lc.observe(Look(3, None, SAME_PID_NEW_START))) == [Exited, Starting]


def test_exits_within_the_window_make_a_crash_loop():
    lc = life()
    transitions = []
    for i in range(3):
        transitions += lc.observe(Look(10.0 * i, None, frozenset({(300 + i, float(i))})))
        transitions += lc.observe(Look(10.0 * i + 5, None, frozenset()))
    assert kinds(transitions) == [Exited, Starting, Exited, Starting, Exited, CrashLoop]


def test_a_kill_without_restart_then_a_supervisor_start_is_back_or_fails_by_its_own_start():
    lc = life(restart_timeout=20.0)
    looks(lc, 0, 2, sample(1, 1))
    lc.killing(2.0, restart=False)
    assert kinds(looks(lc, 3, 50, None, processes=frozenset())) == []  # nothing restarts it: no deadline
    lc.observe(Look(50, None, NEW))
    [failed] = [t for t in looks(lc, 51, 80, None, processes=NEW) if isinstance(t, RestartFailed)]
    assert not failed.by_us and failed.started and not lc.restart_refused


def test_a_fresh_lifecycle_resumed_down_sees_the_engines_return_as_back():
    """gpuwarden restarted between the kill (t=20, its stored engine_down) and the engine's return: a fresh
    lifecycle told so finds the new instance starting (at its first look, or later), and back after a real
    completion, timed from the kill; a fresh one not told would take it for an engine that was always there."""
    for first in (frozenset(), NEW):
        lc = life()
        lc.resumed(20.0, killed=True, restarting=True, refused=False)
        assert lc.in_grace
        out = lc.observe(Look(40, None, first)) + lc.observe(Look(41, None, NEW))
        assert kinds(out) == [Starting]
        assert kinds(lc.observe(Look(50, sample(0, 0), NEW))) == [CanaryDue]
        [back] = lc.canaried(OK, 51)
        assert back.since_kill == 31
    untold = life()
    assert kinds([*untold.observe(Look(40, None, NEW)), *untold.observe(Look(50, sample(0, 0), NEW))]) == []
    failed = life()
    failed.resumed(20.0, killed=True, restarting=True, refused=True)  # its restart had failed: never again
    assert failed.restart_refused and kinds(looks(failed, 21, 200, None, processes=frozenset())) == [Silent]
    exited = life()
    exited.resumed(20.0, killed=False, restarting=False, refused=False)  # it died by itself: its supervisor's
    assert kinds(exited.observe(Look(30, None, NEW))) == [Starting]
    [back] = exited.canaried(OK, 31)
    assert back.since_kill is None  # "back 1 s after it started again", not after a kill


def resumed(stalled=True, unresponsive=False):
    lc = life()
    lc.resumed_stuck(stalled, unresponsive)
    return lc


def test_a_stall_open_at_a_start_ends_only_on_progress_seen_since():
    lc = resumed()
    assert kinds(lc.observe(Look(0, sample(4, 100), OLD))) == []  # the first look: only what to compare with
    assert kinds(lc.observe(Look(1, sample(4, 100), OLD))) == []  # nothing moved: not ended
    assert kinds(lc.observe(Look(2, sample(4, 103), OLD))) == [Progressing]  # said once
    assert kinds(looks(lc, 3, 8, sample(4, 103))) == []
    idle = resumed()
    assert kinds([*idle.observe(Look(0, sample(4, 100), OLD)), *idle.observe(Look(1, sample(0, 100), OLD))]) \
        == [Progressing]  # nothing running: nothing stalled, as live


def test_a_stall_open_at_a_start_that_still_holds_is_a_stall_again_and_its_end_is_said_once():
    lc = resumed()
    assert kinds(stalled_engine(lc)) == [Stalled]  # the policy acts on it; its open condition gains the cause
    assert kinds(lc.observe(Look(20, sample(4, 101), OLD))) == [Progressing]


def test_an_engine_stuck_at_a_start_and_gone_at_its_first_look_has_exited():
    lc = resumed(stalled=True, unresponsive=True)
    assert kinds(lc.observe(Look(0, None, frozenset()))) == [Exited]  # its exit ends both (conditions.RESOLVES)
    assert kinds(resumed(False, False).observe(Look(0, None, frozenset()))) == []  # an engine not running: no news


def test_an_unresponsive_engine_at_a_start_ends_once_it_completes_work():
    lc = resumed(stalled=False, unresponsive=True)
    assert kinds([*lc.observe(Look(0, sample(0, 100), OLD)), *lc.observe(Look(1, sample(0, 100), OLD))]) == []
    assert kinds(lc.observe(Look(2, sample(1, 104), OLD))) == [CompletesAgain]  # answering alone proves nothing


def test_a_reload_keeps_kills_and_a_failed_restart():
    lc = life()
    lc.killing(1.0, restart=True)
    lc.restart_failed()
    new = life()
    new.kept(lc)
    assert new.kills == (1.0,) and new.restart_refused


def test_a_start_counts_the_kills_read_back_and_the_next_kill_keeps_them():
    lc = life()
    lc.killed_before(30.0)
    lc.killed_before(10.0)
    assert lc.kills == (10.0, 30.0)
    lc.killing(3620.0, restart=False)  # the kill at 10 s left its window (3600 s)
    assert lc.kills == (30.0, 3620.0)


# --- the canaries it decides, as a table: inputs in order, and the transitions each returns -------------------

TIMEOUT = CanaryResult("timeout", 5.0, "no token within 5 s")


def answer(lc, due, result, after):
    if isinstance(due, ConfirmStall):
        return lc.stall_canaried(due, result, 0.0)
    if isinstance(due, IdleCanaryDue):
        return lc.idle_canaried(due, result, 0.0)
    return lc.suspect_canaried(due, result, after, 0.0)


def run_script(lc, script):
    """Each step: ("look", t, sample) with OLD's processes, ("kill", t), ("suspect", t), or ("answer", result[,
    scrape after]) for the last due canary. Returns the kinds each step returned (a kill and a suspect: [])."""
    due, said = None, []
    for step in script:
        match step:
            case ("look", t, s):
                out = lc.observe(Look(t, s, OLD))
            case ("kill", t):
                lc.killing(t, restart=False)
                out = []
            case ("suspect", t):
                out = [] if lc.suspect(t, "an Xid with no owner") else ["already"]
            case ("answer", result, *after):
                out = answer(lc, due, result, after[0] if after else None)
        due = next((t for t in out if isinstance(t, ConfirmStall | IdleCanaryDue | SuspectCanaryDue)), due)
        said.append([t if isinstance(t, str) else type(t).__name__ for t in out if not isinstance(t, Judged)])
    return said


LOG_STALL = [("look", t, sample(2, 100)) for t in range(12)]  # stalled at t=11: 10 s past the floor
CANARIES = {
    "a stall read from a log is said only once a canary does not complete": (
        {"confirm_stall": True}, [*LOG_STALL, ("answer", TIMEOUT)],
        [[]] * 11 + [["ConfirmStall"], ["Stalled"]]),
    "a completion denies the log's word": (
        {"confirm_stall": True}, [*LOG_STALL, ("answer", OK)], [[]] * 11 + [["ConfirmStall"], ["StallDenied"]]),
    "a stall read from metrics needs no canary": ({}, LOG_STALL, [[]] * 11 + [["Stalled"]]),
    "no progress: asked every idle_canary_every; a timeout is said once, a completion ends it": (
        {"idle_canary_every": 10.0},
        [("look", 0, sample(0, 7)), ("look", 10, sample(0, 7)), ("answer", TIMEOUT), ("look", 20, sample(0, 7)),
         ("look", 30, sample(0, 7)), ("answer", TIMEOUT), ("look", 40, sample(0, 7)), ("look", 50, sample(0, 7)),
         ("answer", OK)],
        [[], ["IdleCanaryDue"], ["CanaryUnanswered"], [], ["IdleCanaryDue"], [], [], ["IdleCanaryDue"],
         ["CompletesAgain"]]),
    "an idle canary runs beside the scrapes: while one is out no second is asked": (
        {"idle_canary_every": 10.0},
        [("look", 0, sample(0, 7)), ("look", 10, sample(0, 7)), ("look", 20, sample(0, 7)),
         ("look", 30, sample(0, 7)), ("answer", TIMEOUT), ("look", 40, sample(0, 7)), ("look", 50, sample(0, 7))],
        [[], ["IdleCanaryDue"], [], [], ["CanaryUnanswered"], [], ["IdleCanaryDue"]]),
    "our kill while an idle canary is out: its answer judges nothing": (
        {"idle_canary_every": 10.0},
        [("look", 0, sample(0, 7)), ("look", 10, sample(0, 7)), ("kill", 11), ("answer", TIMEOUT)],
        [[], ["IdleCanaryDue"], [], []]),
    "an engine that progresses is never asked": (
        {"idle_canary_every": 10.0}, [("look", t, sample(1, t)) for t in range(0, 60, 10)], [[]] * 6),
    "a suspicion asks once at the next answer; a timeout with no work shown is unresponsive": (
        {}, [("look", 0, sample(1, 5)), ("suspect", 1), ("suspect", 2), ("look", 3, sample(1, 6)),
             ("look", 4, sample(1, 6)), ("answer", TIMEOUT, sample(1, 6))],
        [[], [], ["already"], ["SuspectCanaryDue"], [], ["CanaryUnanswered"]]),
    "a suspicion's canary held back by work shown meanwhile (a long prefill) eases it": (
        {}, [("look", 0, sample(1, 5)), ("suspect", 1), ("look", 3, sample(1, 6)), ("answer", TIMEOUT, sample(1, 9))],
        [[], [], ["SuspectCanaryDue"], ["SuspicionEased"]]),
    "a suspicion's canary that returns eases it": (
        {}, [("look", 0, sample(1, 5)), ("suspect", 1), ("look", 3, sample(1, 6)), ("answer", OK)],
        [[], [], ["SuspectCanaryDue"], ["SuspicionEased"]]),
    "our kill while the suspicion's canary runs: its answer judges nothing (the kill is learnt, not read back)": (
        {}, [("look", 0, sample(1, 5)), ("suspect", 1), ("look", 3, sample(1, 6)), ("kill", 4), ("answer", TIMEOUT)],
        [[], [], ["SuspectCanaryDue"], [], []]),
    "a suspicion ends after `suspicion` seconds: a new fault is news again": (
        {"suspicion": 300.0}, [("suspect", 0), ("suspect", 299), ("suspect", 600)], [[], ["already"], []]),
}


@pytest.mark.parametrize("rules, script, expected", list(CANARIES.values()), ids=list(CANARIES))
def test_the_canaries_it_decides(rules, script, expected):
    assert run_script(life(**rules), script) == expected


def test_a_suspicions_canary_that_outlives_the_instance_it_asked_judges_nothing():
    """Killed, restarted and back before the canary answers: its timeout is the dead instance's, not the new one's
    (the lifecycle knows its own kill; nobody reads a kill list back)."""
    lc = life()
    looks(lc, 0, 2, sample(1, 5))
    lc.suspect(2.0, "an Xid with no owner")
    [due] = [t for t in lc.observe(Look(3, sample(1, 6), OLD)) if isinstance(t, SuspectCanaryDue)]
    lc.killing(4.0, restart=True)
    lc.observe(Look(5, None, frozenset()))
    assert kinds(lc.observe(Look(6, sample(0, 0), NEW))) == [Starting, CanaryDue]
    [back] = lc.canaried(OK, 7)
    assert isinstance(back, Back) and lc.phase == "watching"
    assert lc.suspect_canaried(due, TIMEOUT, sample(1, 6), 0.0) == []


# --- a stall's kill, learnt from its outcome -----------------------------------------------------------------

GRACE = 2.0  # life()'s kill_grace
BOUND = GRACE + 30.0 + 10.0  # kill_grace + policy.KILL_SLACK + policy.OUR_KILL_SLACK


def stalled_at(lc) -> float:
    """Feeds looks until the stall is said; its time (the kill's, once one is learnt)."""
    looks(lc, 0, 1, sample(4, 100))
    t = 1.0
    while not any(isinstance(x, Stalled) for x in lc.observe(Look(t, sample(4, 100), OLD))):
        t += 1.0
    return t


def test_a_stalls_processes_going_before_its_kill_is_learnt_are_held_then_ours():
    """The actuator kills the target the stall's report carried; its processes are gone at the next look, before
    engine_killed comes back through the hub: no exit is said, and the kill learnt makes it ours, timed from the
    stall (the budget counts it once; the restart's deadline and the time to back run from it)."""
    lc = life(kill_stall=True)
    at = stalled_at(lc)
    assert kinds(lc.observe(Look(at + 3, None, frozenset()))) == []  # pending: neither an exit nor ours
    assert lc.in_grace and lc.kills == ()
    assert lc.learned(True, restart=True, now=at + 4) == []
    assert lc.kills == (at,)
    assert kinds(lc.observe(Look(at + 5, None, NEW))) == [Starting]
    assert kinds(lc.observe(Look(at + 20, sample(0, 0), NEW))) == [CanaryDue]
    [back] = lc.canaried(OK, at + 21)
    assert back.since_kill == 21
    assert lc.learned(True, restart=True, now=at + 22) == [] and lc.kills == (at,)  # one outcome, one kill


def test_an_engine_silent_while_its_stalls_kill_is_awaited_is_the_kill_working_not_a_second_trouble():
    """The kill's signals took its HTTP server; one process survives (stuck in the driver) while the actuator
    waits: the scrapes fail with a process alive, which is the kill at work, not an unresponsive engine to kill
    again (it was paged as a second 'killing' with its own decision). Once the outcome is learnt and it was no
    kill (refused), no answer is judged as ever."""
    lc = life(kill_stall=True)
    at = stalled_at(lc)
    survivor = frozenset({(101, 1.5)})
    assert Unresponsive not in kinds(looks(lc, at + 1, at + 20, None, processes=survivor))
    lc.learned(False, restart=False, now=at + 20)
    assert Unresponsive in kinds(looks(lc, at + 21, at + 40, None, processes=survivor))


def test_a_kill_learnt_before_its_processes_go_makes_their_going_ours():
    lc = life(kill_stall=True)
    at = stalled_at(lc)
    lc.learned(True, restart=False, now=at + 1)
    assert lc.in_grace and lc.kills == (at,)
    assert kinds(lc.observe(Look(at + 2, None, frozenset()))) == []


def test_a_refused_or_dry_kill_leaves_an_exit_an_exit():
    lc = life(kill_stall=True)
    at = stalled_at(lc)
    assert kinds(lc.observe(Look(at + 1, None, frozenset()))) == []
    assert kinds(lc.learned(False, restart=True, now=at + 2)) == [Exited]
    assert lc.kills == () and kinds(lc.observe(Look(at + 3, None, NEW))) == [Starting]


def test_no_outcome_within_the_bound_judges_the_exit_at_the_next_look():
    lc = life(kill_stall=True)
    at = stalled_at(lc)
    assert kinds(lc.observe(Look(at + 1, None, frozenset()))) == []
    assert kinds(looks(lc, at + 2, at + BOUND, None, processes=frozenset())) == []
    assert kinds(lc.observe(Look(at + BOUND, None, frozenset()))) == [Exited]
    # a real kill learnt too late to make its going ours still counts toward the budget (once)
    assert lc.learned(True, restart=False, now=at + BOUND + 1) == [] and lc.kills == (at,)
    assert kinds(lc.observe(Look(at + BOUND + 2, None, NEW))) == [Starting]


def test_an_exit_past_the_bound_is_an_exit_at_once():
    lc = life(kill_stall=True)
    at = stalled_at(lc)
    looks(lc, at + 1, at + BOUND, sample(4, 100))
    assert kinds(lc.observe(Look(at + BOUND, None, frozenset()))) == [Exited]


def test_a_stall_its_setting_never_kills_holds_no_exit():
    lc = life()  # on_stall = "alert", or a dry run: no kill's outcome to await
    at = stalled_at(lc)
    assert kinds(lc.observe(Look(at + 1, None, frozenset()))) == [Exited]


def test_a_faults_kill_told_before_its_signals_is_counted_once():
    lc = life(kill_stall=True)
    at = stalled_at(lc)
    lc.killing(at + 1, restart=False)  # a fault's kill took the engine first (take)
    assert lc.learned(True, restart=False, now=at + 2) == [] and lc.kills == (at + 1,)


def test_a_silent_engines_kill_is_awaited_too():
    lc = life(kill_silence=True)
    looks(lc, 0, 1, sample(2, 100))
    assert kinds(looks(lc, 1, 30, None)) == [Silent, Unresponsive]
    assert kinds(lc.observe(Look(30, None, frozenset()))) == []
    assert kinds(lc.learned(False, restart=False, now=31)) == [Exited]


def restarted(lc, at=20.0):
    """Stalled, killed for a restart at `at`, and a new instance seen a second later."""
    stalled_engine(lc, at)
    lc.killing(at, restart=True)
    lc.observe(Look(at + 1, None, frozenset()))
    assert kinds(lc.observe(Look(at + 2, None, NEW))) == [Starting]


def answered(lc, start, end, sample_, result):
    """A look a second from `start` to `end`, each canary it asks for answered `result` at once."""
    out = []
    for t in range(start, end):
        for change in lc.observe(Look(t, sample_, NEW)):
            out.append(change)
            if isinstance(change, CanaryDue):
                out += lc.canaried(result, t + 0.1, change)
    return out


def test_a_new_instance_whose_canary_is_refused_is_back_by_its_tokens_and_its_stall_is_a_stall():
    """The canary gets 401 (an engine started with --api-key): said once, never "not back"; its own tokens
    prove it back, and from then it is judged as any instance."""
    lc = life()
    restarted(lc)
    [due] = lc.observe(Look(23, sample(2, 0), NEW))
    assert isinstance(due, CanaryDue)
    assert kinds(lc.canaried(REFUSED, 23.1, due)) == [CanaryMisconfigured]
    [back] = [t for t in lc.observe(Look(24, sample(2, 40), NEW)) if not isinstance(t, Judged)]
    assert isinstance(back, Back) and back.canary is None and back.tokens == 40 and back.serving == 1
    assert back.since_kill == 4 and lc.phase == "watching"
    out = [*looks(lc, 25, 31, sample(2, 80), processes=NEW)]  # moved at 25, then nothing with 2 running
    assert kinds(out) == []
    assert kinds(looks(lc, 31, 37, sample(2, 80), processes=NEW)) == [Stalled]  # threshold 10 s from 25
    # a later refusal (another instance) is not said again: one warning for one configuration problem
    lc.killing(37, restart=True)
    lc.observe(Look(38, None, frozenset()))
    lc.observe(Look(39, None, NEW | {(300, 39.0)}))
    [due] = lc.observe(Look(40, sample(0, 0), NEW | {(300, 39.0)}))
    assert lc.canaried(REFUSED, 40.1, due) == []


def test_a_starting_instance_that_answers_but_never_serves_is_reported_at_restart_timeout():
    lc = life()
    restarted(lc)
    # running, never a token, no completion: no stall while starting, and reported at restart_timeout
    out = answered(lc, 23, 130, sample(2, 0), CanaryResult("timeout", 3.0, "no token"))
    assert kinds(out).count(RestartFailed) == 1 and Stalled not in kinds(out)
    assert kinds(out).count(CanaryDue) > 10
    assert lc.restart_refused and lc.phase == "failed"


def test_a_refused_canary_and_no_progress_is_unproven_at_restart_timeout_never_a_failed_restart():
    lc = life()
    restarted(lc)
    out = answered(lc, 23, 130, sample(0, 0), REFUSED)  # idle: nothing proves it, nothing disproves it
    assert kinds(out).count(CanaryMisconfigured) == 1 and RestartFailed not in kinds(out)
    [unproven] = [t for t in out if isinstance(t, Unproven)]
    assert unproven.waited == 100 and unproven.canary == REFUSED
    assert not lc.restart_refused and lc.phase == "unproven"
    [back] = [t for t in lc.observe(Look(130, sample(1, 5), NEW)) if isinstance(t, Back)]  # its first user
    assert back.tokens == 5 and lc.phase == "watching"


def test_a_canary_answer_for_an_instance_gone_meanwhile_judges_nothing():
    lc = life()
    restarted(lc)
    [due] = lc.observe(Look(23, sample(0, 0), NEW))
    lc.killing(24, restart=True)
    assert lc.canaried(OK, 25, due) == [] and lc.phase == "down"


def test_a_manual_start_after_a_failed_restart_is_back_and_restartable_again():
    """The supervisor refused the restart (the flag: not restarted again); a person started it by hand: a
    confirmed back clears the flag, whoever started it, by a completion or by its tokens."""
    for proof in ("canary", "tokens"):
        lc = life()
        stalled_engine(lc)
        lc.killing(20.0, restart=True)
        lc.restart_failed()
        assert lc.restart_refused
        lc.observe(Look(21, None, frozenset()))
        assert kinds(lc.observe(Look(60, None, NEW))) == [Starting]
        [due] = lc.observe(Look(61, sample(1, 10), NEW))
        if proof == "canary":
            [back] = lc.canaried(OK, 61.5, due)
        else:
            [back] = [t for t in lc.observe(Look(62, sample(1, 30), NEW)) if isinstance(t, Back)]
        assert isinstance(back, Back) and not lc.restart_refused and lc.phase == "watching"


def test_refused_canaries_confirm_no_stall_and_are_said_once():
    lc = life(confirm_stall=True, idle_canary_every=5.0)
    [confirm] = [t for t in stalled_engine(lc) if isinstance(t, ConfirmStall)]
    assert kinds(lc.stall_canaried(confirm, REFUSED, 20)) == [CanaryMisconfigured]
    assert lc.stall_canaried(confirm, REFUSED, 21) == []  # no stall said, no kill asked: and said once
    assert lc._kill_asked is None


def test_an_engines_first_start_counts_its_tries_from_when_its_process_appeared():
    """Not running when gpuwarden began: 50 failed scrapes before its process existed are not its tries."""
    lc = life()
    looks(lc, 0, 50, None, processes=frozenset())
    out = looks(lc, 50, 70, None, processes=OLD)
    [unresponsive] = [t for t in out if isinstance(t, Unresponsive)]
    assert unresponsive.silent_for == 10 and unresponsive.failures == 11
    assert kinds(out) == [Unresponsive]  # its silence was said once already, before it existed
    assert kinds(lc.observe(Look(70, sample(0, 0), OLD))) == [Answers]


def test_progress_read_from_a_log_never_proves_a_new_instance_back():
    """The log is the engine's word alone (and the dead instance's last lines may come late): only a completion."""
    lc = life(confirm_stall=True)
    restarted(lc)
    [due] = lc.observe(Look(23, sample(2, 0), NEW))
    assert kinds(looks(lc, 24, 30, sample(2, 40), processes=NEW)) == [] and lc.phase == "starting"
    [back] = lc.canaried(OK, 30.5, due)
    assert back.canary is OK and lc.phase == "watching"
