"""Where kernel records come from: the journal, /dev/kmsg, or a file. Thin I/O edges.

Each source is an async iterator of batches (lists of KernelRecord). An idle source yields an empty
batch every `tick` seconds so that the caller can close storms and oops reports on time. Batches are bounded
(BATCH records) and a source that has more waiting yields to the event loop before the next one: a flood of
kernel lines never blocks the loop.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path

from gpuwarden.kernel.clock import kernel_now
from gpuwarden.kernel.records import KMSG, KernelRecord, MalformedRecord, parse_kmsg, pci_from_device_field
from gpuwarden.runtime.ticks import until_tick

log = logging.getLogger(__name__)

_READ_SIZE = 16384  # /dev/kmsg returns one record per read; a short buffer gives EINVAL
BATCH = 2000  # records per batch at most
FILE_CHUNK = 256 << 10  # bytes of a followed file per batch at most (about 2,000 lines)
BOOT_ID = "/proc/sys/kernel/random/boot_id"
SEEK_MARGIN = 60.0  # seconds a journal seek by a kmsg position goes back (printk's clock against journald's)


class Source:
    name = "source"  # the store's cursor key and the metrics' `source` label
    label = "source"  # what the log and STATUS= call it
    kernel_clock = False  # records' timestamps are the kernel's monotonic time of this boot
    # time.monotonic() by which the caller wants a batch even if nothing comes (an empty one): a line the
    # classifier holds for its process line is released on its own deadline, not at the next tick
    wake_at: float | None = None

    def __init__(self, tick: float = 1.0) -> None:
        self.tick = tick
        self.lines = 0
        self.malformed = 0
        self.overruns = 0

    def batches(self) -> AsyncIterator[list[KernelRecord]]:
        raise NotImplementedError

    def _wait(self) -> float:
        """Seconds to wait for new records: to the next tick on the shared grid (ticks.py, due with the other
        loops' wake-ups), or less when the caller wants to wake up sooner."""
        tick = until_tick(self.tick)
        if self.wake_at is None:
            return tick
        return max(0.0, min(tick, self.wake_at - time.monotonic()))

    def close(self) -> None:
        pass


async def _readable(fd: int, timeout: float) -> None:
    """Wait until `fd` is readable or `timeout` passes."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await asyncio.wait_for(ready, timeout)
    except TimeoutError:
        pass
    finally:
        loop.remove_reader(fd)


class KmsgSource(Source):
    """/dev/kmsg from its end (only new records), or from a position in its ring: each record carries its own,
    `kmsg:BOOT:SEQ:USEC`, as its cursor, and a source that resumes after one (`resumes`: a watch built again, a
    restart) delivers what was logged since, while it is still in the ring. EPIPE (records overwritten unread) is
    counted."""

    name = "kmsg"
    label = "kmsg"
    kernel_clock = True

    def __init__(self, path: str = KMSG, tick: float = 1.0) -> None:
        super().__init__(tick)
        self.path = path
        self.boot = this_boot()
        self._fd: int | None = None
        # Opened at the ring's oldest record, delivery starts further on: only records after sequence number
        # `after_seq` and stamped at or after `floor` (printk's clock) are delivered; those before are read through
        self.after_seq: int | None = None
        self.floor: float | None = None
        self._first: list[KernelRecord] = []  # the oldest record, read to see where the ring begins
        self._skipping = False  # reading through records before where delivery starts
        self._resumed = False  # after a position of its own (resumes()): no journal fills what the ring lost

    def _open(self, at_end: bool = True) -> int:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        if at_end:
            os.lseek(fd, 0, os.SEEK_END)
        return fd

    def start(self) -> None:
        """Open at the end now, so that records written after start() are never missed."""
        self.close()
        self._fd = self._open()
        self._first, self._skipping = [], False

    def open_oldest(self) -> KernelRecord | None:
        """Open at the oldest record still in the kernel's ring and read it (delivered first where wanted): the
        ring's beginning, None where it is empty."""
        self.close()
        self._fd = self._open(at_end=False)
        self._skipping = True
        self._first = self._drain(1)
        self.overruns = 0  # overwritten before it was read: none of ours (_wanted counts what is)
        return self._first[0] if self._first else None

    def resumes(self, position: str | None, oldest: KernelRecord | None, *, past_a_gap: bool = False) -> bool:
        """Whether delivery can start right after `position` (a record's cursor), `oldest` being the ring's
        beginning (open_oldest): a position of this boot whose next record is still in the ring, or, `past_a_gap`
        (nothing else holds what the ring lost), one whose next record was overwritten since: the loss is counted
        as an overrun. Then it does."""
        saved = _kmsg_position(position)
        if not (saved and saved[0] == self.boot and oldest and oldest.seq is not None) \
                or (oldest.seq > saved[1] + 1 and not past_a_gap):
            return False
        self.after_seq, self._resumed = saved[1], True
        return True

    async def batches(self) -> AsyncIterator[list[KernelRecord]]:
        if self._fd is None:
            self.start()
        first, self._first = self._first, []
        if first := self._wanted(first):
            yield first
        while True:
            await _readable(self._fd, self._wait())
            while len(batch := self._drain()) == BATCH:
                yield self._wanted(batch)
                await asyncio.sleep(0)  # more is waiting: let the loop run first
            yield self._wanted(batch)

    def _wanted(self, records: list[KernelRecord]) -> list[KernelRecord]:
        after, floor = self.after_seq, self.floor
        if after is None and floor is None:
            return records
        # (stamps are not in the ring's order across CPUs: the floor holds for every record, not only the first)
        wanted = [r for r in records if not (after is not None and r.seq is not None and r.seq <= after)
                  and not (floor is not None and r.timestamp is not None and r.timestamp < floor)]
        if not self._skipping:
            return wanted
        # Records overwritten while reading through those delivered before (or older than the floor) were none of
        # ours. Resumed after a position they may be: kmsg numbers its records without gaps, so each gap from the
        # position on is records lost (one overrun, as an EPIPE is). The first wanted record, or the ring's end,
        # ends this phase.
        self.overruns = 0
        if self._resumed:
            for record in wanted:
                if record.seq is not None:
                    self.overruns += record.seq > after + 1
                    after = record.seq
        self._skipping = not (wanted or not records)
        return wanted

    def _drain(self, limit: int = BATCH) -> list[KernelRecord]:
        batch: list[KernelRecord] = []
        while len(batch) < limit:
            try:
                raw = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                return batch
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    self.overruns += 1
                    continue
                raise
            if not raw:  # the stream closed under us: reopen at the end
                log.warning("%s closed; reopening", self.path)
                os.close(self._fd)
                self._fd = self._open()
                return batch
            self.lines += 1
            try:
                batch.append(parse_kmsg(raw.decode("utf-8", "replace"), self.boot))
            except MalformedRecord:
                self.malformed += 1
        return batch

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class JournalSource(Source):
    """Kernel entries of the systemd journal, resumed from a cursor, through the reader's fd."""

    name = "journal"
    label = "journal"
    kernel_clock = True

    def __init__(self, cursor: str | None, lookback: float, tick: float = 1.0, path: str | None = None,
                 monotonic: tuple[str, float] | None = None) -> None:
        super().__init__(tick)
        self.reader = _kernel_reader(path)
        self.at_cursor: dict | None = None  # the saved cursor's own entry, once found
        self.after: tuple[str, float] | None = None  # (boot, kernel time): positioned by it (delivered_before)
        self._position(cursor, lookback, monotonic)

    def _position(self, cursor: str | None, lookback: float, monotonic: tuple[str, float] | None) -> None:
        r = self.reader
        if not monotonic and (saved := _kmsg_position(cursor)):  # a position saved by `auto`
            monotonic = (saved[0], saved[2])
        if monotonic:  # (boot id, kernel seconds): entries received from then on, across later boots
            # journald files an entry by when it received it, on CLOCK_MONOTONIC, which printk's clock runs ahead
            # of (kernel/clock.py): the seek goes back a margin, and the kernel's own stamps leave what was delivered
            r.seek_monotonic(max(0.0, monotonic[1] - SEEK_MARGIN), monotonic[0])
            self.after = monotonic
            return
        if cursor:
            try:
                r.seek_cursor(cursor)
                entry = r.get_next()
                if entry and r.test_cursor(cursor):
                    self.at_cursor = entry
                    return  # positioned on the cursor's entry: the next get_next() is the first unseen one
                log.warning("journal cursor not found (rotated away?); looking back %.0f s instead", lookback)
            except OSError as exc:
                log.warning("journal cursor unusable (%s); looking back %.0f s instead", exc, lookback)
        # No cursor: this boot's entries of the last `lookback` seconds.
        r.this_boot()
        r.seek_realtime(time.time() - lookback)

    def delivered_before(self, record: KernelRecord) -> bool:
        """Whether `record` is one delivered before the restart that positioned this source by time (a kmsg
        position): journald files an entry when it receives it, so the seek finds some logged before that time."""
        after = self.after
        return after is not None and record.boot == after[0] and record.timestamp is not None \
            and record.timestamp <= after[1]

    @staticmethod
    def has_kernel_entries(path: str | None = None) -> bool:
        try:
            reader = _kernel_reader(path)
        except (ImportError, OSError):
            return False
        try:
            reader.this_boot()
            reader.seek_tail()
            return bool(reader.get_previous())
        except OSError:
            return False

    async def batches(self) -> AsyncIterator[list[KernelRecord]]:
        fd = self.reader.fileno()
        while True:
            batch = self._drain()
            if batch:
                yield batch
                await asyncio.sleep(0)  # catching up: let the loop run between batches
                continue
            timeout_ms = self.reader.get_timeout_ms()
            timeout = self._wait() if timeout_ms < 0 or self.reader.reliable_fd() \
                else min(self._wait(), timeout_ms / 1000)
            await _readable(fd, timeout)
            self.reader.process()
            batch = self._drain()
            yield batch

    def _drain(self, limit: int = BATCH) -> list[KernelRecord]:
        batch = []
        while len(batch) < limit:
            entry = self.reader.get_next()
            if not entry:
                break
            self.lines += 1
            if not self.delivered_before(record := _from_entry(entry)):
                batch.append(record)
        return batch

    def close(self) -> None:
        self.reader.close()


def _kernel_reader(path: str | None):
    """A journal reader of kernel entries (matches go before any seek)."""
    from systemd import journal

    reader = journal.Reader(path=path) if path else journal.Reader()
    reader.add_match(_TRANSPORT="kernel")
    return reader


def _from_entry(entry: dict) -> KernelRecord:
    message = entry.get("MESSAGE", "")
    if isinstance(message, bytes):
        message = message.decode("utf-8", "replace")
    stamp = entry.get("_SOURCE_MONOTONIC_TIMESTAMP") or entry.get("__MONOTONIC_TIMESTAMP")
    if isinstance(stamp, tuple):  # __MONOTONIC_TIMESTAMP converts to (timedelta, boot id)
        stamp = stamp[0]
    device = entry.get("_KERNEL_DEVICE") or entry.get("_UDEV_SYSNAME")
    wall = entry.get("__REALTIME_TIMESTAMP")  # a datetime (python-systemd converts it)
    return KernelRecord(
        text=str(message),
        timestamp=stamp.total_seconds() if stamp is not None else None,
        device=pci_from_device_field(str(device)) if device else None,
        cursor=entry.get("__CURSOR"),
        boot=str(entry["_BOOT_ID"]) if entry.get("_BOOT_ID") else None,
        metadata=True,
        facility=journal_facility(entry.get("SYSLOG_FACILITY")),
        subsystem=str(entry["_KERNEL_SUBSYSTEM"]) if entry.get("_KERNEL_SUBSYSTEM") else None,
        wall=wall.timestamp() if hasattr(wall, "timestamp") else None,
    )


def journal_facility(value) -> int | None:
    """journald copies each /dev/kmsg record's facility into SYSLOG_FACILITY (1 and up: written by user space)."""
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return 1  # unreadable: not proven to be the kernel's


def this_boot() -> str:
    return Path(BOOT_ID).read_text().strip()


class JournalKmsgSource(Source):
    """`auto` under journald: /dev/kmsg live (journald wakes its readers on a timer; kmsg wakes at once), the
    journal only to catch up after a restart, with no line lost or repeated across the hand-over.

    Each record carries its position as cursor: a journal cursor for catch-up records, `kmsg:BOOT:SEQ:USEC` for
    live ones. On start, kmsg is opened at the oldest record still in the kernel's ring buffer (so nothing
    written from now on is missed) and:
    - a saved kmsg position of this boot whose successor is still in the ring: kmsg alone, after SEQ;
    - otherwise the journal fills the gap: from a saved journal cursor, from a saved kmsg position (seek by boot
      and monotonic time, then only entries the kernel stamped after USEC), or, with nothing saved, from
      `lookback` ago. It hands over at the oldest ring record: journal entries of this boot stamped at or
      after it are left to kmsg, which has them, and delivers only what comes after the saved position (by
      sequence number, or after a journal cursor by the kernel's stamp of the cursor's entry).
    Two distinct records of one boot with the same microsecond stamp straddling a journal cursor would be
    taken for one. A kmsg position compares by sequence number in the ring; in the journal, which keeps no sequence
    number, by the kernel's stamp: a record another CPU stamped at or before the position's but numbered after it
    is taken for delivered (JournalSource.delivered_before).
    """

    name = "journal"  # its cursors continue those of `source = "journal"`
    label = "kmsg (journal catch-up)"  # it reads kmsg live: "journal" would read as the slow source
    kernel_clock = True

    @property  # type: ignore[override]
    def wake_at(self) -> float | None:  # the live part is kmsg's: it waits
        return self._kmsg.wake_at

    @wake_at.setter
    def wake_at(self, value: float | None) -> None:
        self._kmsg.wake_at = value

    def __init__(self, position: str | None, lookback: float, tick: float = 1.0, kmsg_path: str = KMSG,
                 journal_path: str | None = None) -> None:
        super().__init__(tick)
        self._kmsg = kmsg = KmsgSource(kmsg_path, tick)
        self.boot = kmsg.boot
        oldest = kmsg.open_oldest()  # where the journal hands over
        self._handover = oldest.timestamp if oldest else kernel_now(kmsg_path)
        self._journal: JournalSource | None = None
        self._journal_lines = 0
        if kmsg.resumes(position, oldest):
            return
        if saved := _kmsg_position(position):
            self._journal = JournalSource(None, lookback, tick, journal_path, monotonic=(saved[0], saved[2]))
            kmsg.after_seq = saved[1] if saved[0] == self.boot else None
            return
        self._journal = JournalSource(position, lookback, tick, journal_path)
        if (entry := self._journal.at_cursor) is not None:  # a journal cursor: kmsg resumes after its entry
            record = _from_entry(entry)
            kmsg.floor = record.timestamp + 1e-6 if record.boot == self.boot and record.timestamp is not None \
                else None
        elif not position:
            kmsg.floor = kernel_now(kmsg_path) - lookback

    async def batches(self) -> AsyncIterator[list[KernelRecord]]:
        while self._journal is not None:
            batch = self._catch_up()
            self._count()
            if batch:
                yield batch
                await asyncio.sleep(0)
        async for batch in self._kmsg.batches():
            self._count()
            yield batch

    def _catch_up(self) -> list[KernelRecord]:
        """The next journal entries before the hand-over point; closes the journal when there are no more."""
        batch: list[KernelRecord] = []
        reader = self._journal.reader
        while len(batch) < BATCH:
            entry = reader.get_next()
            if not entry:
                break
            record = _from_entry(entry)
            boot = record.boot
            if boot == self.boot and record.timestamp is not None and record.timestamp >= self._handover:
                break  # kmsg has this one and everything after it
            if self._journal.delivered_before(record):
                continue
            self._journal_lines += 1
            batch.append(record)
        if len(batch) < BATCH:
            self._journal.close()
            self._journal = None
        return batch

    def _count(self) -> None:
        self.lines = self._journal_lines + self._kmsg.lines
        self.malformed = self._kmsg.malformed
        self.overruns = self._kmsg.overruns

    def close(self) -> None:
        self._kmsg.close()
        if self._journal is not None:
            self._journal.close()


def _kmsg_position(position: str | None) -> tuple[str, int, float] | None:
    """(boot id, sequence number, kernel time) of a saved `kmsg:BOOT:SEQ:USEC` position, else None."""
    if not position or not position.startswith("kmsg:"):
        return None
    try:
        _, boot, seq, usec = position.split(":")
        return boot, int(seq), float(usec)
    except ValueError:
        return None


class FileSource(Source):
    """A log file followed from its end, in any format that `formats` reads (for hosts that only log to a
    file). It is polled every `tick`: files offer no readiness to wait on."""

    name = "file"
    label = "file"

    def __init__(self, path: Path, tick: float = 1.0) -> None:
        super().__init__(tick)
        # Imported here: only a file is text to parse (formats.py compiles 14 expressions); kmsg and the journal
        # hand records over whole
        from gpuwarden.kernel.formats import parse_lines

        self._parse = parse_lines
        self.path = path
        self._offset = path.stat().st_size if path.exists() else 0

    async def batches(self) -> AsyncIterator[list[KernelRecord]]:
        while True:
            batch, more = self._read_new()
            yield batch
            await asyncio.sleep(0 if more else self._wait())  # a flood is read in bounded chunks, the loop between

    def _read_new(self, limit: int = FILE_CHUNK) -> tuple[list[KernelRecord], bool]:
        """The complete lines added since the last read, at most `limit` bytes of them, and whether more wait."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return [], False
        _regular(st.st_mode, self.path)  # a directory would read as an idle log for ever, a FIFO block the loop
        if st.st_size < self._offset:  # truncated or rotated
            self._offset = 0
        if st.st_size == self._offset:
            return [], False  # nothing new: not opened (an idle log costs one stat a tick)
        size = st.st_size
        # non-blocking: swapped for a FIFO since the stat, the open still returns, and fstat refuses it
        with open(os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
            _regular(os.fstat(f.fileno()).st_mode, self.path)
            f.seek(self._offset)
            data = f.read(limit)
        complete = data.rfind(b"\n") + 1 or (len(data) if len(data) == limit else 0)  # a line longer than a chunk
        self._offset += complete
        lines = data[:complete].decode("utf-8", "replace").splitlines()
        self.lines += len(lines)
        parsed = self._parse(lines)
        self.malformed += parsed.malformed
        return parsed.records, self._offset < size


def _regular(mode: int, path: Path) -> None:
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, "the kernel log file is not a regular file", str(path))
