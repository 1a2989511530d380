import os
import socket

from gpuwarden.runtime.sdnotify import Notifier


def test_no_socket_means_nothing_is_sent():
    n = Notifier({})
    assert not n.ready() and not n.status("up") and not n.watchdog()


def test_watchdog_only_for_this_pid():
    assert Notifier({"WATCHDOG_USEC": "30000000"}).watchdog_seconds == 30.0
    assert Notifier({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}).watchdog_seconds == 30.0
    assert Notifier({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}).watchdog_seconds is None
    assert Notifier({"WATCHDOG_USEC": "junk"}).watchdog_seconds is None


def test_abstract_socket_and_message_format():
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"gpuwarden-test-{os.getpid()}"
    server.bind("\0" + name)
    n = Notifier({"NOTIFY_SOCKET": "@" + name})
    assert n.status("two\nlines") and n.reloading()
    assert server.recv(4096) == b"STATUS=two lines"
    first, second = server.recv(4096).decode().split("\n")
    assert first == "RELOADING=1" and second.startswith("MONOTONIC_USEC=")


def test_a_manager_that_does_not_read_never_blocks_the_sender():
    import threading

    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"gpuwarden-test-full-{os.getpid()}"
    server.bind("\0" + name)  # never read: its queue fills after a few datagrams
    n = Notifier({"NOTIFY_SOCKET": "@" + name})
    results = []
    sender = threading.Thread(target=lambda: results.extend(n.status(f"line {i}") for i in range(100)), daemon=True)
    sender.start()
    sender.join(30)  # a generous bound: a blocking send would wait here forever
    assert not sender.is_alive()
    assert results[0] and not all(results)  # the first ones went, the ones that did not fit were dropped
    server.close()
