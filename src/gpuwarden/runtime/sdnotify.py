"""sd_notify(3) without a dependency: one AF_UNIX datagram per message to $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import socket
import time


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self._address = "\0" + address[1:] if address.startswith("@") else address
        self._sock: socket.socket | None = None
        if self._address:
            # non-blocking: a manager that does not read its socket (its queue holds 10 datagrams) must never
            # stall the event loop; a status line that does not fit is dropped
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        self.watchdog_seconds = _watchdog_seconds(env)

    def send(self, *lines: str) -> bool:
        """Send `KEY=VALUE` lines as one datagram; False when not under a notify socket or it failed."""
        if not self._sock:
            return False
        try:
            self._sock.sendto("\n".join(lines).encode(), self._address)
        except OSError:
            return False
        return True

    def ready(self) -> bool:
        return self.send("READY=1")

    def status(self, text: str) -> bool:
        return self.send("STATUS=" + " ".join(text.split()))

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def reloading(self) -> bool:
        return self.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")


def _watchdog_seconds(env: dict[str, str]) -> float | None:
    """The watchdog timeout if it is meant for this process (sd_watchdog_enabled semantics)."""
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    pid = env.get("WATCHDOG_PID")
    if usec <= 0 or (pid and pid != str(os.getpid())):
        return None
    return usec / 1e6
