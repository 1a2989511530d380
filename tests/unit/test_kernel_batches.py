"""A flood of kernel records never blocks the event loop: the kmsg reader hands out bounded batches and lets
the loop run between them.

/dev/kmsg returns one record per read(); a SOCK_SEQPACKET socket pair keeps the same record boundaries, so the
test can queue a backlog of thousands of records without writing them into the host's real kernel log.
"""

import asyncio
import itertools
import socket

from gpuwarden.core.model import NullSink
from gpuwarden.kernel.sources import BATCH, KmsgSource

RECORDS = 3 * BATCH + 123


def test_a_flood_comes_in_bounded_batches_with_the_loop_running_between_them():
    reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    reader.setblocking(False)
    writer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)  # the whole backlog fits, queued at once
    for i in range(RECORDS):
        writer.send(f"3,{i},{i},-;amdgpu: flood {i}".encode())
    source = KmsgSource(tick=0.05)
    source._fd = reader.fileno()  # the reader's fd stands in for /dev/kmsg
    order: list[str] = []
    sizes: list[int] = []

    async def ticker():
        while True:
            order.append("tick")
            await asyncio.sleep(0)

    async def consume():
        seen = 0
        async for batch in source.batches():
            sizes.append(len(batch))
            order.append("batch")
            seen += len(batch)
            if seen >= RECORDS:
                return

    async def main():
        tick = asyncio.create_task(ticker())
        await asyncio.wait_for(consume(), 30)
        tick.cancel()

    try:
        asyncio.run(main())
    finally:
        reader.close()
        writer.close()
    assert sizes == [BATCH, BATCH, BATCH, 123]
    batches = [i for i, what in enumerate(order) if what == "batch"]
    assert all("tick" in order[a:b] for a, b in itertools.pairwise(batches))


def test_a_quiet_source_wakes_at_the_callers_deadline_not_its_tick():
    """A fault line held for its process line is released on its own deadline: the watch sets `wake_at` and the
    source yields an (empty) batch then, though its tick is an hour and nothing is written."""
    import time

    reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    reader.setblocking(False)
    source = KmsgSource(tick=3600)
    source._fd = reader.fileno()  # the reader's fd stands in for /dev/kmsg
    source.wake_at = time.monotonic() + 0.05

    async def first_batch():
        async for batch in source.batches():
            return batch

    try:
        assert asyncio.run(asyncio.wait_for(first_batch(), 30)) == []
    finally:
        reader.close()
        writer.close()


def test_a_batch_that_breaks_the_watch_is_left_behind_and_said_lost(monkeypatch):
    """Read again by the watch built next (the supervisor's restart resumes at the last position read), a batch that
    broke the classifier would break that watch too: a line a user can make the kernel print would blind it for
    good. The watch that failed moves its position past the batch, and its failure says the lines are lost."""
    from gpuwarden.config.settings import KernelConfig
    from gpuwarden.kernel.records import KernelRecord
    from gpuwarden.kernel.sources import Source
    from gpuwarden.kernel.watch import KernelWatch, KernelWatchFailed

    class Batches(Source):
        name = "journal"
        kernel_clock = True

        def __init__(self, *batches):
            super().__init__()
            self.given = batches

        async def batches(self):
            for batch in self.given:
                yield batch

    good = [KernelRecord(text="fine", cursor="c1")]
    poison = [KernelRecord(text="poison", cursor="c2"), KernelRecord(text="poison too", cursor="c3")]
    watch = KernelWatch(KernelConfig(source="journal"), NullSink(), "c0")
    feed_all = watch.classifier.feed_all

    def breaks(records, now):
        if any("poison" in r.text for r in records):
            raise ValueError("a bug")
        return feed_all(records, now)
    monkeypatch.setattr(watch.classifier, "feed_all", breaks)

    async def opened():
        return Batches(good, poison)
    watch._open = opened
    try:
        asyncio.run(watch.run())
    except KernelWatchFailed as exc:
        assert str(exc) == "2 kernel lines left unread after ValueError: a bug"
    else:
        raise AssertionError("the watch did not fail")
    assert watch.cursor == "c3"


def records_socket(*seqs: int) -> tuple[socket.socket, socket.socket]:
    """(reader, writer): the reader's records are /dev/kmsg's, numbered `seqs` (a gap is records the ring
    overwrote); the writer kept open, as the kernel's end is."""
    reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    reader.setblocking(False)
    for seq in seqs:
        writer.send(f"3,{seq},{seq * 1000},-;amdgpu: line {seq}".encode())
    return reader, writer


def resumed(ends: tuple[socket.socket, socket.socket], position: str, *,
            past_a_gap: bool) -> tuple[KmsgSource, bool]:
    """A KmsgSource on the reader of `ends` opened at its oldest record (as open_oldest does on /dev/kmsg), then
    resumed."""
    source = KmsgSource(tick=0.05)
    source.ends = ends
    source._fd, source._skipping = ends[0].fileno(), True
    source._first = source._drain(1)
    return source, source.resumes(position, source._first[0], past_a_gap=past_a_gap)


def delivered(source: KmsgSource) -> list[int]:
    """The sequence numbers it delivers until the reader is drained (its first empty batch after the first)."""
    async def read():
        seqs = []
        async for batch in source.batches():
            if not batch and seqs:
                return seqs
            seqs += [r.seq for r in batch]
    return asyncio.run(read())


def test_a_resumed_kmsg_counts_the_records_the_ring_lost_after_its_position():
    """kmsg numbers its records without gaps: resumed after 5 with 6-9 overwritten while it was not read, it
    delivers 10 on and counts the loss (one overrun, as an EPIPE is), not nothing."""
    boot = KmsgSource().boot
    source, resumes = resumed(records_socket(3, 4, 5, 10, 11), f"kmsg:{boot}:5:0.005", past_a_gap=False)
    assert resumes
    assert delivered(source) == [10, 11]
    assert source.overruns == 1


def test_a_kmsg_position_the_ring_no_longer_holds_resumes_past_the_gap_only_where_asked():
    boot = KmsgSource().boot
    source, resumes = resumed(records_socket(8, 9, 10), f"kmsg:{boot}:5:0.005", past_a_gap=False)
    assert not resumes  # auto: the journal fills the gap (JournalKmsgSource), and kmsg goes on after it
    source.after_seq = 5
    assert delivered(source) == [8, 9, 10]
    assert source.overruns == 0  # none lost: the journal had them
    source, resumes = resumed(records_socket(8, 9, 10), f"kmsg:{boot}:5:0.005", past_a_gap=True)
    assert resumes  # kmsg alone: what the ring still holds, the loss said
    assert delivered(source) == [8, 9, 10]
    assert source.overruns == 1
    source, resumes = resumed(records_socket(4, 5, 6, 7), f"kmsg:{boot}:5:0.005", past_a_gap=False)
    assert resumes
    assert delivered(source) == [6, 7]
    assert source.overruns == 0


def test_a_files_journal_cursors_are_not_taken_for_a_position_in_the_kernel_log():
    """A followed file of journal-JSON lines carries the cursors of whatever journal wrote it: saved as the kernel
    log's position, a later `journal` or `auto` source would seek to them."""
    from gpuwarden.config.settings import KernelConfig
    from gpuwarden.kernel.records import KernelRecord
    from gpuwarden.kernel.sources import Source
    from gpuwarden.kernel.watch import KernelWatch

    class File(Source):
        name = "file"

        async def batches(self):
            yield [KernelRecord(text="amdgpu: a line of a file", cursor="s=another;i=1")]

    class Positions(NullSink):
        def __init__(self):
            self.saved = []

        def record(self, events, cursor=None):
            self.saved.append(cursor)
            return list(range(len(events)))

    sink = Positions()
    watch = KernelWatch(KernelConfig(source="file", file="/nonexistent"), sink, "kmsg:b:1:0.1")

    async def opened():
        return File()
    watch._open = opened
    asyncio.run(watch.run())
    assert watch.cursor == "kmsg:b:1:0.1"
    assert not [c for c in sink.saved if c]
