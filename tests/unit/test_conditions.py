"""Conditions and incidents, pure: which events raise and resolve which conditions, and how incidents group
what one cause did. The stored rows: Store and QueuedStore."""

import asyncio

from gpuwarden.core import conditions, incidents
from gpuwarden.core.conditions import Kind
from gpuwarden.core.model import CONDITION, Event, Severity
from gpuwarden.store.sqlite import QueuedStore, Store

C, W, I = Severity.CRITICAL, Severity.WARNING, Severity.INFO
GPU, OTHER = "0000:03:00.0", "0000:04:00.0"


def ev(kind, severity=C, t=100.0, **kw):
    return Event(kind, severity, f"{kind} on {kw.get('engine') or kw.get('gpu') or 'host'}", t, **kw)


def run(*events, state=None):
    state, changes = state or {}, []
    for e in events:
        state, more = conditions.apply(state, e)
        changes += more
    return state, changes


def test_a_stall_is_ended_by_the_kill_which_takes_the_engine_down_until_it_is_back():
    state, changes = run(ev("engine_stall", engine="vllm", gpu=GPU), ev("engine_killed", W, engine="vllm"))
    assert [(str(c.key), c.raised, c.by_event) for c in changes] == [
        ("engine_stalled:vllm", True, False), ("engine_stalled:vllm", False, True), ("engine_down:vllm", True, False)]
    assert list(state) == [conditions.down("vllm")]
    state, changes = run(ev("engine_back", I, engine="vllm"), state=state)
    assert state == {} and [(c.key, c.raised) for c in changes] == [(conditions.down("vllm"), False)]


def test_a_kill_that_left_survivors_leaves_the_stall_open():
    state, _ = run(ev("engine_stall", engine="vllm"))
    state, changes = conditions.apply(state, ev("engine_killed", engine="vllm", evidence={"survivors": [4242]}))
    assert set(state) == {conditions.stalled("vllm"), conditions.down("vllm")} and len(changes) == 1


def test_a_dry_run_kill_changes_nothing_and_is_never_critical():
    dry = ev("engine_killed", C, engine="vllm", evidence={"dry_run": True})
    state, _ = run(ev("engine_stall", engine="vllm"))
    after, changes = conditions.apply(state, dry)
    assert after == state and changes == []
    assert conditions.impact(dry) == W


def test_severity_by_impact_an_engine_down_or_a_gpu_lost_pages():
    assert conditions.impact(ev("engine_exited", W, engine="vllm")) == C
    assert conditions.impact(ev("engine_killed", W, engine="vllm")) == C
    assert conditions.impact(ev("engine_restarting", W, engine="vllm")) == W
    assert conditions.impact(ev("xid", W, gpu=GPU)) == W  # a warning Xid loses no GPU
    assert conditions.impact(ev("thermal", W, gpu=GPU)) == W


def test_a_repeat_adds_a_cause_and_no_change():
    state, changes = run(ev("device_lost", gpu=GPU), ev("reset_failed", gpu=GPU))
    assert len(changes) == 1 and state[conditions.lost(GPU)].causes == {"device_lost", "reset_failed"}
    assert state[conditions.lost(GPU)].gpu == GPU


def test_only_live_critical_gpu_losses_raise_gpu_lost():
    assert run(ev("xid", W, gpu=GPU))[0] == {}
    assert run(ev("device_lost", gpu=GPU).as_history())[0] == {}
    assert list(run(ev("xid", gpu=GPU))[0]) == [conditions.lost(GPU)]


def test_a_gpu_that_answers_again_is_cured_only_of_not_answering():
    state, _ = run(ev("gpu_unresponsive", gpu=GPU), ev("gpu_missing", gpu=OTHER), ev("reset_failed", gpu=OTHER))
    answers = frozenset({"gpu_unresponsive"})
    state, changes = conditions.resolve(state, conditions.lost(GPU), "answers again", 200.0, answers)
    assert [c.key for c in changes] == [conditions.lost(GPU)] and not changes[0].by_event
    state, changes = conditions.resolve(state, conditions.lost(OTHER), "back on the bus", 200.0,
                                        frozenset({"gpu_missing"}))
    assert changes == [] and list(state) == [conditions.lost(OTHER)]  # a failed reset needs more than that


def test_gpus_back_resolves_the_gpus_present():
    state, _ = run(ev("device_lost", gpu=GPU), ev("device_lost", gpu=OTHER))
    state, changes = conditions.apply(state, ev("gpus_changed", C, evidence={conditions.GPUS_PRESENT: [GPU]}))
    assert [c.key for c in changes] == [conditions.lost(GPU)] and list(state) == [conditions.lost(OTHER)]
    state, changes = conditions.apply(state, ev("gpus_back", I))
    assert state == {} and [c.key for c in changes] == [conditions.lost(OTHER)]


def test_a_telemetry_condition_is_its_own_gpu_degraded_key():
    hot = ev("thermal", W, gpu=GPU, evidence={CONDITION: f"thermal:{GPU}:junction"})
    state, [change] = run(hot)
    assert change.key == conditions.degraded(f"thermal:{GPU}:junction") and change.condition.gpu == GPU
    assert conditions.series(state) == {("gpu_degraded", f"thermal:{GPU}:junction", GPU, ""): 1.0}
    assert conditions.resolve(state, conditions.degraded(f"thermal:{GPU}:junction"), "back", 1.0)[0] == {}


def test_a_restart_keeps_a_lost_gpu_and_a_telemetry_condition_for_the_gpu_watch_to_judge():
    hot = ev("thermal", W, gpu=GPU, evidence={CONDITION: f"thermal:{GPU}:junction"})
    state, _ = run(ev("device_lost", gpu=GPU), hot, ev("engine_stall", engine="vllm"), ev("store_unwritable", W))
    kept, ended = conditions.restarted(state, 300.0)
    assert list(kept) == [conditions.lost(GPU), conditions.degraded(f"thermal:{GPU}:junction")]
    assert sorted(c.key.kind for c in ended) == [Kind.ENGINE_STALLED, Kind.STORE_UNWRITABLE]


def test_an_engine_no_longer_watched_has_its_conditions_ended():
    state, _ = run(ev("engine_stall", engine="old"), ev("engine_stall", engine="kept"), ev("device_lost", gpu=GPU))
    state, changes = conditions.unwatched(state, {"old"}, 200.0)
    assert set(state) == {conditions.stalled("kept"), conditions.lost(GPU)}
    assert [(c.key, c.message) for c in changes] == [(conditions.stalled("old"), "old is no longer watched (reload)")]


def test_every_raising_and_resolving_kind_is_in_the_table_and_keys_are_typed():
    assert str(conditions.stalled("vllm")) == "engine_stalled:vllm"
    assert conditions.unresponsive("a") != conditions.stalled("a")
    assert {k for kinds in conditions.RAISES.values() for k in kinds} == set(Kind) - {Kind.GPU_DEGRADED}


# --- incidents ---------------------------------------------------------------------------------------


def offer(open_, event, raised=(), gpus=None):
    return incidents.offer(incidents.joins(open_, event, gpus or {}), event, list(raised), [], f"id-{event.kind}",
                           event.time)


def test_a_critical_event_opens_an_incident_and_what_follows_on_its_gpu_or_engine_joins():
    fault = ev("ring_timeout", gpu=GPU)
    incident = offer([], fault)
    assert incident.id == "id-ring_timeout" and incident.gpus == {GPU}
    kill = ev("engine_killed", engine="vllm", t=101.0)
    joined = offer([incident], kill, [conditions.down("vllm")], {"vllm": frozenset({GPU})})
    assert joined.id == incident.id and joined.engines == {"vllm"} and joined.done == (kill.message,)
    assert joined.conditions == {conditions.down("vllm")}
    assert offer([joined], ev("engine_stall", engine="other", t=102.0), gpus={"other": frozenset({OTHER})}).id \
        == "id-engine_stall"  # another engine, another GPU: an incident of its own
    assert offer([joined], ev("thermal", W, gpu=OTHER)) is None  # not critical, about nothing open
    assert offer([], ev("ring_timeout", gpu=GPU).as_history()) is None


def test_an_incident_closes_when_its_conditions_end_and_it_was_quiet_or_at_its_bound():
    incident = offer([], ev("engine_stall", engine="vllm"), [conditions.stalled("vllm")])
    assert incidents.settle(incident, [], 1000.0).closed is None  # its condition is open
    _, [ended] = conditions.resolve({conditions.stalled("vllm"): conditions.Condition(conditions.stalled("vllm"), 100.0,
                                                                                      "stalled")},
                                    conditions.stalled("vllm"), "progress again", 120.0)
    settled = incidents.settle(incident, [ended], 120.0)
    assert settled.closed is None and settled.ended == "progress again" and not settled.conditions
    assert incidents.settle(settled, [], 100.0 + incidents.WINDOW).closed == 100.0 + incidents.WINDOW
    bound = incidents.settle(incident, [], 100.0 + incidents.BOUND)
    assert bound.closed and bound.ended.startswith("still open after 7 days: engine_stalled:vllm")


def test_an_incident_row_round_trips_with_the_conditions_still_open():
    incident = offer([], ev("device_lost", gpu=GPU), [conditions.lost(GPU)])
    again = incidents.from_row(incident.row(), [conditions.lost(GPU)])
    assert again == incident
    assert incidents.from_row(incident.row(), []).conditions == frozenset()


# --- the stored rows ------------------------------------------------------------------------------------


def test_condition_changes_are_stored_and_the_open_ones_read_back(tmp_path):
    state, changes = run(ev("device_lost", gpu=GPU), ev("engine_stall", engine="vllm", gpu=GPU))
    store = Store(tmp_path / "gw.db")
    store.add_changes(changes)
    state, resolved = conditions.resolve(state, conditions.stalled("vllm"), "progress again", 150.0)
    store.add_changes(resolved)
    store.close()
    store = Store(tmp_path / "gw.db")
    assert store.open_conditions() == [state[conditions.lost(GPU)]]
    assert [(c["condition"], c["raised"]) for c in store.condition_changes()] == [
        ("gpu_lost", True), ("engine_stalled", True), ("engine_stalled", False)]


def test_the_queued_store_writes_conditions_and_incidents(tmp_path):
    _, changes = run(ev("device_lost", gpu=GPU))
    incident = offer([], ev("device_lost", gpu=GPU), [conditions.lost(GPU)])

    async def scenario():
        store = QueuedStore(tmp_path / "gw.db", asyncio.get_running_loop(), lambda error: None)
        [event_id] = store.add_events([ev("device_lost", gpu=GPU)])
        state = conditions.with_event_id(dict(run(ev("device_lost", gpu=GPU))[0]), changes, event_id)
        store.add_changes([conditions.Change(state[conditions.lost(GPU)], True, 100.0, "lost", False)])
        store.save_incident(incident.row())
        store.save_incident({**incident.row(), "closed": 200.0, "ended": "gpus back"})
        store.close()

    asyncio.run(scenario())
    store = Store(tmp_path / "gw.db")
    [lost] = store.open_conditions()
    assert lost.key == conditions.lost(GPU) and lost.event_id == store.events()[0]["id"]
    [row] = store.incidents()
    assert row["closed"] == 200.0 and row["ended"] == "gpus back" and store.incidents(open_only=True) == []


def test_a_version_2_store_gains_the_conditions_and_incidents_and_keeps_its_events(tmp_path):
    import sqlite3

    from gpuwarden.store.sqlite import _MIGRATIONS, SCHEMA_VERSION

    db = sqlite3.connect(tmp_path / "gw.db", isolation_level=None)
    for version in (1, 2):
        db.executescript(_MIGRATIONS[version])
    db.execute("INSERT INTO events (time, kind, severity, message, evidence, dedupe_key) "
               "VALUES (1.0, 'device_lost', 'critical', 'old', '{}', 'device_lost:host')")
    db.execute("PRAGMA user_version=2")
    db.close()
    store = Store(tmp_path / "gw.db")
    assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    assert [e["message"] for e in store.events()] == ["old"]
    assert store.open_conditions() == [] and store.incidents() == []  # an old loss is not made a condition


def test_a_restart_keeps_a_watched_engine_down_until_it_is_back():
    state, _ = run(ev("engine_killed", engine="vllm"), ev("engine_restarting", W, engine="vllm"),
                   ev("engine_exited", engine="gone"))
    kept, ended = conditions.restarted(state, 300.0, engines={"vllm"})
    assert set(kept) == {conditions.down("vllm"), conditions.restarting("vllm")}
    assert [c.key for c in ended] == [conditions.down("gone")]  # no longer watched: nothing would end it


def test_a_restart_keeps_a_watched_engines_stall_for_its_watch_to_end_and_tells_only_what_it_saw_end():
    state, _ = run(ev("engine_stall", engine="vllm"), ev("engine_unresponsive", engine="vllm"),
                   ev("engine_stall", engine="gone"), ev("store_unwritable", W))
    kept, ended = conditions.restarted(state, 300.0, engines={"vllm"})
    assert set(kept) == {conditions.stalled("vllm"), conditions.unresponsive("vllm")}
    assert [(c.key, c.message, c.tells) for c in ended] == [
        (conditions.stalled("gone"), "gone is no longer watched", True),  # as after a reload
        (conditions.STORE, "gpuwarden restarted: judged afresh", False)]  # nothing was seen to end: no "resolved"
    _, ended = conditions.restarted(state, 300.0, discovering=True)  # discovery may find it again: unsaid
    assert all(not c.tells for c in ended)
