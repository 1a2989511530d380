"""Who owns the other end of a loopback TCP connection, from /proc/net/tcp{,6} (SO_PEERCRED is for unix sockets
only): an accepted socket has its listener's owner. Used where a port number alone is not proof of who serves
it: gpuwarden's exporter port is unprivileged."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

Endpoint = tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]


def peer_uid(sock: socket.socket, proc_net: Path = Path("/proc/net")) -> int | None:
    """The uid of the socket at the other end of `sock` (None: not found, e.g. not on this host)."""
    ours, peer = _endpoint(*sock.getsockname()[:2]), _endpoint(*sock.getpeername()[:2])
    for table in ("tcp", "tcp6"):
        try:
            rows = (proc_net / table).read_text().splitlines()[1:]
        except OSError:
            continue
        mark = f":{peer[1]:04X} "  # the peer's port ends the row's local address: parse only those rows
        for row in rows:
            if mark not in row:
                continue
            cols = row.split()
            if _endpoint_hex(cols[1]) == peer and _endpoint_hex(cols[2]) == ours:
                return int(cols[7])
    return None


def holder(host: str, port: int, timeout: float = 1.0) -> int | None:
    """The uid of whoever accepts connections at host:port (a wildcard is asked on loopback); None when no one
    answers or it cannot be told."""
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    try:
        with socket.create_connection((host, port), timeout) as sock:
            return peer_uid(sock)
    except OSError:
        return None


def pinned(url: str) -> str:
    """`url` with the host `localhost` written as 127.0.0.1. The name resolves to 127.0.0.1 and ::1, an HTTP
    client may try [::1] first, and any user may listen there on the engine's port: the address whose listener's
    owner is checked must be the one scraped and killed for (an engine on ::1 alone is written http://[::1]:…)."""
    parts = urlsplit(url)
    if (parts.hostname or "").lower().rstrip(".") != "localhost":
        return url
    netloc = parts.netloc.rpartition("@")
    host_port = "127.0.0.1" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}{netloc[1]}{host_port}"))


def _endpoint(host: str, port: int) -> Endpoint:
    address = ipaddress.ip_address(host)
    return getattr(address, "ipv4_mapped", None) or address, port


def _endpoint_hex(text: str) -> Endpoint:
    """/proc/net/tcp's ADDR:PORT: the address in 32-bit words of host (little-endian) order, the port in hex."""
    addr, port = text.split(":")
    raw = b"".join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, len(addr), 8))
    address = ipaddress.ip_address(raw)
    return getattr(address, "ipv4_mapped", None) or address, int(port, 16)
