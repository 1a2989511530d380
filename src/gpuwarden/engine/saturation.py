"""Saturated is not frozen. Any client of an engine's port can open connections that never finish a request head
(1,100 of them ran a llama-server out of descriptors): then the engine cannot accept the canary's connection,
nor a scrape's, though it is healthy and idle. What the kernel shows tells that apart from a hang: a process
holding the engine's listening socket has every descriptor its limit allows (so it cannot accept: the kernel
queues the connections it cannot take), while no process of it is stopped or frozen. Then a failed canary or
scrape is `engine_saturated` (a warning naming who holds the connections), never a reason to kill. An engine
that accepted and did not answer is not saturated.

A full accept queue alone is not taken for saturation: an accept loop that hangs fills it the same (and
/proc/net/tcp shows a listener's queue, not its bound). It is said beside the descriptors.

Synchronous /proc reads (the caller runs them off the loop), each file read whole once: no loop over a user's
numbers beyond the rows of /proc/net/tcp{,6} and the engine's own descriptors."""

from __future__ import annotations

import os
import pwd
from collections import Counter
from pathlib import Path

from gpuwarden.core.counts import plural
from gpuwarden.core.plain import plain
from gpuwarden.runtime.sockets import _endpoint_hex

_LISTEN, _ESTABLISHED = "0A", "01"
_SPARE = 2  # descriptors short of the limit that still count as none left (a library holds one for a moment)


@plain
class Saturation:
    """Why the engine cannot accept now, and the connections to its port by peer (most first)."""

    port: int
    reason: str
    peers: dict[str, int]

    def describe(self) -> str:
        top = ", ".join(f"{peer}: {count}" for peer, count in list(self.peers.items())[:5])
        return f"{self.reason}; {sum(self.peers.values())} connections to it ({top or 'none'})"


def saturation(port: int, pids: list[int], proc: Path = Path("/proc")) -> Saturation | None:
    """Whether the engine (its processes `pids`) cannot accept on `port` because it is saturated; None when it
    is not (nothing listens, a process of it is stopped or frozen, or it has room to accept)."""
    if not pids or any(_frozen(pid, proc) for pid in pids):
        return None  # a frozen engine's queue fills too: that is a hang, not a crowd
    rows = _rows(proc / "net")
    listeners = {r[9]: r for r in rows if r[3] == _LISTEN and _port(r[1]) == port}
    if not listeners:
        return None
    # a listener's tx_queue:rx_queue column: rx_queue is the connections waiting to be accepted
    queued = sum(int(row[4].split(":")[1], 16) for row in listeners.values())
    for pid in pids:
        held, limit = _descriptors(pid, proc, {f"socket:[{inode}]" for inode in listeners})
        if held is not None and limit and held >= limit - _SPARE:
            return Saturation(port, f"pid {pid} holds {held} of the {limit} descriptors its limit allows, "
                              f"{plural(queued, 'connection')} {'waits' if queued == 1 else 'wait'} to be accepted",
                              _peers(rows, port))
    return None


def _rows(proc_net: Path) -> list[list[str]]:
    rows = []
    for table in ("tcp", "tcp6"):
        try:
            rows += [line.split() for line in (proc_net / table).read_text().splitlines()[1:]]
        except OSError:
            continue
    return [r for r in rows if len(r) > 9]


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1], 16)


def _peers(rows: list[list[str]], port: int) -> dict[str, int]:
    """Connections to `port` by peer: a peer on this host by its user (the owner of its end, in the same table),
    another host by its address."""
    owners = {_endpoint_hex(r[1]): int(r[7]) for r in rows if r[3] == _ESTABLISHED}
    counts: Counter[str] = Counter()
    for r in rows:
        if r[3] != _ESTABLISHED or _port(r[1]) != port:
            continue
        peer = _endpoint_hex(r[2])
        uid = owners.get(peer)
        counts[_user(uid) if uid is not None else str(peer[0])] += 1
    return dict(counts.most_common())


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _descriptors(pid: int, proc: Path, listeners: set[str]) -> tuple[int | None, int | None]:
    """How many descriptors the process holds and its soft limit, when it holds one of the listening sockets."""
    fds = proc / str(pid) / "fd"
    try:
        names = os.listdir(fds)
        limits = (proc / str(pid) / "limits").read_text().splitlines()
    except OSError:
        return None, None
    holds = False
    for name in names:
        try:
            holds = os.readlink(fds / name) in listeners
        except OSError:
            continue
        if holds:
            break
    if not holds:
        return None, None
    soft = next((line.split()[3] for line in limits if line.startswith("Max open files")), "unlimited")
    return len(names), int(soft) if soft.isdigit() else None


def _frozen(pid: int, proc: Path) -> bool:
    """Stopped (SIGSTOP, a tracer) or in a frozen cgroup (v2's cgroup.freeze, v1's freezer)."""
    try:
        state = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
        cgroups = (proc / str(pid) / "cgroup").read_text().splitlines()
    except (OSError, IndexError):
        return False
    if state in ("T", "t"):
        return True
    for line in cgroups:
        _, controllers, path = line.split(":", 2)
        try:
            if controllers == "":
                for base in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
                    events = base / path.lstrip("/") / "cgroup.events"
                    if events.exists() and "frozen 1" in events.read_text().splitlines():
                        return True
            elif "freezer" in controllers.split(","):
                state_file = Path("/sys/fs/cgroup/freezer") / path.lstrip("/") / "freezer.state"
                if state_file.read_text().strip() != "THAWED":
                    return True
        except OSError:
            continue
    return False
