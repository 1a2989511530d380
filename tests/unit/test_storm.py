from gpuwarden.alert.storm import StormControl
from gpuwarden.model import Event, Severity


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
