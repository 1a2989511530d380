"""A kernel watch built again within one run of the daemon (a reload, a restart after a crash) resumes right after
the last line the one before it read: a line logged between the two is not lost (it was, under `source = "kmsg"`,
which opened at the ring's end), and one read already is not read again (it was, under `auto`: the position saved
at most once a second, a line that only grew a burst was read again by the next watch and made a second, live
event). Real /dev/kmsg writes, a real journald for `auto`, a real daemon reloaded by SIGHUP."""

import asyncio
import os
import signal
import time

import pytest
from helpers import TEST_GPU, wait_for, write_kmsg

from gpuwarden.config.settings import KernelConfig
from gpuwarden.core.model import NullSink
from gpuwarden.kernel.watch import KernelWatch


def tag() -> str:
    return f"gw{os.getpid()}x{time.time_ns()}"


class Recorded(NullSink):
    """The events a watch records, and the counts it sets on them afterwards (a burst that grew)."""

    def __init__(self) -> None:
        self.events, self.counts = [], {}

    def record(self, events, cursor=None):
        start = len(self.events)
        self.events += events
        return list(range(start, len(self.events)))

    def set_count(self, ref, event):
        self.counts[ref] = event.count

    def mine(self, t: str) -> list[str]:
        return [e.evidence.get("line", "") for e in self.events if t in e.evidence.get("line", "")]


async def opened(watch: KernelWatch) -> asyncio.Task:
    """`watch` running in a task, once its source is open (what is written from now on is read)."""
    task = asyncio.ensure_future(watch.run())
    while watch.source is None:
        assert not task.done(), task.exception()
        await asyncio.sleep(0.02)
    return task


async def until(seen, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not seen():
        assert time.monotonic() < deadline, "the watch did not record the line"
        await asyncio.sleep(0.02)


async def stopped(task: asyncio.Task) -> None:
    """As the supervisor stops a component: cancelled, and waited for."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def fault(t: str, i: int) -> str:
    """A fault line of this test's own: an application's Xid names its process, and a line naming another (another
    test's, in the same host kernel log) never joins its bursts nor changes their counts."""
    return f"NVRM: Xid (PCI:{TEST_GPU[:-2]}): 31, pid={os.getpid()}, name=gw, Ch 00000010, MMU Fault {t} {i}"


@pytest.mark.root
def test_a_kmsg_watch_built_again_reads_the_lines_logged_while_none_ran():
    t = tag()
    sink = Recorded()
    config = KernelConfig(source="kmsg", storm_window=0)

    async def go():
        first = KernelWatch(config, sink, None)
        task = await opened(first)
        write_kmsg(fault(t, 1))
        await until(lambda: sink.mine(t))
        await stopped(task)
        write_kmsg(fault(t, 2))  # no watch reads the kernel log now
        second = KernelWatch(config, sink, first.cursor)
        task = await opened(second)
        write_kmsg(fault(t, 3))
        await until(lambda: fault(t, 3) in sink.mine(t))
        await asyncio.sleep(0.3)  # a repeat would come now
        await stopped(task)

    asyncio.run(go())
    assert sink.mine(t) == [fault(t, i) for i in (1, 2, 3)]


@pytest.mark.root
def test_an_auto_watch_built_again_does_not_read_a_line_that_grew_a_burst_again(journald):
    """The line that only grew a burst is not saved as a position (once a second at most): the next watch resumed
    before it, read it again and made a new event of it, live. And the burst it grew is closed when the watch is
    stopped, its count set: it was lost."""
    t = tag()
    sink = Recorded()
    config = KernelConfig(source="auto", lookback=0, storm_window=5)

    async def go():
        first = KernelWatch(config, sink, None)
        task = await opened(first)
        write_kmsg(fault(t, 1))
        await until(lambda: sink.mine(t))
        write_kmsg(fault(t, 2))  # joins the burst: no event, no position saved
        await asyncio.sleep(0.3)
        await stopped(task)
        second = KernelWatch(config, sink, first.cursor)
        task = await opened(second)
        await asyncio.sleep(1.5)  # a line read again would make its event now
        await stopped(task)

    asyncio.run(go())
    assert sink.mine(t) == [fault(t, 1)]
    mine = next(i for i, e in enumerate(sink.events) if t in e.evidence.get("line", ""))
    assert sink.counts.get(mine) == 2


@pytest.mark.root
def test_a_reload_right_after_a_line_that_grew_a_burst_makes_no_second_event(daemon_factory, journald):
    d = daemon_factory(kernel='source = "auto"\nlookback = "0s"\nstorm_window = "5s"')
    d.start()
    d.wait_serving()
    t = tag()
    write_kmsg(fault(t, 1))
    wait_for(lambda: any(t in e["evidence"].get("line", "") for e in d.events()), 10, what="the first event")
    at = d.log_size()
    write_kmsg(fault(t, 2))  # joins the burst
    time.sleep(0.2)
    d.proc.send_signal(signal.SIGHUP)
    d.wait_log("reloaded", after=at)
    time.sleep(1.5)  # a line read again would make its event now
    mine = [e for e in d.events() if t in e["evidence"].get("line", "")]
    assert [e["evidence"]["line"] for e in mine] == [fault(t, 1)]
    assert mine[0]["count"] == 2
    assert d.stop() == 0


@pytest.mark.root
def test_lines_logged_while_a_reload_had_another_source_are_history_once_kmsg_is_back(daemon_factory, tmp_path):
    """kmsg, then a file (a reload), then kmsg again: the kmsg watch resumes from the position saved before the
    file's time, and what was logged in it is read now. Those lines are old: history, never acted on (they were
    live, by the daemon's start)."""
    log = tmp_path / "kern.log"
    log.touch()
    d = daemon_factory(kernel='source = "kmsg"')
    d.start()
    d.wait_serving()
    t = tag()
    write_kmsg(fault(t, 1))
    wait_for(lambda: any(t in e["evidence"].get("line", "") for e in d.events()), 10, what="the first event")

    at = d.log_size()
    d.write_config(kernel=f'source = "file"\nfile = "{log}"')
    d.proc.send_signal(signal.SIGHUP)
    d.wait_log("kernel source: file", after=at)
    write_kmsg(fault(t, 2))  # the file is read now, not the kernel log

    at = d.log_size()
    d.write_config(kernel='source = "kmsg"')
    d.proc.send_signal(signal.SIGHUP)
    d.wait_log("kernel source: kmsg", after=at)
    write_kmsg(fault(t, 3))
    wait_for(lambda: sum(t in e["evidence"].get("line", "") for e in d.events()) >= 3, 10,
             what="the line of the file's time and the new one")
    time.sleep(1)  # a repeat would come now
    mine = [e for e in d.events() if t in e["evidence"].get("line", "")]
    assert [e["evidence"]["line"] for e in mine] == [fault(t, i) for i in (1, 2, 3)]
    assert ["history" in e["evidence"] for e in mine] == [False, True, False]
    assert d.stop() == 0


@pytest.mark.root
def test_a_line_logged_while_a_reload_switches_between_kernel_sources_is_live(daemon_factory, journald):
    """kmsg to auto: the kmsg watch saved where it stopped, and the auto watch resumes there. A line logged as the
    reload goes on (read by the one or, in the gap, by the other) is live: a fresh floor for the new source made
    the gap's lines history."""
    d = daemon_factory(kernel='source = "kmsg"')
    d.start()
    d.wait_serving()
    t = tag()
    at = d.log_size()
    d.write_config(kernel='source = "auto"')  # (its lookback, 10 minutes, reaches into the gap)
    d.proc.send_signal(signal.SIGHUP)
    for i in range(20):  # before, during and after the gap between the watches
        write_kmsg(fault(t, i))
        time.sleep(0.01)
    d.wait_log("kernel source: kmsg (journal catch-up)", after=at)
    time.sleep(3)  # the storm window (2 s) closes the burst: its count is stored
    mine = [e for e in d.events() if t in e["evidence"].get("line", "")]
    assert mine and not [e for e in mine if "history" in e["evidence"]]
    assert sum(e["count"] for e in mine) == 20, [(e["count"], e["evidence"]["line"]) for e in mine]  # each once
    assert d.stop() == 0
