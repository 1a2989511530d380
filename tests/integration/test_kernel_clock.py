"""The daemon's start on the kernel log's own clock (kernel/clock.py), against the real /dev/kmsg. printk's clock is
not CLOCK_MONOTONIC: on the VM this was found on it ran 0.27 s ahead after 21 hours up, and a fault line logged
just before the start read as live against time.monotonic() (CI: test_old_fault_lines_are_history... failed)."""

import os
import time

import pytest
from helpers import write_kmsg

from gpuwarden.kernel.clock import printk_now
from gpuwarden.kernel.records import parse_kmsg
from watched import watched


def read_back(fd: int, text: str):
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            record = parse_kmsg(os.read(fd, 8192).decode("utf-8", "replace"))
        except BlockingIOError:
            time.sleep(0.01)
            continue
        if record.text == text:
            return record
    raise AssertionError(f"{text!r} not read back from /dev/kmsg")


@pytest.mark.root
def test_a_fault_logged_just_before_the_start_is_history_on_the_kernels_clock():
    line = f"amdgpu ffff:fe:1f.7: amdgpu: sq_intr: error, detail 0x00000000, type 1, sh 1 (clock {time.time_ns()})"
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    try:
        os.lseek(fd, 0, os.SEEK_END)
        written = time.time()
        write_kmsg(line)
        started = printk_now()
        record = read_back(fd, line)
    finally:
        os.close(fd)
    time.sleep(1.0)  # read a second after it was logged, as a start reads what came before it
    assert started is not None and record.timestamp < started
    [event] = [e for e in watched([record], live_since=started) if e.kind == "sq_intr"]
    assert not event.live
    # its time is when it was read; when it was logged comes from its kernel time, on the wall clock (a new user
    # saw every old fault stamped with the daemon's start), counted on CLOCK_MONOTONIC as dmesg -T counts: off by
    # how far printk's clock has drifted from it on this host (0.27 s after 21 hours up, kernel/clock.py; more on
    # a host up for weeks), measured here
    drift = abs(time.monotonic() - printk_now())
    assert event.time - written >= 1.0 and abs(event.evidence["logged_at"] - written) < 0.5 + drift, \
        (event.time - written, event.evidence["logged_at"] - written, drift)


@pytest.mark.root
def test_the_start_line_is_the_users_and_makes_no_event():
    """The line the start writes is filed under the user facility (what no rule reads as the driver's) and names
    the daemon; fed to the kernel watch, it is no event."""
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    try:
        os.lseek(fd, 0, os.SEEK_END)
        started = printk_now()
        deadline, raw = time.monotonic() + 5, ""
        while f"gpuwarden[{os.getpid()}]" not in raw and time.monotonic() < deadline:
            try:
                raw = os.read(fd, 8192).decode()
            except BlockingIOError:
                time.sleep(0.01)
    finally:
        os.close(fd)
    record = parse_kmsg(raw)
    assert record.timestamp == started and record.facility == 1
    assert watched([record], live_since=0.0) == []


def test_no_kernel_log_no_clock(tmp_path):
    """Where /dev/kmsg cannot be written and read back (none, a plain file, no root), the start falls back to
    CLOCK_MONOTONIC: None here."""
    plain = tmp_path / "kmsg"
    plain.write_text("")
    assert printk_now(str(tmp_path / "none")) is None
    assert printk_now(str(plain)) is None
