"""Who serves a port, from the kernel's own tables (gpuwarden/runtime/sockets.py `listeners`; engine/processes.py
`serving_listeners`, `holders`): real listening sockets of this process, on loopback."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from gpuwarden.engine.processes import holders, serving_listeners
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
