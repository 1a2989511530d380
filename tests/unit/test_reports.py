"""Reports on one queue: what a component says in one step of the loop is one report, in the order it said it;
the queue never drops one and never makes a component wait."""

import asyncio
from dataclasses import replace

from gpuwarden.core import conditions
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.core.model import Event, Severity
from gpuwarden.core.policy import EngineView
from gpuwarden.hub.hub import Evidence
from gpuwarden.hub.queue import Outbox


def fault(n: int) -> Event:
    return Event("page_fault", Severity.CRITICAL, f"fault {n}", float(n), gpu="ffff:fe:1f.7")


def test_one_step_of_the_loop_is_one_report_in_the_order_said():
    queue: asyncio.Queue = asyncio.Queue()
    out = Outbox("kernel", queue, SelfMetrics())

    async def scenario():
        out.kernel_lines(1.0, ["a line"])
        refs = out.record([fault(1), fault(2)], ("kmsg", "c1"))
        out.set_count(refs[0], fault(1))
        out.resolve(conditions.STORE, "written again")
        assert queue.empty()  # put at the loop's next turn, not while the component runs
        out.record([fault(3)])  # events after a resolution: the first report goes, this one starts a second
        assert queue.qsize() == 1
        await asyncio.sleep(0)
        return refs

    refs = asyncio.run(scenario())
    first, second = queue.get_nowait(), queue.get_nowait()
    assert queue.empty()
    assert refs == [("kernel", 1), ("kernel", 2)]  # the outbox's own numbers: no answer from the hub
    assert (first.lines, [e.message for e in first.events], first.cursor) == ([(1.0, "a line")],
                                                                            ["fault 1", "fault 2"], ("kmsg", "c1"))
    assert [ref for ref, _ in first.recounts] == [("kernel", 1)] and first.resolved[0].key == conditions.STORE
    assert [e.message for e in second.events] == ["fault 3"] and second.refs == [("kernel", 3)]


def test_nothing_is_dropped_when_no_one_consumes():
    queue: asyncio.Queue = asyncio.Queue()
    out = Outbox("kernel", queue, SelfMetrics())
    for n in range(20_000):
        out.record([fault(n)])
        out.flush()
    assert queue.qsize() == 20_000


def test_metrics_go_to_the_component_s_own_handles_not_the_queue():
    queue: asyncio.Queue = asyncio.Queue()
    metrics = SelfMetrics()
    out = Outbox("kernel", queue, metrics)
    out.count("gpuwarden_kmsg_overruns_total", by=2)
    out.metric("gpuwarden_source_up", 1, "kernel")
    out.flush()
    assert queue.empty()
    assert metrics.snapshot()["gpuwarden_kmsg_overruns_total"] == {(): 2}


def test_each_engine_poll_reports_its_own_view_and_the_hub_keeps_the_others():
    """A poll says one engine's view, not all of them (engines² per interval); polls of one loop step make one
    report; the whole set (the watch's start, an engine dropped) replaces what the hub knew."""
    queue: asyncio.Queue = asyncio.Queue()
    out = Outbox("engines", queue, SelfMetrics())
    a, b, c = (EngineView(n, None, "kill", "kill") for n in "abc")
    evidence = Evidence(None, None, None, "box", [a, b])

    out.engines([a, b], {"a": None, "b": None}, whole=True)
    out.flush()
    out.engines([replace(a, pids=frozenset({7}))], {"a": {"running": 1}}, whole=False)
    out.engines([c], {"c": None}, whole=False)
    out.flush()
    out.engines([c], {"c": None}, whole=True)  # a and b dropped
    out.flush()
    start, polls, dropped = (queue.get_nowait() for _ in range(3))
    assert [v.name for v in polls.engines] == ["a", "c"] and not polls.whole and polls.samples["a"] == {"running": 1}

    for told in (start, polls):
        evidence.engines(told.engines, told.samples, told.whole)
    assert evidence.views["a"].pids == {7} and sorted(evidence.views) == ["a", "b", "c"]
    evidence.engines(dropped.engines, dropped.samples, dropped.whole)
    assert sorted(evidence.views) == ["c"] and evidence.samples == {"c": None}


def test_a_quiet_tick_is_no_report():
    """The kernel watch hands over each tick's batch, most of them empty: an empty one wakes no hub."""
    queue: asyncio.Queue = asyncio.Queue()
    out = Outbox("kernel", queue, SelfMetrics())

    async def scenario():
        out.kernel_lines(1.0, [])
        await asyncio.sleep(0)
        assert queue.empty()
        out.kernel_lines(2.0, ["a line"])
        await asyncio.sleep(0)

    asyncio.run(scenario())
    assert queue.get_nowait().lines == [(2.0, "a line")] and queue.empty()
