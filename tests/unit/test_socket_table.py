"""Who serves a port, from the kernel's own tables (gpuwarden/runtime/sockets.py `listeners`; engine/processes.py
`serving_listeners`, `holders`): real listening sockets of this process, on loopback."""

from __future__ import annotations

import os
import resource
import socket
from pathlib import Path

import psutil

from gpuwarden.engine.processes import Reads, Resolved, TargetSpec, holders, port_taken, serving_listeners
from gpuwarden.runtime import sockets


def listening(family: int, host: str) -> socket.socket:
    sock = socket.socket(family)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind((host, 0))
    sock.listen()
    return sock


def test_netlink_and_proc_net_name_the_same_listeners_with_inode_and_owner():
    with listening(socket.AF_INET, "127.0.0.1") as v4, listening(socket.AF_INET6, "::1") as v6:
        for sock in (v4, v6):
            port = sock.getsockname()[1]
            asked = sockets.listeners(port)  # netlink sock_diag
            read = sockets.listeners(port, proc_net=Path("/proc/self/net"))  # the files
            assert [(str(x.address), x.port, x.uid, x.inode) for x in asked] == \
                [(str(x.address), x.port, x.uid, x.inode) for x in read] == \
                [(sock.getsockname()[0], port, os.geteuid(), os.fstat(sock.fileno()).st_ino)]


def test_the_serving_socket_and_its_holder_are_found_among_the_owners_processes_only():
    with listening(socket.AF_INET, "127.0.0.1") as sock:
        port, inode = sock.getsockname()[1], os.fstat(sock.fileno()).st_ino
        [listener] = serving_listeners("127.0.0.1", port)
        assert listener.inode == inode
        assert holders(inode, os.geteuid()) == [os.getpid()]
        assert holders(inode, os.geteuid(), first=[os.getpid()]) == [os.getpid()]
        assert holders(inode, 65534) == []  # nobody's processes: ours are never read for them
        assert serving_listeners("localhost", port, lookup=False) is None  # a name is not resolved on the loop


def _rows(found):
    return sorted((str(x.address), x.port, x.inode) for x in found)


def test_the_kernel_answers_with_the_ports_listeners_alone_both_families_among_many():
    """The port is asked of the kernel (a sock_diag filter), not picked from every listener of the host: 40 others
    here, one per engine on a box of many, each parsed by every look was a cost of the engines squared."""
    others = [listening(socket.AF_INET, "127.0.0.1") for _ in range(40)]
    try:
        with listening(socket.AF_INET, "127.0.0.1") as v4:
            port = v4.getsockname()[1]
            with socket.socket(socket.AF_INET6) as v6:
                v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                v6.bind(("::1", port))
                v6.listen()
                asked = sockets.listeners(port)
                assert _rows(asked) == _rows(sockets.listeners(port, proc_net=Path("/proc/self/net"))) == sorted(
                    [("127.0.0.1", port, os.fstat(v4.fileno()).st_ino), ("::1", port, os.fstat(v6.fileno()).st_ino)])
        everyone = sockets.listeners()  # no port: every listener, as discovery asks
        assert {o.getsockname()[1] for o in others} <= {x.port for x in everyone}
    finally:
        for o in others:
            o.close()


def test_an_answer_left_unread_on_the_kept_socket_is_not_taken_for_the_next_one():
    """A thread keeps its netlink socket between asks; an ask cut short (a timeout mid-answer) leaves the rest of
    its dump queued there, and the kernel refuses another dump on that socket until it is read (EBUSY). The next
    ask is still this port's listener alone, from /proc/net, never a message of the dump of every listener asked
    before; the socket is dropped, and the ask after that makes a new one."""
    with listening(socket.AF_INET, "127.0.0.1") as sock, listening(socket.AF_INET, "127.0.0.1") as other:
        port, expected = sock.getsockname()[1], [("127.0.0.1", sock.getsockname()[1], os.fstat(sock.fileno()).st_ino)]
        sockets.listeners(port)  # the thread's socket is made
        kept = sockets._netlink.socket
        request = sockets._REQUEST.pack(socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 1 << sockets._TCP_LISTEN)
        kept.sendall(sockets._HEADER.pack(sockets._HEADER.size + len(request), sockets._SOCK_DIAG_BY_FAMILY,
                                          sockets._DUMP, 7777, 0) + request)  # every listener, `other` too: unread
        assert _rows(sockets.listeners(port)) == expected
        assert sockets._netlink.socket is None and kept.fileno() == -1
        assert _rows(sockets.listeners(port)) == expected
        assert sockets._netlink.socket is not None
        assert other.getsockname()[1] != port


def test_a_failed_ask_drops_the_kept_socket_and_the_next_makes_another():
    with listening(socket.AF_INET, "127.0.0.1") as sock:
        port = sock.getsockname()[1]
        sockets.listeners(port)
        broken = sockets._netlink.socket
        broken.close()  # its next use fails (OSError): the tables are read from /proc/net instead
        expected = [("127.0.0.1", port, os.fstat(sock.fileno()).st_ino)]
        assert _rows(sockets.listeners(port)) == expected
        assert sockets._netlink.socket is None
        assert _rows(sockets.listeners(port)) == expected
        assert sockets._netlink.socket is not None and sockets._netlink.socket is not broken


def test_a_dump_of_many_parts_is_read_whole_without_waiting():
    """The kept socket never waits (the kernel writes each part of a dump as it is read): 300 listeners on one
    port (SO_REUSEPORT) come in several parts, all read, and from netlink (the kept socket stays: the answer is not
    /proc/net's, as it would be after a read that found nothing there yet)."""
    many = []
    try:
        for _ in range(300):
            sock = socket.socket(socket.AF_INET)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(("127.0.0.1", many[0].getsockname()[1] if many else 0))
            sock.listen()
            many.append(sock)
        port = many[0].getsockname()[1]
        sockets.listeners(port)
        kept = sockets._netlink.socket
        assert kept is not None and kept.gettimeout() == 0.0
        asked = sockets.listeners(port)
        assert sockets._netlink.socket is kept
        assert len(asked) == 300 and _rows(asked) == _rows(sockets.listeners(port, proc_net=Path("/proc/self/net")))
    finally:
        for sock in many:
            sock.close()


def test_whether_a_process_holds_the_engines_socket_is_read_only_up_to_that_socket(monkeypatch):
    """A process on the engine's port that is not among the look's (a squatter, of another user) may hold a million
    descriptors: `port_taken` reads its descriptors until the socket turns up, never all of them (the look keeps
    whole lists only of the engine's own processes). Here this process, its socket opened before thousands of others."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    others = min(20_000, hard - 500)  # as many as this process may hold
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    held = []
    try:
        with listening(socket.AF_INET, "127.0.0.1") as sock:
            port = sock.getsockname()[1]
            held = [os.open("/dev/null", os.O_RDONLY) for _ in range(others)]
            found = Resolved([], os.geteuid(), listeners=sockets.listeners(port), serving=[psutil.Process()],
                             known_uid=os.geteuid() + 1, reads=Reads())
            links, readlink = [], os.readlink
            monkeypatch.setattr(os, "readlink", lambda path, *a: links.append(path) or readlink(path, *a))
            assert port_taken(TargetSpec("port", port=port, host="127.0.0.1"), found, []).startswith(
                f"uid {os.geteuid()}")  # held by "another user" than the engine's: its holder named
            assert 0 < len(links) < 100, len(links)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
