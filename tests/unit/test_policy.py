"""The policy, pure: events and plain views in, typed actions out."""

from gpuwarden.model import Event, Severity
from gpuwarden.policy import EngineView, Hold, Kill, Quarantine, decide

GPU_A, GPU_B = "ffff:03:00.0", "ffff:83:00.0"
A = EngineView("a", frozenset({GPU_A}), "kill", "kill")
B = EngineView("b", frozenset({GPU_B}), "alert", "kill")
ANY = EngineView("any", None, "kill", "alert")
SEEN = frozenset({GPU_A, GPU_B})


def ev(kind, gpu=None, engine=None, severity=Severity.WARNING, **evidence):
    return Event(kind, severity, kind, 0.0, gpu=gpu, engine=engine, evidence=evidence)


def test_a_stall_kills_only_its_engine_and_only_when_configured_to():
    assert decide(ev("engine_stall", engine="a"), [A, B, ANY], SEEN) == [Kill("a", "stalled")]
    assert decide(ev("engine_stall", engine="b"), [A, B, ANY], SEEN) == []


def test_a_gpu_fault_kills_the_engines_on_that_gpu():
    assert decide(ev("sq_intr", gpu=GPU_A), [A, B], SEEN) == [Kill("a", f"kernel reported sq_intr on {GPU_A}")]
    assert decide(ev("page_fault", gpu=GPU_B), [A, B], SEEN) == [Kill("b", f"kernel reported page_fault on {GPU_B}")]


def test_unknown_gpus_and_faults_without_a_gpu_match_everything():
    both = EngineView("u", None, "kill", "kill")
    assert decide(ev("ring_timeout", gpu=GPU_A), [both], SEEN) == [
        Kill("u", f"kernel reported ring_timeout on {GPU_A}")]
    assert [k.engine for k in decide(ev("sq_intr"), [A, B, both], SEEN)] == ["a", "b", "u"]


def test_only_critical_xids_and_fault_kinds_count():
    assert decide(ev("xid", gpu=GPU_A, severity=Severity.CRITICAL), [A], SEEN) == [
        Kill("a", f"kernel reported xid on {GPU_A}")]
    assert decide(ev("xid", gpu=GPU_A, severity=Severity.WARNING), [A], SEEN) == []
    assert decide(ev("pcie_aer", gpu=GPU_A, severity=Severity.CRITICAL), [A], SEEN) == []


def test_history_never_acts():
    """Journal look-back and catch-up after a restart: alerted and reported, never acted on."""
    for event in (ev("engine_stall", engine="a"), ev("sq_intr", gpu=GPU_A), ev("engine_crash_loop", engine="a")):
        actions = decide(event.as_history(), [A], SEEN)
        assert actions and all(isinstance(a, Hold) and a.why.startswith("history") for a in actions)
        assert not event.as_history().live and event.live


def test_a_fault_on_a_gpu_this_machine_never_had_does_not_kill():
    """A test suite's or another box's fault line names a GPU that is not here."""
    everywhere = EngineView("u", None, "kill", "kill")  # its GPUs unknown: any GPU's fault would match
    [hold] = decide(ev("sq_intr", gpu="0000:03:00.0"), [everywhere], SEEN)
    assert isinstance(hold, Hold) and "not a GPU this machine has had" in hold.why
    assert hold.action == Kill("u", "kernel reported sq_intr on 0000:03:00.0")


def test_a_gpu_that_is_gone_now_still_counts_when_it_was_seen():
    """GPUs seen since start, not GPUs present now: the one that fell off the bus is the case that matters."""
    assert decide(ev("ring_timeout", gpu=GPU_A), [A], frozenset({GPU_A})) == [
        Kill("a", f"kernel reported ring_timeout on {GPU_A}")]


def test_a_box_without_gpus_never_kills_for_a_kernel_gpu_fault():
    [hold] = decide(ev("sq_intr"), [ANY, A], frozenset())
    assert isinstance(hold, Hold) and hold.why == "no GPU was ever seen on this machine"
    assert decide(ev("engine_stall", engine="a"), [A], frozenset()) == [Kill("a", "stalled")]  # not a GPU fault


def test_unresponsive_kills_only_when_requests_were_running_and_configured_to():
    running = ev("engine_unresponsive", engine="a", requests_running=4)
    assert decide(running, [A], SEEN) == [Kill("a", "unresponsive with requests running")]
    assert decide(ev("engine_unresponsive", engine="a", requests_running=0), [A], SEEN) == []
    alert_only = EngineView("a", None, "kill", "kill", on_unresponsive="alert")
    assert decide(running, [alert_only], SEEN) == []


def test_a_crash_loop_quarantines():
    assert decide(ev("engine_crash_loop", engine="a"), [A], SEEN) == [Quarantine("crash_loop")]


def test_a_stall_read_from_a_log_kills_only_once_a_canary_confirmed_it():
    timed_out = {"outcome": "timeout", "seconds": 5.0, "detail": "a real completion did not return in 5 s"}
    confirmed = ev("engine_stall", engine="a", source="log", canary=timed_out)
    assert decide(confirmed, [A], SEEN) == [Kill("a", "stalled")]
    for canary in ({"outcome": "off"}, {"outcome": "error", "detail": "HTTP 400"}, None):
        held = decide(ev("engine_stall", engine="a", source="log", canary=canary), [A], SEEN)
        assert held == [Hold(Kill("a", "stalled"), "a stall read from a log alone is not confirmed by a real "
                                                   "completion (canary)")]
    assert decide(ev("engine_stall", engine="b", source="log", canary=timed_out), [B], SEEN) == []  # on_stall alert
    assert decide(ev("engine_stall", engine="a", source="slots"), [A], SEEN) == [Kill("a", "stalled")]


def test_a_canary_that_times_out_kills_as_on_unresponsive_says_even_when_idle():
    event = ev("engine_unresponsive", engine="a", requests_running=0, canary={"outcome": "timeout"})
    assert decide(event, [A], SEEN) == [Kill("a", "a real completion did not return")]
    alert_only = EngineView("a", None, "kill", "kill", on_unresponsive="alert")
    assert decide(event, [alert_only], SEEN) == []
    assert decide(ev("engine_unresponsive", engine="a", canary={"outcome": "error"}), [A], SEEN) == []
