"""Where kernel records come from: the journal, /dev/kmsg, or a file. Thin I/O edges.

Each source is an async iterator of batches (lists of KernelRecord). An idle source yields an empty
batch every `tick` seconds so that the caller can close storms and oops reports on time.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

from gpuwarden.kernel.formats import parse_lines
from gpuwarden.kernel.records import KernelRecord, MalformedRecord, parse_kmsg, pci_from_device_field

log = logging.getLogger(__name__)

KMSG = "/dev/kmsg"
_READ_SIZE = 16384  # /dev/kmsg returns one record per read; a short buffer gives EINVAL


class Source:
    name = "source"
    kernel_clock = False  # records' timestamps are the kernel's monotonic time of this boot

    def __init__(self, tick: float = 1.0) -> None:
        self.tick = tick
        self.lines = 0
        self.malformed = 0
        self.overruns = 0

    def batches(self) -> AsyncIterator[list[KernelRecord]]:
        raise NotImplementedError

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
    """/dev/kmsg from its end: only new records. EPIPE (records overwritten unread) is counted."""

    name = "kmsg"
    kernel_clock = True

    def __init__(self, path: str = KMSG, tick: float = 1.0) -> None:
        super().__init__(tick)
        self.path = path
        self._fd: int | None = None

    def _open(self) -> int:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        os.lseek(fd, 0, os.SEEK_END)
        return fd

    def start(self) -> None:
        """Open now, so that records written after start() are never missed."""
        self._fd = self._open()

    async def batches(self) -> AsyncIterator[list[KernelRecord]]:
        if self._fd is None:
            self.start()
        while True:
            await _readable(self._fd, self.tick)
            yield self._drain()

    def _drain(self) -> list[KernelRecord]:
        batch: list[KernelRecord] = []
        while True:
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
                batch.append(parse_kmsg(raw.decode("utf-8", "replace")))
            except MalformedRecord:
                self.malformed += 1

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class JournalSource(Source):
    """Kernel entries of the systemd journal, resumed from a cursor, through the reader's fd."""

    name = "journal"
    kernel_clock = True

    def __init__(self, cursor: str | None, lookback: float, tick: float = 1.0, path: str | None = None) -> None:
        super().__init__(tick)
        self.reader = _kernel_reader(path)
        self._position(cursor, lookback)

    def _position(self, cursor: str | None, lookback: float) -> None:
        r = self.reader
        if cursor:
            try:
                r.seek_cursor(cursor)
                entry = r.get_next()
                if entry and r.test_cursor(cursor):
                    return  # positioned on the cursor's entry: the next get_next() is the first unseen one
                log.warning("journal cursor not found (rotated away?); looking back %.0f s instead", lookback)
            except OSError as exc:
                log.warning("journal cursor unusable (%s); looking back %.0f s instead", exc, lookback)
        # No cursor: this boot's entries of the last `lookback` seconds.
        r.this_boot()
        r.seek_realtime(time.time() - lookback)

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
                continue
            timeout_ms = self.reader.get_timeout_ms()
            timeout = self.tick if timeout_ms < 0 or self.reader.reliable_fd() else min(self.tick, timeout_ms / 1000)
            await _readable(fd, timeout)
            self.reader.process()
            batch = self._drain()
            yield batch

    def _drain(self, limit: int = 2000) -> list[KernelRecord]:
        batch = []
        while len(batch) < limit:
            entry = self.reader.get_next()
            if not entry:
                break
            self.lines += 1
            batch.append(_from_entry(entry))
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
    return KernelRecord(
        text=str(message),
        timestamp=stamp.total_seconds() if stamp is not None else None,
        device=pci_from_device_field(str(device)) if device else None,
        cursor=entry.get("__CURSOR"),
    )


class FileSource(Source):
    """A log file followed from its end, in any format that `formats` reads (for hosts that only log to a
    file). It is polled every `tick`: files offer no readiness to wait on."""

    name = "file"

    def __init__(self, path: Path, tick: float = 1.0) -> None:
        super().__init__(tick)
        self.path = path
        self._offset = path.stat().st_size if path.exists() else 0

    async def batches(self) -> AsyncIterator[list[KernelRecord]]:
        while True:
            yield self._read_new()
            await asyncio.sleep(self.tick)

    def _read_new(self) -> list[KernelRecord]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self._offset:  # truncated or rotated
            self._offset = 0
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        complete = data.rfind(b"\n") + 1
        self._offset += complete
        lines = data[:complete].decode("utf-8", "replace").splitlines()
        self.lines += len(lines)
        parsed = parse_lines(lines)
        self.malformed += parsed.malformed
        return parsed.records
