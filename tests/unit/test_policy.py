"""The policy, pure: events and plain views in, typed actions out."""

from gpuwarden.core.model import Event, Severity
from gpuwarden.core.policy import (
    AlertOnly,
    EngineView,
    Kill,
    Quarantine,
    Refuse,
    Situation,
    Suspect,
    decide,
    exited,
)

GPU_A, GPU_B = "ffff:03:00.0", "ffff:83:00.0"
A = EngineView("a", frozenset({GPU_A}), "kill", "kill")
B = EngineView("b", frozenset({GPU_B}), "alert", "kill")
ANY = EngineView("any", None, "kill", "alert")
SEEN = frozenset({GPU_A, GPU_B})


def ev(kind, gpu=None, engine=None, severity=Severity.WARNING, **evidence):
    return Event(kind, severity, kind, 0.0, gpu=gpu, engine=engine, evidence=evidence)


def acts(event, engines, gpus_seen=SEEN, now=1000.0, **situation):
    """The actions that do something: alert-only ones are the event's alert, nothing more."""
    return [a for a in decide(event, Situation(engines, gpus_seen, now, **situation)) if not isinstance(a, AlertOnly)]


def test_a_stall_kills_only_its_engine_and_only_when_configured_to():
    assert acts(ev("engine_stall", engine="a"), [A, B, ANY]) == [Kill("a", "stalled")]
    assert decide(ev("engine_stall", engine="b"), Situation([A, B, ANY], SEEN, 0.0)) == [
        AlertOnly(Kill("b", "stalled"), 'on_stall = "alert"')]


def test_a_fault_with_no_owner_puts_the_engines_on_its_gpu_under_suspicion_and_kills_none():
    """sq_intr names no process: any ROCm user can raise one, so it alone kills nothing."""
    assert acts(ev("sq_intr", gpu=GPU_A), [A, B]) == [Suspect("a", f"kernel reported sq_intr on {GPU_A} (no owner)")]
    assert acts(ev("page_fault", gpu=GPU_B), [A, B]) == [
        Suspect("b", f"kernel reported page_fault on {GPU_B} (no owner)")]


def test_unknown_gpus_and_faults_without_a_gpu_match_everything_but_only_for_suspicion():
    both = EngineView("u", None, "kill", "kill")
    assert acts(ev("ring_timeout", gpu=GPU_A), [both]) == [
        Suspect("u", f"kernel reported ring_timeout on {GPU_A} (no owner)")]
    assert [(type(a), a.engine) for a in acts(ev("sq_intr"), [A, B, both])] == [
        (Suspect, "a"), (Suspect, "b"), (Suspect, "u")]
    # an escalation that names no GPU never kills every engine either, even engines under suspicion
    suspects = [EngineView(e.name, e.gpus, "kill", "kill", suspect=True) for e in (A, B, both)]
    assert {type(a) for a in acts(ev("device_lost", severity=Severity.CRITICAL), suspects)} == {Suspect}


def test_only_critical_xids_and_fault_kinds_count():
    assert acts(ev("xid", gpu=GPU_A, severity=Severity.CRITICAL, xid=119), [A]) == [
        Suspect("a", f"kernel reported xid on {GPU_A} (no owner)")]
    assert acts(ev("xid", gpu=GPU_A, severity=Severity.WARNING, xid=31), [A]) == []
    assert acts(ev("pcie_aer", gpu=GPU_A, severity=Severity.CRITICAL), [A]) == []


def test_nvmls_copy_of_a_strangers_xid_kills_no_one():
    """The H200 case: [kernel.xid] "31" = "critical"; the kernel copy names the stranger (refused), NVML's copy
    names no one: suspicion, not a kill."""
    kernel = ev("xid", gpu=GPU_A, severity=Severity.CRITICAL, xid=31, process={"pid": 31337, "name": "evil"})
    nvml = ev("xid", gpu=GPU_A, severity=Severity.CRITICAL, xid=31, source="nvml")
    assert [type(a) for a in decide(kernel, Situation([OWNER], SEEN, 1000.0))] == [Refuse]
    assert decide(nvml, Situation([OWNER], SEEN, 1000.0)) == [
        Suspect("owner", f"kernel reported xid on {GPU_A} (no owner)")]


def test_an_escalation_kills_the_engines_under_suspicion_on_that_gpu_only():
    suspect = EngineView("s", frozenset({GPU_A}), "kill", "kill", suspect=True)
    calm = EngineView("c", frozenset({GPU_A}), "kill", "kill")
    elsewhere = EngineView("e", frozenset({GPU_B}), "kill", "kill", suspect=True)
    for fault in (ev("gpu_reset", gpu=GPU_A), ev("device_lost", gpu=GPU_A, severity=Severity.CRITICAL),
                  ev("xid", gpu=GPU_A, severity=Severity.CRITICAL, xid=79)):
        assert acts(fault, [suspect, calm, elsewhere]) == [
            Kill("s", f"kernel reported {fault.kind} on {GPU_A} after an earlier fault with no owner"),
            Suspect("c", f"kernel reported {fault.kind} on {GPU_A} (no owner)")], fault.kind
    recovered = ev("gpu_reset", gpu=GPU_A, severity=Severity.INFO)  # "GPU reset succeeded": the driver's recovery
    assert acts(recovered, [suspect]) == []
    alert = EngineView("s", frozenset({GPU_A}), "kill", "alert", suspect=True)
    assert [type(a) for a in decide(ev("gpu_reset", gpu=GPU_A), Situation([alert], SEEN, 0.0))] == [AlertOnly]


def test_a_resolved_pasid_is_as_good_as_a_pid():
    mine = EngineView("mine", frozenset({GPU_A}), "kill", "kill", pids=frozenset({10}), pasids=frozenset({32769}))
    theirs = EngineView("theirs", frozenset({GPU_A}), "kill", "kill", pids=frozenset({20}), pasids=frozenset())
    reason = f"kernel reported page_fault on {GPU_A}"
    assert acts(ev("page_fault", gpu=GPU_A, pasid=32769), [mine, theirs]) == [
        Kill("mine", f"{reason}, raised by its process with pasid 32769"),
        Refuse(Kill("theirs", reason), "the fault was raised by pasid 32769, not one of theirs's processes")]
    # every engine's pasids known and none has it: a stranger's
    assert {type(a) for a in acts(ev("page_fault", gpu=GPU_A, pasid=5), [mine, theirs])} == {Refuse}
    # an engine whose pasids the kernel does not expose: the pasid cannot be resolved, so it has no owner
    unknown = EngineView("unknown", frozenset({GPU_A}), "kill", "kill", pids=frozenset({30}))
    assert {type(a) for a in acts(ev("page_fault", gpu=GPU_A, pasid=5), [mine, unknown])} == {Suspect}


def test_history_never_acts():
    """Journal look-back and catch-up after a restart: alerted and reported, never acted on."""
    owned = ev("sq_intr", gpu=GPU_A, process={"pid": 4242, "name": "vllm"})
    for event in (ev("engine_stall", engine="a"), owned, ev("engine_crash_loop", engine="a")):
        actions = acts(event.as_history(), [OWNER] if event is owned else [A])
        assert actions and all(isinstance(a, Refuse) and a.reason.startswith("history") and not a.by_hand
                               for a in actions), event.kind
    # not even suspicion: refused, with the reason the decision records
    assert [(type(a.action), a.reason) for a in acts(ev("sq_intr", gpu=GPU_A).as_history(), [A])] == [
        (Suspect, "history: logged before gpuwarden started")]


def test_a_fault_on_a_gpu_this_machine_never_had_does_not_kill():
    everywhere = EngineView("u", None, "kill", "kill", pids=frozenset({7}))
    [refused] = acts(ev("sq_intr", gpu="0000:03:00.0", process={"pid": 7, "name": "x"}), [everywhere])
    assert isinstance(refused, Refuse) and not refused.by_hand
    assert refused.action == Kill("u", "kernel reported sq_intr on 0000:03:00.0, raised by its process 7 (x)")
    assert "not a GPU this machine has had" in refused.reason
    assert [(type(a), type(a.action)) for a in acts(ev("sq_intr", gpu="0000:03:00.0"), [everywhere])] == [
        (Refuse, Suspect)]


def test_a_gpu_that_is_gone_now_still_counts_when_it_was_seen():
    """The inventory keeps every GPU seen since start: a GPU off the bus is exactly when the policy must act."""
    assert acts(ev("ring_timeout", gpu=GPU_A), [A], frozenset({GPU_A})) == [
        Suspect("a", f"kernel reported ring_timeout on {GPU_A} (no owner)")]


def test_a_box_without_gpus_never_kills_for_a_kernel_gpu_fault():
    owned = ev("sq_intr", process={"pid": 7, "name": "x"})
    mine = EngineView("m", None, "kill", "kill", pids=frozenset({7}))
    [refused] = acts(owned, [mine], frozenset())
    assert isinstance(refused, Refuse) and refused.reason == "no GPU was ever seen on this machine"
    assert {(type(a.action), a.reason) for a in acts(ev("sq_intr"), [ANY, A], frozenset())} == {
        (Suspect, "no GPU was ever seen on this machine")}


def test_unresponsive_kills_only_when_requests_were_running_and_configured_to():
    running = ev("engine_unresponsive", engine="a", requests_running=4)
    assert acts(running, [A]) == [Kill("a", "unresponsive with requests running")]
    assert decide(ev("engine_unresponsive", engine="a", requests_running=0), Situation([A], SEEN, 0.0)) == []
    alert_only = EngineView("a", None, "kill", "kill", on_unresponsive="alert")
    assert acts(running, [alert_only]) == []


def test_a_crash_loop_quarantines_or_only_says_what_it_would_move():
    assert acts(ev("engine_crash_loop", engine="a"), [A]) == [Quarantine("crash_loop", engine="a")]
    assert acts(ev("engine_crash_loop", engine="a"), [A], cache_dry_run=True) == [
        Quarantine("crash_loop", True, "a")]


def test_an_alert_only_or_unknown_engine_in_a_crash_loop_moves_no_cache():
    """Issue 24: an engine that may only be alerted on (every discovered one) made root rename caches."""
    quiet = EngineView("a", None, "alert", "alert", on_unresponsive="alert")
    [only] = decide(ev("engine_crash_loop", engine="a"), Situation([quiet], SEEN, 1000.0))
    assert isinstance(only, AlertOnly) and only.action == Quarantine("crash_loop", engine="a")
    [refused] = acts(ev("engine_crash_loop", engine="ghost"), [A])
    assert isinstance(refused, Refuse) and not refused.by_hand
    dry = EngineView("a", None, "kill", "kill", dry_run=True)
    assert acts(ev("engine_crash_loop", engine="a"), [dry]) == [Quarantine("crash_loop", True, "a")]


def test_a_stall_read_from_a_log_kills_only_once_a_canary_confirmed_it():
    timed_out = {"outcome": "timeout", "seconds": 5.0, "detail": "a real completion did not return in 5 s"}
    confirmed = ev("engine_stall", engine="a", source="log", canary=timed_out)
    assert acts(confirmed, [A]) == [Kill("a", "stalled")]
    for canary in ({"outcome": "off"}, {"outcome": "error", "detail": "HTTP 400"}, None):
        held = acts(ev("engine_stall", engine="a", source="log", canary=canary), [A])
        assert held == [Refuse(Kill("a", "stalled"), "a stall read from a log alone is not confirmed by a real "
                                                     "completion (canary)")]
    assert acts(ev("engine_stall", engine="b", source="log", canary=timed_out), [B]) == []  # on_stall alert
    assert acts(ev("engine_stall", engine="a", source="slots"), [A]) == [Kill("a", "stalled")]


def test_a_canary_that_times_out_kills_as_on_unresponsive_says_even_when_idle():
    event = ev("engine_unresponsive", engine="a", requests_running=0, canary={"outcome": "timeout"})
    assert acts(event, [A]) == [Kill("a", "a real completion did not return")]
    alert_only = EngineView("a", None, "kill", "kill", on_unresponsive="alert")
    assert acts(event, [alert_only]) == []
    assert acts(ev("engine_unresponsive", engine="a", canary={"outcome": "error"}), [A]) == []


def test_the_kill_budget_refuses_for_a_person_to_act_and_frees_up_as_kills_leave_its_window():
    stall = ev("engine_stall", engine="a")
    spent = EngineView("a", None, "kill", "kill", kill_budget=2, kill_budget_window=100.0, kills=(0.0, 10.0))
    [refused] = acts(stall, [spent], now=50.0)
    assert refused == Refuse(Kill("a", "stalled"), "its kill budget (2 per 100 s) is spent", by_hand=True)
    assert acts(stall, [spent], now=101.0) == [Kill("a", "stalled")]  # the first kill left the window
    assert acts(stall, [EngineView("a", None, "kill", "kill", kill_budget=0)], now=0.0)[0].by_hand
    dry = EngineView("a", None, "kill", "kill", dry_run=True, kill_budget=0)
    assert acts(stall, [dry]) == [Kill("a", "stalled", dry_run=True)]  # a dry run spends nothing


def test_history_is_refused_before_the_budget_is_asked():
    spent = EngineView("a", None, "kill", "kill", kill_budget=0)
    [refused] = acts(ev("engine_stall", engine="a").as_history(), [spent])
    assert refused.reason.startswith("history") and not refused.by_hand


def test_exits_within_the_window_count_and_our_own_kill_is_no_exit():
    assert exited((), 100.0, None, 10.0, 600.0) == (100.0,)
    assert exited((0.0, 50.0), 620.0, None, 10.0, 600.0) == (50.0, 620.0)  # the first left the window
    assert exited((), 100.0, 85.0, 10.0, 600.0) is None  # killed 15 s ago, grace 10 s: within 10 s more
    assert exited((), 100.0, 75.0, 10.0, 600.0) == (100.0,)


# --- a fault the driver pins on a process kills only that process's engine ----------------------------------

OWNER = EngineView("owner", frozenset({GPU_A}), "kill", "kill", pids=frozenset({4242, 4250}))
OTHER = EngineView("other", frozenset({GPU_A}), "kill", "kill", pids=frozenset({5000}))
UNSEEN = EngineView("unseen", frozenset({GPU_A}), "kill", "kill")  # its processes not found yet


def test_a_fault_raised_by_an_engines_process_kills_only_that_engine():
    fault = ev("page_fault", gpu=GPU_A, process={"pid": 4242, "name": "vllm"})
    reason = f"kernel reported page_fault on {GPU_A}"
    assert decide(fault, Situation([OWNER, OTHER, UNSEEN, B], SEEN, 1000.0)) == [
        Kill("owner", f"{reason}, raised by its process 4242 (vllm)"),
        Refuse(Kill("other", reason), "the fault was raised by pid 4242 (vllm), not one of other's processes"),
        Refuse(Kill("unseen", reason), "the fault was raised by pid 4242 (vllm), not one of unseen's processes")]


def test_a_fault_raised_by_a_stranger_kills_no_engine():
    """Any local user in the render group can make the GPU fault: that must not make gpuwarden a weapon."""
    for kind, severity in (("page_fault", Severity.WARNING), ("ring_timeout", Severity.WARNING),
                           ("xid", Severity.CRITICAL)):
        fault = ev(kind, gpu=GPU_A, severity=severity, process={"pid": 31337, "name": "evil"})
        actions = decide(fault, Situation([OWNER, OTHER], SEEN, 1000.0))
        assert [(type(a), a.action.engine, a.by_hand) for a in actions] == [(Refuse, "owner", False),
                                                                            (Refuse, "other", False)], kind
        assert all("raised by pid 31337 (evil)" in a.reason for a in actions)


def test_a_fault_of_pid_0_or_of_no_process_has_no_owner_and_puts_every_engine_on_it_under_suspicion():
    for evidence in ({"process": {"pid": 0, "name": ""}}, {"process": {"pid": 0, "name": "<unknown>"}}, {},
                     {"context_process": {"pid": 31337, "name": "nvidia-smi"}}):
        fault = ev("ring_timeout", gpu=GPU_A, **evidence)
        assert [(type(a), a.engine) for a in acts(fault, [OWNER, OTHER])] == [
            (Suspect, "owner"), (Suspect, "other")], evidence


def test_a_thread_id_is_not_a_process_of_the_engine_and_a_thread_of_it_is_not_needed():
    """The pid is the faulting task's process (its tgid): an engine's own process ids are what it is matched on."""
    assert [type(a) for a in acts(ev("sq_intr", gpu=GPU_A, process={"pid": 4250, "name": "x"}), [OWNER])] == [Kill]
    assert [type(a) for a in acts(ev("sq_intr", gpu=GPU_A, process={"pid": 4243, "name": "x"}), [OWNER])] == [Refuse]


def test_a_pinned_fault_still_obeys_history_budget_and_the_alert_setting():
    fault = ev("page_fault", gpu=GPU_A, process={"pid": 4242, "name": "vllm"})
    assert [a.reason for a in acts(fault.as_history(), [OWNER])] == ["history: logged before gpuwarden started"]
    spent = EngineView("owner", frozenset({GPU_A}), "kill", "kill", kill_budget=1, kills=(999.0,),
                       pids=frozenset({4242}))
    assert [(type(a), a.by_hand) for a in acts(fault, [spent])] == [(Refuse, True)]
    alert = EngineView("owner", frozenset({GPU_A}), "kill", "alert", pids=frozenset({4242}))
    assert [type(a) for a in decide(fault, Situation([alert], SEEN, 1000.0))] == [AlertOnly]


def test_restart_kills_and_asks_for_a_restart_until_a_restart_failed():
    restarting = EngineView("r", frozenset({GPU_A}), "restart", "restart", on_unresponsive="restart",
                            pids=frozenset({4242}))
    assert acts(ev("engine_stall", engine="r"), [restarting]) == [Kill("r", "stalled", restart=True)]
    assert acts(ev("engine_unresponsive", engine="r", requests_running=2), [restarting]) == [
        Kill("r", "unresponsive with requests running", restart=True)]
    fault = ev("ring_timeout", gpu=GPU_A, severity=Severity.CRITICAL, process={"pid": 4242, "name": "vllm"})
    assert acts(fault, [restarting]) == [
        Kill("r", f"kernel reported ring_timeout on {GPU_A}, raised by its process 4242 (vllm)", restart=True)]
    failed = EngineView("r", frozenset({GPU_A}), "restart", "restart", restart_failed=True)
    assert acts(ev("engine_stall", engine="r"), [failed]) == [
        Kill("r", "stalled; not restarted: its last restart did not bring it back")]


def test_a_restart_obeys_the_kill_budget():
    spent = EngineView("r", None, "restart", "kill", kill_budget=1, kills=(990.0,))
    [refused] = decide(ev("engine_stall", engine="r"), Situation([spent], SEEN, 1000.0))
    assert isinstance(refused, Refuse) and refused.by_hand and refused.action.restart


def test_a_kernel_line_its_own_record_does_not_prove_never_acts():
    """evidence["verified"] is False: a line user space wrote to /dev/kmsg, a device line without the kernel's
    device metadata, a line of a text log (kernel/classifier.unverified)."""
    why = "written to /dev/kmsg by user space (facility 1), not by the kernel"
    for event in (ev("sq_intr", gpu=GPU_A, verified=False, unverified=why),
                  ev("device_lost", gpu=GPU_A, severity=Severity.WARNING, verified=False, unverified=why)):
        assert all(isinstance(a, Refuse) and why in a.reason and not a.by_hand for a in acts(event, [A]))
    assert acts(ev("sq_intr", gpu=GPU_A, verified=True), [A]) == [
        Suspect("a", f"kernel reported sq_intr on {GPU_A} (no owner)")]


def test_a_kill_for_an_engines_own_stall_or_silence_carries_its_views_target_and_a_faults_none():
    """The target the engine watch judged on the look that found the stall travels with the Kill: the actuator
    kills it and asks nothing back. A fault's report holds no look of the engine: its Kill carries none (the
    actuator asks for a fresh one)."""
    target = object()  # opaque to the policy (engine/targets.py's KillTarget)
    seen = EngineView("a", frozenset({GPU_A}), "restart", "kill", pids=frozenset({7}), target=target)
    [stall] = acts(ev("engine_stall", engine="a"), [seen])
    [silent] = acts(ev("engine_unresponsive", engine="a", requests_running=2), [seen])
    assert stall.target is target and stall.restart and silent.target is target
    [fault] = acts(ev("ring_timeout", gpu=GPU_A, process={"pid": 7, "name": "vllm"}), [seen])
    assert isinstance(fault, Kill) and fault.target is None
