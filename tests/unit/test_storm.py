from gpuwarden.alert.storm import StormControl
from gpuwarden.core.model import Event, Severity


def ev(t, kind="sq_intr", gpu="0000:03:00.0", severity=Severity.WARNING, count=1):
    """An event logged at `t`, which every test offers at that same time: times are real and distinct, so an
    assertion about which event a message carries can fail."""
    return Event(kind, severity, f"{kind} on {gpu}", t, gpu=gpu, count=count)


def test_ten_thousand_identical_events_make_one_message_and_one_follow_up():
    storm = StormControl(cooldown=600, group_window=5)
    sent = []
    for i in range(10_000):
        storm.offer(ev(t=i * 0.001), i, now=i * 0.001)
        sent += storm.due(now=i * 0.001)
    sent += storm.due(now=10.1)
    # The first message goes out when its 5 s window closes, counting the repeats seen until then.
    [first] = sent
    assert [e.time for e in first.events] == [0.0] and first.repeats == {"sq_intr:0000:03:00.0": (5_000, 0.001)}
    assert storm.due(now=300) == []  # still cooling down
    [follow_up] = storm.due(now=606.0)
    assert follow_up.events == [] and follow_up.repeats == {"sq_intr:0000:03:00.0": (4_999, 5.001)}
    assert storm.due(now=2000.0) == []


def test_a_burst_across_kinds_on_one_gpu_is_one_message():
    storm = StormControl(group_window=5)
    storm.offer(ev(0.0, "sq_intr"), 1, 0.0)
    storm.offer(ev(1.0, "gpu_reset", severity=Severity.CRITICAL), 2, 1.0)
    storm.offer(ev(1.5, "device_lost", gpu="0000:83:00.0"), 3, 1.5)
    assert storm.due(4.9) == []
    groups = {o.subject: o for o in storm.due(7.0)}
    assert [(e.kind, e.time) for e in groups["GPU 0000:03:00.0"].events] == [("sq_intr", 0.0), ("gpu_reset", 1.0)]
    assert groups["GPU 0000:03:00.0"].event_ids == [1, 2]
    assert groups["GPU 0000:03:00.0"].severity == Severity.CRITICAL
    assert [(e.kind, e.time) for e in groups["GPU 0000:83:00.0"].events] == [("device_lost", 1.5)]


def test_the_next_message_after_the_cooldown_carries_the_count():
    storm = StormControl(cooldown=60, group_window=0)
    storm.offer(ev(0.0), 1, 0.0)
    storm.due(0.0)
    assert storm.offer(ev(10.0, count=4), 2, 10.0) is False
    assert storm.offer(ev(20.0), 3, 20.0) is False
    assert storm.offer(ev(61.0), 4, 61.0) is True
    [message] = storm.due(61.0)
    assert message.repeats == {"sq_intr:0000:03:00.0": (5, 10.0)}
    assert [e.time for e in message.events] == [61.0]  # the event that ended the cooldown, not the first one


def test_resolved_only_when_the_alert_was_sent_and_once():
    storm = StormControl(group_window=0)
    assert storm.resolve("thermal:0000:03:00.0", "back to normal") is None
    storm.offer(ev(1.0, "thermal"), 1, 1.0)
    storm.due(1.0)
    resolved = storm.resolve("thermal:0000:03:00.0", "junction 71 °C, back to normal")
    assert resolved.resolved == "junction 71 °C, back to normal" and resolved.subject == "GPU 0000:03:00.0"
    assert storm.resolve("thermal:0000:03:00.0", "again") is None


def test_next_due_is_the_earliest_window_or_cooldown():
    storm = StormControl(cooldown=60, group_window=5)
    assert storm.next_due() is None
    storm.offer(ev(10.0), 1, 10.0)
    assert storm.next_due() == 15.0
    storm.due(15.0)
    assert storm.next_due() is None  # nothing suppressed: no follow-up to wait for
    storm.offer(ev(20.0), 2, 20.0)
    assert storm.next_due() == 75.0


def inc(t, kind, severity=Severity.CRITICAL, incident="i1", gpu=None, engine="qwen", **evidence):
    return Event(kind, severity, kind, t, gpu=gpu, engine=engine, evidence={"incident": incident, **evidence})


def test_an_incident_is_one_page_then_follow_ups_that_reach_where_it_went():
    storm = StormControl(cooldown=600, group_window=5)
    assert storm.offer(inc(0, "engine_stall"), 1, 0)
    assert storm.offer(inc(1, "engine_killed"), 2, 1)
    [page] = storm.due(5)
    assert [e.kind for e in page.events] == ["engine_stall", "engine_killed"] and not page.follow_up
    assert storm.offer(inc(6, "engine_stall"), 3, 6) is False  # the same cause again: no news, counted
    assert storm.offer(inc(8, "engine_restarting", Severity.WARNING), 4, 8)
    [restarting] = storm.due(13)
    assert restarting.follow_up and restarting.quiet == 1 and restarting.severity == Severity.CRITICAL
    assert [e.kind for e in restarting.earlier] == ["engine_stall", "engine_killed"]
    storm.offer(inc(50, "engine_back", Severity.INFO), 5, 50)
    [back] = storm.due(55)
    assert back.ends and back.severity == Severity.CRITICAL  # the pager that heard "killed" hears "back"
    assert storm.resolve("engine_stall:qwen", "progress again") is None  # "back" told the end already


def test_one_gpu_lost_twice_pages_once():
    storm = StormControl(group_window=5)
    storm.offer(inc(0, "reset_failed", incident="a", gpu="ffff:03:00.0", engine=None), 1, 0)
    storm.due(5)
    # the telemetry sees the same GPU gone, in an incident of its own: the same fault
    assert storm.offer(inc(30, "gpu_missing", incident="b", gpu="ffff:03:00.0", engine=None), 2, 30) is False
    assert storm.offer(inc(31, "gpu_missing", incident="c", gpu="ffff:04:00.0", engine=None), 3, 31)
    [other] = storm.due(40)
    assert [e.gpu for e in other.events] == ["ffff:04:00.0"] and not other.follow_up


def test_a_resolved_condition_of_an_incident_nothing_was_done_about_is_a_follow_up():
    storm = StormControl(group_window=0)
    storm.offer(inc(0, "engine_stall", decision=[{"action": "alert_only", "engine": "qwen"}]), 1, 0)
    storm.due(0)
    resolved = storm.resolve("engine_stall:qwen", "qwen makes progress again")
    assert resolved.incident == "i1" and resolved.follow_up and resolved.ends


def test_an_incident_whose_condition_ends_inside_its_window_is_paged_then_resolved():
    """fc5 (a fresh clone beside the engines' build): the stall ended while its page waited in the window, the
    resolution was dropped (its page not sent yet), and the page went out alone: a stall that never ended."""
    storm = StormControl(group_window=5)
    storm.offer(inc(0, "engine_stall", decision=[{"action": "alert_only", "engine": "qwen"}]), 1, 0)
    assert storm.resolve("engine_stall:qwen", "qwen makes progress again", 2) is None  # its page is not out yet
    page, resolved = storm.due(5)
    assert [e.kind for e in page.events] == ["engine_stall"] and not page.follow_up
    assert resolved.resolved == "qwen makes progress again" and resolved.follow_up and resolved.at == 2
    assert storm.due(100) == [] and storm.resolve("engine_stall:qwen", "again") is None  # once


def test_an_alert_whose_condition_ends_inside_its_window_is_resolved_after_its_message_not_before():
    storm = StormControl(group_window=5)
    storm.offer(ev(1.0, "thermal"), 1, 1.0)
    assert storm.resolve("thermal:0000:03:00.0", "junction 71 °C, back to normal", 2.0) is None
    message, resolved = storm.due(6.0)
    assert [e.kind for e in message.events] == ["thermal"] and resolved.resolved == "junction 71 °C, back to normal"


def test_a_resolution_held_in_a_window_moves_with_its_events_into_the_incident_they_led_to():
    storm = StormControl(group_window=5)
    storm.offer(ev(0.0, "sq_intr"), 1, 0.0)
    storm.resolve("sq_intr:0000:03:00.0", "quiet again", 0.5)
    storm.offer(inc(1.0, "device_lost", incident="lost", gpu="0000:03:00.0", engine=None), 2, 1.0)
    page, *ends = storm.due(5.0)
    assert [e.kind for e in page.events] == ["sq_intr", "device_lost"] and len(ends) == 1


def test_history_and_dry_runs_never_page():
    storm = StormControl(group_window=0)
    storm.offer(Event("ring_timeout", Severity.CRITICAL, "x", 0, gpu="ffff:03:00.0").as_history(), 1, 0)
    storm.offer(Event("engine_killed", Severity.CRITICAL, "x", 0, engine="e", evidence={"dry_run": True}), 2, 0)
    assert {o.severity for o in storm.due(0)} == {Severity.WARNING}


def test_a_warning_just_before_the_fault_it_led_to_goes_out_in_the_incident_s_page():
    storm = StormControl(group_window=5)
    storm.offer(ev(0.0, "sq_intr"), 1, 0.0)  # no incident: a warning opens none
    storm.offer(inc(1.0, "device_lost", incident="lost", gpu="0000:03:00.0", engine=None), 2, 1.0)
    assert storm.due(4.9) == []  # the window runs from the warning
    [page] = storm.due(5.0)
    assert [e.kind for e in page.events] == ["sq_intr", "device_lost"] and page.event_ids == [1, 2]
    assert page.incident == "lost"


def test_a_restarted_storm_control_resumes_an_open_incident_and_a_cooling_key():
    """What the last run alerted (read from the store at the alerter's first run): the engine's return after a
    restart of gpuwarden is a follow-up on the incident's page, routed where the page went, not a new info
    message; and a storm still in its cooldown is counted, not sent again."""
    incident = {"incident": "20261204-031207-engine_stall"}
    stall = Event("engine_stall", Severity.CRITICAL, "stalled", 0.0, engine="vllm", evidence=incident)
    killed = Event("engine_killed", Severity.CRITICAL, "killed vllm", 1.0, engine="vllm", evidence=incident)
    back = Event("engine_back", Severity.INFO, "vllm back", 50.0, engine="vllm", evidence=incident)
    afresh = StormControl(group_window=5)
    afresh.offer(back, 3, 50.0)
    [told] = afresh.due(56.0)
    assert (told.severity, told.follow_up) == (Severity.INFO, False)  # the restart's gap: a pager never hears it

    storm = StormControl(group_window=5)
    storm.resume(incident["incident"], [stall, killed])
    storm.resume(None, [ev(40.0)])
    storm.offer(back, 3, 50.0)
    assert not storm.offer(ev(45.0), 4, 45.0)  # the storm before the restart, still cooling down
    [told] = storm.due(56.0)
    assert (told.severity, told.follow_up, told.ends) == (Severity.CRITICAL, True, True)
    assert told.earlier == [stall, killed] and told.events == [back]
    assert storm.due(1000.0)[0].repeats == {"sq_intr:0000:03:00.0": (1, 45.0)}
