"""The uevent source degrades as the kernel source does: reported once, retried, the watchdog kept."""

import time

import pytest
from helpers import wait_for

# A mount namespace whose /dev lacks /dev/null: pyudev's look-up of libudev (ctypes.util.find_library runs
# ldconfig with its output to /dev/null) then fails, as it does in a bare container.
NO_DEV_NULL = ('host=$(mktemp -d) && mount --bind /dev "$host" && mount -t tmpfs none /dev && '
               'for n in zero random urandom; do touch /dev/$n && mount --bind "$host/$n" /dev/$n; done && '
               'umount -l "$host" && exec "$@"')


@pytest.mark.root
def test_uevents_that_cannot_be_read_leave_the_daemon_running_degraded_with_its_watchdog(daemon_factory,
                                                                                        notify_socket):
    """Before, the uevents component failed over and over and the daemon withdrew its watchdog: systemd would
    restart it forever. Now: one event, STATUS, gpuwarden_source_up 0, and the watchdog pings on."""
    d = daemon_factory(env={"NOTIFY_SOCKET": notify_socket.path, "WATCHDOG_USEC": "2000000"})
    d.start("unshare", "-m", "sh", "-c", NO_DEV_NULL, "sh")
    start = notify_socket.wait("READY=1")

    def degraded():
        notify_socket._pump()
        return next((m for m in notify_socket.messages[start:] if m.startswith("STATUS=kernel source file; ")
                     and "; uevents unavailable (ImportError: No library named udev)" in m), None)
    status = wait_for(degraded, 10, what="STATUS saying uevents are unavailable")
    assert "(down:" not in status, status
    end = time.monotonic() + 18  # longer than the five failed starts (1 + 2 + 4 + 8 s) that withdrew the watchdog
    while time.monotonic() < end:
        notify_socket._pump()  # read as a service manager does: an unread socket holds only 10 datagrams
    late = [m for m in notify_socket.messages[start:] if "WATCHDOG=1" in m.split("\n")]
    assert len(late) >= 10, notify_socket.messages[start:]  # one ping a second, all along
    assert "not pinging the watchdog" not in d.log() and "component uevents failed" not in d.log()
    assert 'gpuwarden_source_up{source="uevents"} 0.0' in d.metrics()
    assert 'gpuwarden_source_up{source="kernel"} 1.0' in d.metrics()
    unreadable = [e["message"] for e in d.events() if "uevents cannot be read" in e["message"]]
    assert len(unreadable) == 1 and "No library named udev" in unreadable[0], [e["message"] for e in d.events()]
    assert d.stop() == 0
