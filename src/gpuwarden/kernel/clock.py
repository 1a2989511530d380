"""The kernel log's own clock, for telling history from live lines.

kmsg and journal records carry printk's clock (the kernel's local_clock), which is not CLOCK_MONOTONIC: they drift
apart (on the 2-core VM this was found on, printk ran 0.27 s ahead after 21 hours up, ~3.5 ppm). Against
time.monotonic(), a fault line logged just before gpuwarden started read as live, and history must never act. So
the start is read on the kernel's clock: gpuwarden writes one line to /dev/kmsg and reads its stamp back.
"""

from __future__ import annotations

import errno
import os
import select
import time

from gpuwarden.kernel.records import KMSG, MalformedRecord, parse_kmsg


def printk_now(path: str = KMSG, timeout: float = 0.5) -> float | None:
    """The kernel log's clock now, in seconds: the stamp of a line written to `path` (saying that lines from here on
    are live; the kernel files it under the user facility, which no rule reads as the driver's) and read back. None
    where it cannot be written or read back within `timeout` (no root, a read-only /dev/kmsg in a container)."""
    text = f"gpuwarden[{os.getpid()}]: kernel lines from here on are live ({os.urandom(4).hex()})"
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        os.lseek(fd, 0, os.SEEK_END)  # only what comes after: the line below, and whatever the kernel logs
        os.write(fd, f"<6>{text}\n".encode())
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                raw = os.read(fd, 8192)
            except BlockingIOError:
                select.select([fd], [], [], left)
                continue
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overrun by a flood: read on from the oldest left
                    continue
                return None
            if not raw:  # not a kernel log (a file): nothing will come
                return None
            try:
                record = parse_kmsg(raw.decode("utf-8", "replace"))
            except MalformedRecord:
                continue
            if record.text == text:
                return record.timestamp
    except OSError:
        return None
    finally:
        os.close(fd)
    return None


def kernel_now(path: str = KMSG) -> float:
    """printk_now, or CLOCK_MONOTONIC where /dev/kmsg cannot be written or read back (non-root with CAP_SYSLOG, a
    read-only /dev/kmsg): where printk runs behind it, a lookback of 0 counted on CLOCK_MONOTONIC dropped a line
    logged just after the start, so the kernel's own clock first."""
    stamp = printk_now(path)
    return time.monotonic() if stamp is None else stamp
