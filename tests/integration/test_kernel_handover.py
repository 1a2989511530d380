"""`source = "auto"` under a real journald: /dev/kmsg live, the journal only to catch up, and the hand-over
between them loses and repeats nothing (real /dev/kmsg writes, a real systemd-journald, a real daemon)."""

import asyncio
import os
import time
from pathlib import Path

import pytest
from helpers import wait_for, write_kmsg

from gpuwarden.kernel.sources import BOOT_ID, JournalKmsgSource, JournalSource


def tag() -> str:
    return f"gw{os.getpid()}x{time.time_ns()}"


async def collect(source, want: set[str], settle: float = 1.0, timeout: float = 15.0) -> list:
    """Records until every wanted text came, then `settle` seconds more (to see any repeat)."""
    seen: list = []

    async def read():
        done_at = None
        async for batch in source.batches():
            seen.extend(batch)
            if done_at is None and want <= {r.text for r in seen}:
                done_at = time.monotonic()
            if done_at is not None and time.monotonic() - done_at > settle:
                return
    await asyncio.wait_for(read(), timeout)
    return seen


def journal_has(text: str) -> bool:
    source = JournalSource(cursor=None, lookback=60)
    try:
        return any(text in r.text for r in source._drain(100_000))
    finally:
        source.close()


@pytest.mark.root
def test_restart_under_auto_reads_lines_written_while_down_once(daemon_factory, journald):
    d = daemon_factory(kernel='source = "auto"\nlookback = "0s"')
    d.start()
    d.wait_log("kernel source: kmsg (journal catch-up)")
    t = tag()
    before = f"amdgpu ffff:fe:1f.7: amdgpu: GPU reset begin! {t} while running"
    write_kmsg(before)
    wait_for(lambda: any(t in e["evidence"].get("line", "") for e in d.events()), 10, what="the first event")
    assert d.stop() == 0

    while_down = f"amdgpu ffff:fe:1f.7: amdgpu: device lost from bus! {t} while down"
    write_kmsg(while_down)
    d.start()
    d.wait_log("kernel source: kmsg (journal catch-up)")
    after = f"amdgpu ffff:fe:1f.7: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1, emitted seq=2 {t} after"
    write_kmsg(after)
    wait_for(lambda: sum(t in e["evidence"].get("line", "") for e in d.events()) >= 3, 10,
             what="the missed and new lines")
    assert not [e for e in d.events() if e["kind"] == "kmsg_overrun"]
    time.sleep(1)
    mine = [e["evidence"]["line"] for e in d.events() if t in e["evidence"].get("line", "")]
    assert mine == [before, while_down, after]
    assert d.stop() == 0


@pytest.mark.root
def test_hand_over_from_the_journal_to_kmsg_repeats_nothing(journald):
    """A saved position older than the ring's oldest record makes the journal fill the gap; the lines the ring
    still holds come from kmsg, each once."""
    t = tag()
    lines = [f"amdgpu ffff:fe:1f.7: amdgpu: sq_intr: error {t} {i}" for i in range(3)]
    start = time.clock_gettime(time.CLOCK_MONOTONIC)
    for line in lines:
        write_kmsg(line)
    wait_for(lambda: journal_has(lines[-1]), 10, what="journald storing the lines")
    boot = Path(BOOT_ID).read_text().strip()
    with open("/dev/kmsg") as kmsg:  # the oldest record still in the ring
        oldest = int(kmsg.readline().split(",")[1])
    source = JournalKmsgSource(f"kmsg:{boot}:{oldest - 2}:{start:.6f}", lookback=0, tick=0.1)
    assert source._journal is not None  # the journal path, with its hand-over, is the one under test
    seen = asyncio.run(collect(source, set(lines)))
    source.close()
    mine = [r for r in seen if t in r.text]
    assert [r.text for r in mine] == lines
    assert all(r.cursor and r.cursor.startswith(f"kmsg:{boot}:") for r in mine)  # from kmsg, not the journal


@pytest.mark.root
def test_saved_kmsg_position_still_in_the_ring_needs_no_journal(journald):
    t = tag()
    first, second = (f"amdgpu ffff:fe:1f.7: amdgpu: GPU reset begin! {t} {i}" for i in range(2))
    write_kmsg(first)
    probe = JournalKmsgSource(None, lookback=5, tick=0.1)
    seen = asyncio.run(collect(probe, {first}, settle=0.2))
    probe.close()
    position = next(r.cursor for r in seen if r.text == first)
    write_kmsg(second)
    source = JournalKmsgSource(position, lookback=0, tick=0.1)
    assert source._journal is None
    mine = [r.text for r in asyncio.run(collect(source, {second})) if t in r.text]
    source.close()
    assert mine == [second]


@pytest.mark.root
def test_switching_from_the_journal_source_resumes_after_its_cursor(journald):
    """A cursor saved by `source = "journal"`: the journal catches up from it and kmsg takes over after the
    cursor's entry, so the line at the cursor is not read again."""
    t = tag()
    first, second = (f"amdgpu ffff:fe:1f.7: amdgpu: GPU reset begin! {t} {i}" for i in range(2))
    write_kmsg(first)
    wait_for(lambda: journal_has(first), 10, what="journald storing the line")
    journal = JournalSource(cursor=None, lookback=60)
    cursor = next(r.cursor for r in journal._drain(100_000) if r.text == first)
    journal.close()
    write_kmsg(second)
    source = JournalKmsgSource(cursor, lookback=0, tick=0.1)
    mine = [r.text for r in asyncio.run(collect(source, {second})) if t in r.text]
    source.close()
    assert mine == [second]


@pytest.mark.root
def test_a_lookback_of_0_counts_from_now_on_the_kernel_logs_clock(journald):
    """printk's clock is not CLOCK_MONOTONIC (kernel/clock.py; 5.7 ms behind it after 6.5 hours on the VM this
    was found on, more on CI's, where a daemon started with a lookback of 0 never read the first line logged after
    it): counted from the source's own stamp of now, a line logged before it opened is left, one after is read."""
    t = tag()
    before, after = (f"amdgpu ffff:fe:1f.7: amdgpu: GPU reset begin! {t} {i}" for i in range(2))
    write_kmsg(before)
    source = JournalKmsgSource(None, lookback=0, tick=0.1)
    write_kmsg(after)
    mine = [r.text for r in asyncio.run(collect(source, {after})) if t in r.text]
    source.close()
    assert mine == [after]


@pytest.mark.root
def test_the_journal_source_resumes_after_a_kmsg_position_without_repeating_its_line(journald):
    """A position saved by kmsg (`auto`, `kmsg`) read by `source = "journal"` (a switch by reload): the journal
    seeks by time, and journald files an entry when it receives it, later than the kernel stamped it: the line at
    the position came again, live."""
    t = tag()
    first, second = (f"amdgpu ffff:fe:1f.7: amdgpu: GPU reset begin! {t} {i}" for i in range(2))
    write_kmsg(first)
    probe = JournalKmsgSource(None, lookback=5, tick=0.1)
    seen = asyncio.run(collect(probe, {first}, settle=0.2))
    probe.close()
    position = next(r.cursor for r in seen if r.text == first)
    wait_for(lambda: journal_has(first), 10, what="journald storing the line")
    write_kmsg(second)
    source = JournalSource(position, lookback=0, tick=0.1)
    mine = [r.text for r in asyncio.run(collect(source, {second})) if t in r.text]
    source.close()
    assert mine == [second]
