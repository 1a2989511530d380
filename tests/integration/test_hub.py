"""The hub and the actuator in this process, with a real store and a running loop: an event is stored before
the policy sees it, and what the actuator does (or may not do) comes back on the queue as an event of its own."""

import asyncio
import logging
import os
import time
from datetime import datetime

from gpuwarden.act.actuator import Actuator
from gpuwarden.config.settings import CacheConfig
from gpuwarden.core import policy
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.core.model import Event, Severity
from gpuwarden.gpu.recorder import FlightRecorder
from gpuwarden.hub.hub import Evidence, Hub
from gpuwarden.hub.queue import Outbox, Report
from gpuwarden.hub.tracker import IncidentTracker
from gpuwarden.store import bundles as report
from gpuwarden.store.sqlite import Store

GPU = "ffff:fe:1f.7"


class OwnUser:
    """The actuator's look-up port for an engine's user, as the engine watch answers it: this test's own user
    (the caches below are its own)."""

    def user(self, name: str) -> int:
        return os.getuid()


class Seen:
    """The inventory's GPUs seen since start: a made-up ffff domain GPU, which no sysfs here has."""

    seen = frozenset({GPU})


def hub_for(tmp_path, engines: list[policy.EngineView]) -> Hub:
    reports, metrics, store = asyncio.Queue(), SelfMetrics(), Store(tmp_path / "gpuwarden.db")
    actuator = Actuator(Outbox("actuator", reports, metrics), OwnUser(), CacheConfig(dirs=[tmp_path / "cache"]))
    evidence = Evidence(store, FlightRecorder(), metrics, "test")
    incidents = IncidentTracker(report.Folders(tmp_path / "incidents"), evidence)
    hub = Hub(reports, store, None, actuator, Seen(), incidents, evidence, metrics, dry_run=False)
    hub.handle(Report("engines", engines=engines), 1000.0)  # the engine watch's report, as it comes
    return hub


def record(hub: Hub, events: list[Event]) -> None:
    """A component's report of these events, handled at the policy's time 1000.0 (the kill budgets' clock)."""
    hub.handle(Report("test", events=events, refs=[("test", i) for i in range(len(events))]), 1000.0)


async def consumed(hub: Hub, seconds: float) -> None:
    """Let the actuator's outcomes come back through the queue for a while."""
    consumer = asyncio.create_task(hub.run())
    await asyncio.sleep(seconds)
    consumer.cancel()


def stall(engine: str) -> Event:
    return Event("engine_stall", Severity.WARNING, f"{engine} stalled", 1.0, engine=engine)


def test_a_kill_past_the_budget_is_stored_then_refused_for_a_person(tmp_path):
    hub = hub_for(tmp_path, [policy.EngineView("e", None, "kill", "kill", kill_budget=2, kills=(990.0, 995.0))])

    async def scenario():
        record(hub, [stall("e")])
        assert [e["kind"] for e in hub.store.events()] == ["engine_stall"]  # stored before anything is done
        await consumed(hub, 0.1)

    asyncio.run(scenario())
    first, refused = hub.store.events()
    assert first["kind"] == "engine_stall" and refused["kind"] == "kill_refused"
    assert refused["message"] == "e should be killed (stalled) but its kill budget (2 per 3600 s) is spent: act by hand"
    assert refused["severity"] == "critical" and refused["evidence"]["reason"] == "stalled"
    assert first["evidence"]["decision"] == [{"action": "refuse", "engine": "e", "by_hand": True, "dry_run": False,
                                              "reason": "its kill budget (2 per 3600 s) is spent"}]
    assert hub.metrics.snapshot()["gpuwarden_events_total"] == {("engine_stall", "warning"): 1,
                                                                ("kill_refused", "critical"): 1}


def test_history_and_alert_only_engines_bring_no_action_and_no_outcome(tmp_path, caplog):
    hub = hub_for(tmp_path, [policy.EngineView("e", None, "kill", "kill", kill_budget=0),
                             policy.EngineView("quiet", None, "alert", "alert")])

    async def scenario():
        record(hub, [stall("e").as_history(), stall("quiet"), stall("old").as_history(logged_at=1.0e9)])
        await consumed(hub, 0.1)

    with caplog.at_level(logging.INFO, logger="gpuwarden"):
        asyncio.run(scenario())
    assert [e["kind"] for e in hub.store.events()] == ["engine_stall"] * 3
    # a new user's first start logged 416 old faults, none saying it was old: history says so in its line
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("warning engine_stall")]
    then = datetime.fromtimestamp(1.0e9).isoformat(sep=" ", timespec="seconds")
    assert logged == ["warning engine_stall: e stalled (history: logged before gpuwarden started; no action)",
                      "warning engine_stall: quiet stalled",
                      f"warning engine_stall: old stalled (history: logged {then}; no action)"], logged
    counted = hub.metrics.snapshot()  # history is counted apart from live events
    assert counted["gpuwarden_events_total"] == {("engine_stall", "warning"): 1}
    assert counted["gpuwarden_history_events_total"] == {("engine_stall", "warning"): 2}


def test_a_crash_loop_moves_the_poisoned_cache_aside_and_says_so(tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache/kernel.bin").write_bytes(b"")  # a write cut by a power loss
    hub = hub_for(tmp_path, [policy.EngineView("e", None, "kill", "kill")])  # an engine root may act for

    async def scenario():
        record(hub, [Event("engine_crash_loop", Severity.WARNING, "e exited 3 times", 1.0, engine="e")])
        for _ in range(100):
            await consumed(hub, 0.05)
            if len(hub.store.events()) > 1:
                break

    asyncio.run(scenario())
    loop, poisoned = hub.store.events()
    assert (loop["kind"], poisoned["kind"]) == ("engine_crash_loop", "cache_poisoned")
    assert poisoned["evidence"]["reason"] == "crash_loop" and not poisoned["evidence"]["dry_run"]
    [moved] = tmp_path.glob("cache.BROKEN-*-crash_loop")
    assert (moved / "kernel.bin").stat().st_size == 0 and not (tmp_path / "cache").exists()


def test_a_stranger_s_fault_is_stored_with_the_reason_it_was_not_acted_on(tmp_path):
    hub = hub_for(tmp_path, [policy.EngineView("vllm", None, "kill", "kill", pids=frozenset({10, 11}))])
    fault = Event("page_fault", Severity.CRITICAL, "page fault", 1.0, gpu=GPU,
                  evidence={"process": {"pid": 4242, "name": "python3"}})
    stranger = Event("ring_timeout", Severity.CRITICAL, "ring timeout", 1.0, gpu="ffff:fe:00.0")

    async def scenario():
        record(hub, [fault, stranger])
        await consumed(hub, 0.05)

    asyncio.run(scenario())
    stored = {e["kind"]: e["evidence"] for e in hub.store.events()}
    assert stored["page_fault"]["decision"] == [{
        "action": "refuse", "engine": "vllm", "by_hand": False, "dry_run": False,
        "reason": "the fault was raised by pid 4242 (python3), not one of vllm's processes"}]
    assert stored["ring_timeout"]["decision"] == [{
        "action": "refuse", "engine": "vllm", "by_hand": False, "dry_run": False,
        "reason": "ffff:fe:00.0 is not a GPU this machine has had since gpuwarden started"}]


def test_a_stall_its_kill_and_the_engine_s_return_are_one_incident_and_stored_condition_changes(tmp_path):
    hub = hub_for(tmp_path, [policy.EngineView("vllm", frozenset({GPU}), "alert", "alert")])
    now = time.time()  # an incident closes at its bound after it opened: the events are of now
    stall = Event("engine_stall", Severity.CRITICAL, "vllm stalled", now, engine="vllm", gpu=GPU)
    killed = Event("engine_killed", Severity.WARNING, "vllm killed", now + 1, engine="vllm", gpu=GPU,
                   evidence={"dry_run": False})
    back = Event("engine_back", Severity.INFO, "vllm back", now + 2, engine="vllm")
    gauge = "gpuwarden_condition"

    async def scenario():
        record(hub, [stall])
        assert hub.metrics.snapshot()[gauge] == {("engine_stalled", "vllm", GPU, "vllm"): 1}
        hub.metrics.set("gpuwarden_engine_stalled", 1, "vllm")  # as the engine watch says it
        hub.metrics.set("gpuwarden_engine_requests_running", 4, "vllm")
        record(hub, [killed])
        snapshot = hub.metrics.snapshot()
        assert snapshot[gauge] == {("engine_down", "vllm", GPU, "vllm"): 1}
        assert snapshot["gpuwarden_engine_stalled"] == {("vllm",): 0}  # at once, not at the next scrape
        assert snapshot["gpuwarden_engine_requests_running"] == {("vllm",): 0}  # a dead engine runs nothing
        record(hub, [back])
        assert hub.metrics.snapshot()[gauge] == {}
        await asyncio.sleep(0.05)

    asyncio.run(scenario())
    events = hub.store.events()
    assert [e["severity"] for e in events] == ["critical", "critical", "info"]  # a kill is a page (impact)
    [incident] = {e["evidence"]["incident"] for e in events}
    changes = [(c["condition"], c["raised"], c["message"]) for c in hub.store.condition_changes()]
    assert changes == [("engine_stalled", True, "vllm stalled"), ("engine_stalled", False, "vllm killed"),
                       ("engine_down", True, "vllm killed"), ("engine_down", False, "vllm back")]
    [row] = hub.store.incidents()
    assert row["id"] == incident and row["engines"] == ["vllm"] and row["conditions"] == []
    assert row["done"][0] == "vllm killed"  # what gpuwarden did (the return is one too, once it is an outcome)
    assert [d["action"] for d in row["decisions"]] == ["alert_only"]


def test_a_storm_s_final_count_arrives_by_the_outbox_s_reference(tmp_path):
    """The kernel watch never learns a row id: it reports a storm's final count by the reference its outbox gave
    the first line's event, and the stored event takes the count."""
    hub = hub_for(tmp_path, [])
    out = Outbox("kernel", hub.reports, hub.metrics)
    first = Event("page_fault", Severity.CRITICAL, "page fault", 1.0, gpu=GPU)

    async def scenario():
        [ref] = out.record([first], ("kmsg", "c1"))
        out.set_count(ref, Event(first.kind, first.severity, first.message, first.time, first.gpu, count=48))
        await consumed(hub, 0.05)

    asyncio.run(scenario())
    [stored] = hub.store.events()
    assert (stored["kind"], stored["count"]) == ("page_fault", 48)


class Learner:
    """The hub's port to the engine watch (hub.Learns), recording what it is told."""

    def __init__(self) -> None:
        self.told: list[str] = []

    def learn(self, event: Event) -> None:
        self.told.append(event.kind)


def test_the_engine_watch_learns_its_engines_events_no_action_follows_and_the_outcomes(tmp_path):
    """Walk 3: a kill's outcome is how a stalled engine's lifecycle learns the kill, and a stall decided without a
    kill tells it that none will come; a stall with a kill is not told (walk 2 does not enter the watch again),
    a fault of no engine is not the engine side's, and nothing is told at stop."""
    hub = hub_for(tmp_path, [])  # no engine to act on: the stall is decided without a kill
    learner = Learner()
    hub.configure("test", False, 10, learner)
    killed = Event("engine_killed", Severity.CRITICAL, "e killed", 2.0, engine="e", evidence={"dry_run": False})
    refused = Event("kill_refused", Severity.CRITICAL, "e not killed", 3.0, engine="e")

    async def scenario():
        record(hub, [stall("e"), Event("ring_timeout", Severity.CRITICAL, "ring", 1.0, gpu=GPU), killed, refused])
        told = ["engine_stall", "engine_killed", "kill_refused"]  # an engine nobody watches: its stall is not killed
        assert learner.told == told
        hub.handle(Report("actuator", events=[killed], refs=[("actuator", 9)]), 1000.0, act=False)  # at stop
        assert learner.told == told  # nothing is acted on, nor learnt
        await asyncio.sleep(0.05)

    asyncio.run(scenario())
