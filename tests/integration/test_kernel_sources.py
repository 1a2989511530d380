"""Kernel sources against the real kernel log: writes to /dev/kmsg, read back through /dev/kmsg and a real
systemd-journald, and the daemon resuming from its journal cursor across a restart."""

import asyncio
import os
import time

import pytest
from helpers import wait_for, write_kmsg

from gpuwarden.kernel.sources import JournalSource, KmsgSource


def tag() -> str:
    return f"gw{os.getpid()}x{time.time_ns()}"


async def collect(source, want: set[str], timeout: float = 10.0) -> list:
    seen = []
    async def read():
        async for batch in source.batches():
            seen.extend(batch)
            if want <= {r.text for r in seen}:
                return
    await asyncio.wait_for(read(), timeout)
    return seen


@pytest.mark.root
def test_kmsg_source_delivers_new_records_with_their_device():
    t = tag()
    write_kmsg(f"amdgpu ffff:fe:1f.7: amdgpu: before start {t}")  # older than the source: not delivered
    source = KmsgSource(tick=0.1)
    source.start()
    lines = [f"amdgpu ffff:fe:1f.7: amdgpu: ring gfx_0.0.0 timeout {t} {i}" for i in range(3)]
    for line in lines:
        write_kmsg(line)
    seen = asyncio.run(collect(source, set(lines)))
    source.close()
    texts = [r.text for r in seen]
    assert not any("before start" in x and t in x for x in texts)
    assert [x for x in texts if t in x] == lines
    assert all(r.timestamp and r.timestamp > 0 for r in seen)


@pytest.mark.root
def test_journal_source_delivers_kernel_records_with_cursors(journald):
    t = tag()
    source = JournalSource(cursor=None, lookback=0, tick=0.1)
    lines = [f"amdgpu ffff:fe:1f.7: amdgpu: sq_intr: error {t} {i}" for i in range(3)]
    written = time.time()
    for line in lines:
        write_kmsg(line)
    seen = asyncio.run(collect(source, set(lines)))
    source.close()
    mine = [r for r in seen if t in r.text]
    assert [r.text for r in mine] == lines
    assert all(r.cursor for r in mine)
    # the entry's own wall-clock time: what an earlier boot's line is dated by when it comes back as history
    assert all(written - 1 < r.wall < written + 5 for r in mine), [r.wall - written for r in mine]


@pytest.mark.root
def test_daemon_stores_a_kmsg_fault_as_an_event(daemon_factory):
    d = daemon_factory(kernel='source = "kmsg"').start()
    d.wait_log("kernel source: kmsg")
    t = tag()
    write_kmsg(f"amdgpu ffff:fe:1f.7: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1, emitted seq=2 {t}")
    event = wait_for(lambda: next((e for e in d.events() if t in e["evidence"]["line"]), None), 10,
                     what="the stored event")
    assert (event["kind"], event["severity"], event["gpu"]) == ("ring_timeout", "warning", "ffff:fe:1f.7")
    assert 'gpuwarden_events_total{kind="ring_timeout",severity="warning"}' in d.metrics()
    assert d.stop() == 0


@pytest.mark.root
def test_restart_resumes_from_the_journal_cursor_without_loss_or_repeats(daemon_factory, journald):
    d = daemon_factory(kernel='source = "journal"\nlookback = "0s"')
    d.start()
    d.wait_log("kernel source: journal")
    t = tag()
    before = f"amdgpu ffff:fe:1f.7: amdgpu: GPU reset begin! {t} while running"
    write_kmsg(before)
    wait_for(lambda: any(t in e["evidence"]["line"] for e in d.events()), 10, what="the first event")
    assert d.stop() == 0

    while_down = f"amdgpu ffff:fe:1f.7: amdgpu: device lost from bus! {t} while down"
    write_kmsg(while_down)
    time.sleep(0.5)  # journald has it before the daemon comes back
    d.start()
    wait_for(lambda: any("while down" in e["evidence"]["line"] for e in d.events()), 10, what="the missed line")
    time.sleep(1)
    mine = [e["evidence"]["line"] for e in d.events() if t in e["evidence"]["line"]]
    assert mine == [before, while_down]
    assert d.stop() == 0


@pytest.mark.root
def test_restart_under_kmsg_reads_the_lines_logged_while_down_from_the_ring_as_history(daemon_factory):
    """No journal to catch up from (a container, a host without journald: `auto` falls back to kmsg): the kernel's
    ring still holds what was logged while the daemon was down. It opened at the ring's end and lost those lines;
    it resumes after the position it saved, and reports them as history (never acted on)."""
    d = daemon_factory(kernel='source = "kmsg"')
    d.start()
    d.wait_log("kernel source: kmsg")
    t = tag()
    before = f"amdgpu ffff:fe:1f.7: amdgpu: GPU reset begin! {t} while running"
    write_kmsg(before)
    wait_for(lambda: any(t in e["evidence"]["line"] for e in d.events()), 10, what="the first event")
    assert d.stop() == 0

    while_down = f"amdgpu ffff:fe:1f.7: amdgpu: device lost from bus! {t} while down"
    write_kmsg(while_down)
    d.start()
    d.wait_log("kernel source: kmsg")
    after = f"amdgpu ffff:fe:1f.7: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1, emitted seq=2 {t} after"
    write_kmsg(after)
    wait_for(lambda: sum(t in e["evidence"]["line"] for e in d.events()) >= 3, 10, what="the missed and new lines")
    time.sleep(1)
    mine = [e for e in d.events() if t in e["evidence"]["line"]]
    assert [e["evidence"]["line"] for e in mine] == [before, while_down, after]
    assert ["history" in e["evidence"] for e in mine] == [False, True, False]
    assert d.stop() == 0


@pytest.mark.root
def test_auto_picks_the_journal_when_it_holds_kernel_entries(daemon_factory, journald, notify_socket):
    d = daemon_factory(kernel='source = "auto"', env={"NOTIFY_SOCKET": notify_socket.path}).start()
    notify_socket.wait("STATUS=kernel source kmsg (journal catch-up)")
    assert d.stop() == 0


def test_file_source_follows_a_log_file(daemon_factory):
    d = daemon_factory().start()  # the factory's default: source = "file" on a fresh log file
    d.wait_log("kernel source: file")
    with d.log_file.open("a") as log:
        log.write("Dec 02 16:22:28 host kernel: NVRM: Xid (PCI:0000:41:00): 79, pid=1, GPU has fallen off the bus.\n")
    event = wait_for(lambda: next(iter(d.events()), None), 10, what="the event from the file")
    assert (event["kind"], event["gpu"], event["evidence"]["xid"]) == ("xid", "0000:41:00.0", 79)
    assert d.stop() == 0


CONTAINER_DEV = ('host=$(mktemp -d) && mount --bind /dev "$host" && mount -t tmpfs none /dev && '
                 'for n in null zero random urandom; do touch /dev/$n && mount --bind "$host/$n" /dev/$n; done && '
                 'umount -l "$host" && exec "$@"')


@pytest.mark.root
def test_no_readable_kernel_log_leaves_the_daemon_running_degraded_with_its_watchdog(daemon_factory, notify_socket):
    """No /dev/kmsg (the default inside a container): before, the kernel component failed five times, the daemon
    withdrew its watchdog and systemd restarted it every 40 s, forever. Now it is reported once and retried,
    and the daemon runs on, watchdog and all."""
    d = daemon_factory(kernel='source = "kmsg"', env={"NOTIFY_SOCKET": notify_socket.path, "WATCHDOG_USEC": "2000000"})
    # A mount namespace whose /dev has what a container's has (null, zero, random, urandom) but no kmsg.
    d.start("unshare", "-m", "sh", "-c", CONTAINER_DEV, "sh")
    start = notify_socket.wait("READY=1")
    notify_socket.wait("STATUS=kernel source unavailable (kmsg:", after=start)
    end = time.monotonic() + 18  # longer than the five failed starts (1 + 2 + 4 + 8 s) that withdrew the watchdog
    while time.monotonic() < end:
        notify_socket._pump()  # read as a service manager does: an unread socket holds only 10 datagrams
    late = [m for m in notify_socket.messages[start:] if "WATCHDOG=1" in m.split("\n")]
    assert len(late) >= 10, notify_socket.messages[start:]  # one ping a second, all along
    assert "not pinging the watchdog" not in d.log()
    unreadable = [e["message"] for e in d.events() if "no kernel log can be read" in e["message"]]
    assert len(unreadable) == 1 and "(kmsg:" in unreadable[0], [e["message"] for e in d.events()]
    assert d.stop() == 0
