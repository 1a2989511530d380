"""Who serves a TCP port, from the kernel's own socket tables (/proc/net/tcp{,6}): the owner of the other end of a
loopback connection (SO_PEERCRED is for unix sockets only: an accepted socket has its listener's owner), and each
listening socket's address, owner and inode (`listeners`: which process holds that inode is then asked of that
owner's processes alone, engine/processes.py). Used where a port number alone is not proof of who serves it:
gpuwarden's exporter port and the engines' ports are unprivileged. Reading these tables costs the host's sockets,
never its file descriptors (psutil.net_connections reads the link of every descriptor of every process)."""

from __future__ import annotations

import ipaddress
import socket
import struct
import threading
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from gpuwarden.core.plain import plain

Endpoint = tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]
_LISTEN = "0A"  # TCP_LISTEN, the row's st column


@plain
class Listener:
    """A listening TCP socket: the address it is bound to (an IPv4-mapped one as IPv4), its owner and inode."""

    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int
    uid: int
    inode: int


def peer_uid(sock: socket.socket, proc_net: Path = Path("/proc/net")) -> int | None:
    """The uid of the socket at the other end of `sock` (None: not found, e.g. not on this host)."""
    ours, peer = _endpoint(*sock.getsockname()[:2]), _endpoint(*sock.getpeername()[:2])
    for cols in _rows(proc_net, peer[1]):
        if _endpoint_hex(cols[1]) == peer and _endpoint_hex(cols[2]) == ours:
            return int(cols[7])
    return None


def listeners(port: int | None = None, proc_net: Path = Path("/proc/net")) -> list[Listener]:
    """The listening sockets on `port` (every port: None) in the network namespace of `proc_net`. They name no
    process: who holds a socket is found by its inode in /proc/PID/fd. This namespace's are asked of the kernel
    over netlink (sock_diag, listening sockets on `port` only: /proc/net/tcp walks every bucket of the connection
    table, 9 ms a read on a host with 27 sockets); the files are read where netlink cannot answer."""
    if proc_net == Path("/proc/net"):
        try:
            return _asked(port)
        except OSError:
            pass
    out = []
    for cols in _rows(proc_net, port):
        if cols[3] == _LISTEN and int(cols[9]):  # inode 0: a socket being torn down, held by no one
            address, bound = _endpoint_hex(cols[1])
            if port is None or bound == port:
                out.append(Listener(address, bound, int(cols[7]), int(cols[9])))
    return out


_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY, _NLMSG_ERROR, _NLMSG_DONE = 4, 20, 2, 3
_DUMP = 0x1 | 0x300  # NLM_F_REQUEST | NLM_F_DUMP
_TCP_LISTEN = 10
_HEADER = struct.Struct("=IHHII")  # nlmsghdr
_REQUEST = struct.Struct("=BBBBI48x")  # inet_diag_req_v2: family, protocol, ext, pad, states, an empty sockid
_MESSAGE = struct.Struct("=BBBB2s2s16s16sI8sIIIII")  # inet_diag_msg
# INET_DIAG_REQ_BYTECODE: the kernel's filter (inet_diag_bc_run), "local port >= P, then <= P", in ops of
# inet_diag_bc_op (code, yes, no) each followed by one whose `no` holds the port; a test that fails jumps past the
# end (no = what is left + 4), which rejects the socket. S_GE and S_LE, not S_EQ: those are in every kernel.
_INET_DIAG_REQ_BYTECODE, _BC_S_GE, _BC_S_LE = 1, 2, 3
_OP = struct.Struct("=BBH")
_BYTECODE = struct.Struct("=HH")  # nlattr


def _port_filter(port: int) -> bytes:
    ops = _OP.pack(_BC_S_GE, 8, 20) + _OP.pack(0, 0, port) + _OP.pack(_BC_S_LE, 8, 12) + _OP.pack(0, 0, port)
    return _BYTECODE.pack(_BYTECODE.size + len(ops), _INET_DIAG_REQ_BYTECODE) + ops


class _Kept(socket.socket):
    """A thread's sock_diag socket, closed when its thread ends (with the thread's locals): not left to the garbage
    collector's "unclosed socket" warning."""

    def __del__(self) -> None:
        self.close()


_netlink = threading.local()  # .socket: the thread's _Kept, made at its first ask (a look asks twice a scrape)


def _asked(port: int | None) -> list[Listener]:
    """The listeners of both families from the kernel, over this thread's netlink socket (closed and made again
    after a failed ask, which may have left part of an answer unread)."""
    if (nl := getattr(_netlink, "socket", None)) is None:
        nl = _netlink.socket = _Kept(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG)
        # never waits: the kernel writes each part of a dump when it is asked (the request, then each read), so
        # a read finds it there; one that would wait is a failed ask (BlockingIOError). A timeout made each ask
        # set it again and poll before each call: 4 system calls of 7 an ask, 16 of every engine's scrape
        nl.setblocking(False)
    try:
        return [found for family in (socket.AF_INET, socket.AF_INET6) for found in _diag(nl, family, port)]
    except BaseException:
        _netlink.socket = None
        nl.close()
        raise


def _diag(nl: socket.socket, family: int, port: int | None = None) -> list[Listener]:
    """The TCP sockets of `family` in the LISTEN state (on `port`: every one, None), from the kernel's sock_diag
    over `nl` (non-blocking: `_asked`). The kernel passes over another port's sockets (an engine's look asked
    this of every listener on the host); an answer to an earlier request (another sequence number) is skipped."""
    _netlink.sequence = sequence = (getattr(_netlink, "sequence", 0) + 1) & 0xFFFFFFFF
    request = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN)
    if port is not None:
        request += _port_filter(port)
    out = []
    nl.sendall(_HEADER.pack(_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _DUMP, sequence, 0) + request)
    while True:
        data = nl.recv(1 << 16)
        if not data:
            raise OSError("sock_diag: no answer")
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, kind, _, seq = _HEADER.unpack_from(data, offset)[:4]
            if length < _HEADER.size:
                raise OSError("sock_diag: a malformed answer")
            if seq == sequence:
                if kind == _NLMSG_DONE:
                    return out
                if kind == _NLMSG_ERROR:
                    raise OSError("sock_diag: the kernel refused the request")
                fields = _MESSAGE.unpack_from(data, offset + _HEADER.size)
                bound, src, uid, inode = int.from_bytes(fields[4], "big"), fields[6], fields[13], fields[14]
                if inode and (port is None or bound == port):
                    address = ipaddress.ip_address(src[:4] if family == socket.AF_INET else src)
                    out.append(Listener(getattr(address, "ipv4_mapped", None) or address, bound, uid, inode))
            offset += (length + 3) & ~3


def _rows(proc_net: Path, port: int | None):
    """The split rows of tcp and tcp6 whose local port may be `port` (every row: None)."""
    mark = None if port is None else f":{port:04X} "  # the port ends the row's local address: split only those
    for table in ("tcp", "tcp6"):
        try:
            with open(proc_net / table) as f:
                next(f, None)  # the header
                for row in f:
                    if mark is None or mark in row:
                        yield row.split()
        except OSError:
            continue


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
