"""Which processes make up an engine, and which GPUs they hold. Synchronous psutil/procfs reads: callers run
them off the event loop.

Who may be killed is decided here, once and strictly. The engine's user is the configured `target.user`, else
the owner of the socket that serves its metrics_url (the process whose /metrics said it stalled). A target's
roots are refused when they are PID 1, gpuwarden, one of its ancestors, a kernel thread, or not wholly (real,
effective and saved uid) the engine's user; only then are descendants and the process group added, and the
tree is never followed into another user's process. A `docker` target's roots are what a trusted Engine API
names, each proven by its cgroup (engine/dockerapi.py).

Orphans: a walk down the tree loses descendants whose parent exited, so a tracker remembers every descendant
it has seen (by pid and start time, so a reused pid is never mistaken for it), and also takes members of the
root's process group when the root leads that group. That group is found only by reading every process of the
engine's user: a scrape's look skips it unless something changed (Tracker.refresh); a kill's look reads it.
"""

from __future__ import annotations

import ipaddress
import math
import os
import pwd
import re
import socket
import stat
import subprocess
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from gpuwarden import enginekinds
from gpuwarden.core.model import normalize_pci
from gpuwarden.core.plain import plain
from gpuwarden.engine.dockerapi import container_pids
from gpuwarden.gpu import vendors
from gpuwarden.runtime import sockets
from gpuwarden.runtime.logsetup import redact_command
from gpuwarden.runtime.procfs import read_small
from gpuwarden.runtime.sockets import Listener


@plain
class TargetSpec:
    """How an engine's processes are found: by port, pidfile, command line, unit, cgroup or container."""

    kind: str  # port | pidfile | cmdline | unit | cgroup | docker
    port: int | None = None
    host: str | None = None  # metrics_url's host: with `port`, the socket that serves it
    pidfile: Path | None = None
    pattern: str | None = None
    unit: str | None = None
    cgroup: Path | None = None
    container: str | None = None
    docker_socket: Path = Path("/var/run/docker.sock")
    uid: int | None = None  # the engine's user when configured; else the owner of the serving socket


@dataclass(frozen=True, eq=False, repr=False)
class Resolved:
    """A target's root processes now, the engine's user, and each candidate refused with why; and the sockets
    that serve metrics_url's address (`listeners`) with the processes that hold them (`serving`)."""

    roots: list[psutil.Process]
    uid: int | None
    refused: list[str] = field(default_factory=list)
    listeners: list[Listener] = field(default_factory=list)
    serving: list[psutil.Process] = field(default_factory=list)
    known_uid: int | None = None  # the engine's user as configured or known before this look (not its socket's)
    reads: Reads | None = None  # this look's reads of /proc (PID 1, gpuwarden and its ancestors as it found them)


def resolve(spec: TargetSpec, known_uid: int | None = None, known: Iterable[int] = ()) -> Resolved:
    """`known_uid`, `known`: the engine's user and pids as the last look found them. The user, once known, stays
    the engine's (a listener of another user on its port is not the engine: `port_taken`); its pids are asked
    first whether they hold the serving socket."""
    engine_uid = spec.uid if spec.uid is not None else known_uid
    reads = Reads()
    listening, serving = _serving(spec.host, spec.port, engine_uid, known, reads) if spec.port else ([], [])
    uid = engine_uid if engine_uid is not None else _only_uid(serving)
    candidates, refused = _candidates(spec, serving)
    if engine_uid is None and uid is None and serving:
        refused.append(f"the engine's user is ambiguous: {spec.host or '127.0.0.1'}:{spec.port} is served by "
                       f"processes of several users ({', '.join(describe(p) for p in serving[:4])}); set "
                       "[engine.target] user")
    accepted = []
    for proc in candidates:
        if why := refusal(proc, uid, reads):
            refused.append(f"{describe(proc)}: {why}")
        else:
            accepted.append(proc)
    return Resolved(accepted, uid, refused, listening, serving, engine_uid, reads)


# a secret's value in a command line: `--api-key X`, `--token=X`, `HF_TOKEN=X` (the holder's command goes into events)
_SECRET = re.compile(r"((?:--?[\w-]*(?:key|token|secret|passw(?:or)?d)[\w-]*[ =])"
                     r"|(?:\b\w*(?:KEY|TOKEN|SECRET|PASSWORD)\w*=))\S+", re.I)


def port_taken(spec: TargetSpec, found: Resolved, procs: list[psutil.Process]) -> str | None:
    """Who holds the socket that serves the engine's address when, on the evidence, that is not the engine (None:
    the engine, no one, or it cannot be told). Not the engine: a process of the engine's tree (`procs`, this
    look's) does not hold it and either its owner is not the engine's user as configured or known before this
    look, or the engine's processes run (a target that found them) and none of them holds it. Root holding it
    for a `docker` target is docker-proxy publishing the container's port. Before any user is known, the first
    server seen is the engine, as ever: [engine.target] user says it from the start."""
    ours, reads = {p.pid for p in procs}, found.reads or Reads()
    for listener in found.listeners:
        holders = [p for p in found.serving if reads.holds(p.pid, f"socket:[{listener.inode}]")]
        if any(p.pid in ours for p in holders) or (spec.kind == "docker" and listener.uid == 0):
            continue
        foreign = found.known_uid is not None and listener.uid != found.known_uid
        if foreign or (procs and spec.kind != "port"):
            who = ", ".join(_SECRET.sub(r"\1***", describe(p)) for p in holders[:4]) or "a process gpuwarden cannot see"
            return f"uid {listener.uid} ({_user_name(listener.uid)}): {who}"
    return None


def _candidates(spec: TargetSpec, serving: list[psutil.Process]) -> tuple[list[psutil.Process], list[str]]:
    if spec.kind == "port":
        return serving, []
    if spec.kind == "pidfile":
        return _from_pidfile(spec.pidfile)
    if spec.kind == "cmdline":
        return _matching(re.compile(spec.pattern)), []
    if spec.kind in ("unit", "cgroup"):
        return _in_cgroup(spec.cgroup if spec.kind == "cgroup" else _unit_cgroup(spec.unit)), []
    if spec.kind == "docker":
        pids, refused = container_pids(spec.docker_socket, spec.container)
        return _alive(pids), refused
    raise ValueError(f"no process roots for target kind {spec.kind!r}")


def refusal(proc: psutil.Process, uid: int | None, reads: Reads) -> str | None:
    """Why `proc` may not be an engine's root (None: it may); `reads`: the look's."""
    if not reads.killable(proc.pid):
        return "PID 1, gpuwarden, one of its ancestors or a kernel thread"
    if uid is None:
        return "the engine's user is unknown (nothing serves its metrics_url here; set [engine.target] user)"
    if not reads.owned_by(proc.pid, uid):
        return f"runs as another user than the engine's ({_user_name(uid)})"
    return None


def _serving(host: str | None, port: int, uid: int | None, known: Iterable[int],
             reads: Reads) -> tuple[list[Listener], list[psutil.Process]]:
    """The sockets that serve host:port (`serving_listeners`) and the processes that hold them: each socket's
    inode looked for among its owner's processes (and the engine's user's, `uid`: a socket root made, as
    systemd's socket activation does, is held by the user's server), the engine's known pids first. Only those
    users' descriptors are read: another user holding a million of them costs this look nothing."""
    listening = serving_listeners(host, port) or []
    pids: set[int] = set()
    for listener in listening:
        for owner in dict.fromkeys(u for u in (uid, listener.uid) if u is not None):
            # another user's socket on the engine's port (a squatter's) is searched for its holder, to name it,
            # within a bound: that user may hold a million descriptors
            limit = None if uid is None or owner == uid else FOREIGN_LINKS
            if found := holders(listener.inode, owner, known, limit, reads):
                pids.update(found)
                break
    return listening, _alive(pids)


def serving_listeners(host: str | None, port: int, lookup: bool = True) -> list[Listener] | None:
    """The listening sockets a connection to host:port reaches, for each address the host names: the kernel's
    choice (`serves`). Another user's listener beside the engine's on another family (a `[::]` next to
    `0.0.0.0`, a `[::1]`) serves another address, and is not counted. From the kernel's socket tables: the cost
    of the host's sockets, no process's descriptors. `lookup` False: a host that is a name is not resolved (a
    lookup may block), and the answer is None."""
    addresses = _addresses(host or "127.0.0.1", lookup)
    if addresses is None:
        return None
    listening = sockets.listeners(port)
    inodes = {inode for address in addresses
              for inode in serves(address, [(listener.address, listener.inode) for listener in listening])}
    return [listener for listener in listening if listener.inode in inodes]


FOREIGN_LINKS = 20_000  # descriptors read at most to name the holder of a socket not the engine user's


def holders(inode: int, uid: int, first: Iterable[int] = (), limit: int | None = None,
            reads: Reads | None = None) -> list[int]:
    """The processes of `uid` that hold the socket `inode` open. The `first` pids (the engine's as last seen)
    are asked first: when one of them holds it, no other is read (a socket is shared only by inheritance, and
    the tracker adds the tree); else every process of `uid`, and no other user's. `limit`: the most descriptors
    read in all (what is found by then). `reads`: a look's, which keeps what the `first` pids' descriptors link
    to for the rest of the look (unless `limit` bounds the search)."""
    link, budget = f"socket:[{inode}]", [limit if limit is not None else -1]
    first = list(dict.fromkeys(first))
    if reads is not None and limit is None:
        found = [pid for pid in first if reads.uid(pid) == uid and link in reads.links(pid)]
    else:
        found = [pid for pid in first if _uid_of(pid) == uid and _holds(pid, link, budget)]
    return found or [pid for pid in pids_of(uid) if pid not in first and _holds(pid, link, budget)]


def pids_of(uid: int, strict: bool = True, proc: Path = Path("/proc")) -> list[int]:
    """The pids of `uid`'s processes, by the owner of /proc/PID (the process's effective uid, or root's for one
    that is not dumpable). `strict`: for root each one's real uid is read too, so that a user's non-dumpable
    processes (whose descriptors are the user's to multiply) are not taken for root's; without it root's list
    may hold them (a tree is checked process by process anyway). A user's non-dumpable process is missed: the
    tree never includes it."""
    out = []
    with os.scandir(proc) as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                if entry.stat(follow_symlinks=False).st_uid == uid and \
                        (uid != 0 or not strict or _uid_of(int(entry.name)) == 0):
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def _uid_of(pid: int) -> int | None:
    """The process's real uid (/proc/PID/status), None when gone."""
    uids = _uids(pid)
    return uids[0] if uids else None


def _links(pid: int, proc: str = "/proc") -> list[str] | None:
    """What each of the process's descriptors links to; None when they cannot be read."""
    try:
        with os.scandir(f"{proc}/{pid}/fd") as entries:
            out = []
            for entry in entries:
                try:
                    out.append(os.readlink(entry.path))
                except OSError:
                    continue  # closed meanwhile
            return out
    except OSError:
        return None


def _holds(pid: int, link: str, budget: list[int] | None = None) -> bool:
    """The process has a descriptor open on `link` (`socket:[inode]`). `budget`: descriptors left to read (one
    count shared by a search; negative: no bound). The folder is read lazily: a bound stops the listing too."""
    try:
        with os.scandir(f"/proc/{pid}/fd") as entries:
            for entry in entries:
                if budget is not None:
                    if budget[0] == 0:
                        return False
                    budget[0] -= 1
                try:
                    if os.readlink(entry.path) == link:
                        return True
                except OSError:
                    continue
    except OSError:
        return False
    return False


def serves(address, listeners: list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]) -> set[int]:
    """Of the (bound address, pid) listeners on one port, those a connection to `address` reaches. The exact
    address first (an IPv4 one also as ::ffff:a.b.c.d), then the family's own wildcard; an IPv4 address reaches
    `[::]` only when no 0.0.0.0 listens (both can be bound only if `[::]` is IPV6_V6ONLY, and then it serves
    IPv6 alone); an IPv6 address never reaches 0.0.0.0."""
    def mapped(ip):
        return getattr(ip, "ipv4_mapped", None) or ip
    tiers = [{pid for ip, pid in listeners if mapped(ip) == address}]
    if address.version == 4:
        tiers.append({pid for ip, pid in listeners if ip == ipaddress.IPv4Address(0)})
    tiers.append({pid for ip, pid in listeners if ip == ipaddress.IPv6Address(0)})
    return next((tier for tier in tiers if tier), set())


def _addresses(host: str, lookup: bool = True) -> set | None:
    try:
        return {ipaddress.ip_address(host.strip("[]"))}
    except ValueError:
        if not lookup:
            return None
    try:
        return {ipaddress.ip_address(info[4][0].split("%")[0])
                for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):
        return set()


def _only_uid(procs: list[psutil.Process]) -> int | None:
    uids = set()
    for proc in procs:
        try:
            uids.add(proc.uids().real)
        except psutil.Error:
            continue
    return uids.pop() if len(uids) == 1 else None


def _from_pidfile(path: Path) -> tuple[list[psutil.Process], list[str]]:
    """The pid in `path`, which only root may be able to write (else anyone who can write it names a victim)."""
    try:
        if why := _writable_by_others(path):
            return [], [f"pidfile {path}: {why}"]
        return _alive([int(path.read_text().split()[0])]), []
    except (OSError, ValueError, IndexError) as exc:
        return [], [f"pidfile {path}: {getattr(exc, 'strerror', None) or exc}"]


def _writable_by_others(path: Path) -> str | None:
    """Why someone other than root could change what `path` says (None: nobody can). The file and every
    directory above it, as written and as resolved, must be root's and not group- or world-writable (a sticky
    directory may be: no one else can replace a root-owned file in it)."""
    given, real = Path(os.path.abspath(path)), Path(os.path.realpath(path))
    for part in dict.fromkeys([given, *given.parents, real, *real.parents]):
        st = os.lstat(part)
        if st.st_uid != 0:
            return f"{part} belongs to uid {st.st_uid}, not root"
        sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if st.st_mode & 0o022 and not (sticky and part not in (given, real)) and not stat.S_ISLNK(st.st_mode):
            return f"{part} is writable by group or others"
    return None


def _matching(pattern: re.Pattern[str]) -> list[psutil.Process]:
    """Processes whose own executable is an engine's and whose command line holds the pattern (outermost). What an
    engine's own process runs is an interpreter or a known server binary (by /proc/<pid>/exe, each kind's
    `executables`): a shell, a tmux or screen server, pgrep or an editor that merely carries the pattern's text is
    never the engine."""
    found, engines = {}, engine_executables()
    for proc in psutil.process_iter(["cmdline"]):
        if pattern.search(" ".join(proc.info["cmdline"] or ())) and engines.fullmatch(_exe_name(proc)):
            found[proc.pid] = proc
    return [p for p in found.values() if _ppid(p) not in found]


def engine_executables() -> re.Pattern[str]:
    return re.compile("|".join(dict.fromkeys(e for k in enginekinds.all_kinds() for e in k.executables)))


def _exe_name(proc: psutil.Process) -> str:
    """The name of the file the process executes (/proc/<pid>/exe, read directly: psutil would guess from the
    argv the process wrote itself when the link cannot be read)."""
    try:
        return os.path.basename(os.readlink(f"/proc/{proc.pid}/exe")).removesuffix(" (deleted)")
    except OSError:
        return ""


def _unit_cgroup(unit: str) -> Path | None:
    try:
        out = subprocess.run(["systemctl", "show", "-p", "ControlGroup", "--value", unit], capture_output=True,
                             text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    if not out:
        return None
    # cgroup v2 at /sys/fs/cgroup; on hybrid hosts systemd's tree is under unified/ (v2) or systemd/ (v1).
    candidates = [Path("/sys/fs/cgroup", sub, out.lstrip("/")) for sub in ("", "unified", "systemd")]
    return next((c for c in candidates if c.is_dir()), None)


MAX_CGROUP_DEPTH = 32  # a delegated subtree is its user's to nest: walked in a loop, this deep at most


def _in_cgroup(path: Path | None) -> list[psutil.Process]:
    if path is None or not path.is_dir():
        return []
    pids, todo = set(), [(str(path), 0)]
    while todo:
        folder, depth = todo.pop()
        try:
            pids.update(int(x) for x in Path(folder, "cgroup.procs").read_text().split())
            if depth < MAX_CGROUP_DEPTH:
                with os.scandir(folder) as entries:
                    todo += [(e.path, depth + 1) for e in entries if e.is_dir(follow_symlinks=False)]
        except (OSError, ValueError):
            continue
    return _alive(pids)


def _alive(pids) -> list[psutil.Process]:
    out = []
    for pid in sorted(pids):
        try:
            out.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return out


def _ppid(proc: psutil.Process) -> int | None:
    try:
        return proc.ppid()
    except psutil.Error:
        return None


CPU_WINDOW = 1.0
# A thread's wait on a run queue counts toward its share at most this many times the CPU it got in the same
# window. The kernel adds a wait to schedstat when it ends, all at once: a thread that waited 3 s behind a busy
# core and then ran for a millisecond added 3 s in that one window (a starved, not a spinning, process: a real
# vLLM's EngineCore read 54-98 % with 0-1 % of CPU during a prefill). A spinner gets a share of its core in every
# window: one that gets a quarter still reads as a full core.
QUEUED_PER_RUN = 3.0
WIDE_AFTER = 30.0  # seconds: a scrape's look reads every process of the engine's user at least this often
# seconds a read of every process of a user serves the due wide looks of other engines of that user: 32 engines
# started together came due together every 30 s, each reading every process of root (docker's engines are root's)
SHARED_FOR = 5.0


@dataclass(eq=False, repr=False)
class Tracker:
    """Every process seen as part of one engine, kept across scrapes."""

    seen: dict[tuple[int, float], psutil.Process] = field(default_factory=dict)
    uid: int | None = None  # the engine's user as last known: orphans outlive the socket that told it
    cpu_seen: dict[tuple[int, float], deque[tuple[float, float]]] = field(default_factory=dict)  # (when, CPU s)
    # each member's start in clock ticks since boot (/proc/PID/stat): the same process whatever the wall clock did
    started: dict[tuple[int, float], int] = field(default_factory=dict)
    reads: Reads | None = None  # the last refresh's reads of /proc (its CPU times: cpu_percents)
    wide_at: float = -math.inf  # when a refresh last read every process of the engine's user (monotonic)

    def refresh(self, found: Resolved, wide: bool = True) -> list[psutil.Process]:
        """The engine's live processes now: the accepted roots, their descendants, the roots' own process
        groups, and every earlier member (and its descendants) still alive; all of them the engine user's and
        killable.

        A narrow look (`wide` False, each scrape's) walks the tree down from the roots and the members it knows,
        by the kernel's list of each thread's children (/proc/PID/task/TID/children): the cost is the engine's
        size, not the host's. What only a read of every process of the engine's user finds (a member of a root's
        process group outside the tree: a process orphaned before this tracker saw it, a pipeline's other
        commands) is read on a wide look: asked for (a kill's look; by default), whenever a root is new to this
        tracker or a member it knew is gone (its children, unseen, may be orphans now), and WIDE_AFTER after the
        last (what a GPU fault's pid is matched against is never older than that); every look where the kernel
        keeps no list of children. A wide look also follows the parent each of the user's processes names: it
        takes all that every look took before the walk."""
        current: dict[tuple[int, float], psutil.Process] = {}
        self.uid = uid = found.uid if found.uid is not None else self.uid
        self.reads = reads = found.reads or Reads()
        ours = (lambda p: reads.ours(p.pid, uid)) if uid is not None else (lambda p: False)

        def add(member: psutil.Process) -> None:
            if (key := _key(member)) and key not in current and (ticks := reads.started(member.pid)) is not None:
                current[key] = self.seen.get(key, member)
                started.setdefault(key, ticks)  # a member's start as first read: the same process at every look

        started = {key: ticks for key, ticks in self.started.items() if key in self.seen}
        kept = {key: proc for key, proc in self.seen.items()
                if started.get(key) == reads.started(proc.pid) and ours(proc)}  # a zombie too: not gone yet
        now = time.monotonic()
        changed = wide or len(kept) < len(self.seen) or any(_key(root) not in self.seen for root in found.roots) \
            or not _CHILDREN
        family = None
        if found.roots and uid is not None and (changed or now - self.wide_at >= WIDE_AFTER):
            # only a look due by the clock takes another engine's read of the last SHARED_FOR seconds (its age
            # counts toward the next: no read is older than WIDE_AFTER); a kill's, or one after a change, reads now
            self.wide_at, family = _family_read(uid, now, shared=not changed)
        for proc in found.roots:
            add(proc)
            if family is not None:
                for member in filter(ours, _group_members(proc, family)):
                    add(member)
        for key, proc in kept.items():
            current.setdefault(key, proc)  # an orphan: its parent exited, it did not
        if uid is not None:
            for member in _descendants(list(current.values()), uid, ours, family, reads):
                add(member)
        self.seen, self.started = current, {key: started[key] for key in current}
        return [p for key, p in current.items() if reads.running(p.pid, started[key]) and ours(p)]

    def cpu_percents(self, procs: list[psutil.Process], now: float | None = None,
                     reads: Reads | None = None) -> dict[int, float]:
        """Each process's share of a core over the last CPU_WINDOW seconds at least (0 at the first look): the
        time it ran or waited on a run queue to run (that wait at most QUEUED_PER_RUN times the time it ran). A
        spinning process on a busy box gets half a core or less (other sessions' work has its fair share whatever
        the nice values) and waits the rest: measured 47-74 % here in CI's test runs, on CPU time alone. Looks
        come as close as a quarter second apart, and over so short a window the 10 ms ticks and one scheduler slice
        swing a spinning process's share by a tenth. `reads`: the look's own reads of /proc (refresh's), where the
        CPU times are read already. Keyed by pid: which process spins is the evidence a page quotes."""
        now = time.monotonic() if now is None else now
        seen, values = {}, {}
        for proc in procs:
            key = _key(proc)
            cpu = reads.cpu_seconds(proc.pid) if reads else None
            try:
                if cpu is None:
                    times = proc.cpu_times()
                    cpu = times.user + times.system
            except psutil.Error:
                continue
            if key is None:
                continue
            history = seen[key] = self.cpu_seen.get(key) or deque()
            history.append((now, cpu, queued_seconds(proc.pid, reads.tasks(proc.pid) if reads else None)))
            while len(history) > 1 and now - history[1][0] >= CPU_WINDOW:
                history.popleft()  # keep the newest look at least a window old, and every one after it
            (then, ran_before, queued_before) = history[0]
            ran, queued = max(0.0, cpu - ran_before), max(0.0, history[-1][2] - queued_before)
            values[proc.pid] = 100.0 * (ran + min(queued, QUEUED_PER_RUN * ran)) / (now - then) if now > then else 0.0
        self.cpu_seen = seen
        return values


def queued_seconds(pid: int, tasks: list[str] | None = None) -> float:
    """How long the process's live threads have waited on a run queue, runnable but not running (the second
    field of each thread's schedstat, in ns); 0 where the kernel keeps none. A thread that exits takes its wait
    with it: the sum can fall, never rise, by that (the share is read as 0 at worst). `tasks`: its threads, as
    the look listed them."""
    total = 0
    for tid in _tasks(pid) if tasks is None else tasks:
        try:
            total += int(read_small(f"/proc/{pid}/task/{tid}/schedstat", 256).split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def _tasks(pid: int) -> list[str]:
    """The ids of the process's threads (none: gone)."""
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


_families: dict[int, tuple[float, dict[int, tuple[int, int]]]] = {}  # uid -> its latest _family read, when made


def _family_read(uid: int, now: float, shared: bool) -> tuple[float, dict[int, tuple[int, int]]]:
    """(when it was read, _family(uid)): with `shared`, one read by any tracker in the last SHARED_FOR seconds (and
    not itself due: younger than WIDE_AFTER)."""
    if shared and (latest := _families.get(uid)) is not None and now - latest[0] <= SHARED_FOR \
            and now - latest[0] < WIDE_AFTER:
        return latest
    read = _families[uid] = (now, _family(uid))
    return read


def _family(uid: int) -> dict[int, tuple[int, int]]:
    """Each process of `uid`: its parent's pid and its process group (/proc/PID/stat). Members are checked one by
    one (`ours`): the list need not be strict."""
    out = {}
    for pid in pids_of(uid, strict=False):
        if fields := _stat(pid):
            out[pid] = int(fields[1]), int(fields[2])  # ppid, pgrp
    return out


def _descendants(procs: list[psutil.Process], uid: int, ours, family: dict[int, tuple[int, int]] | None = None,
                 reads: Reads | None = None) -> list[psutil.Process]:
    """Children, grandchildren, ... of `procs`, by the kernel's list of each of their threads' children, and on a
    wide look by the parent each process of `family` (the user's) names too; a child that is not `ours`, or whose
    /proc entry is not `uid`'s (a non-dumpable process, as the user-wide read never finds it), is left out with
    everything below it."""
    named: dict[int, list[int]] = {}
    for pid, (ppid, _) in (family or {}).items():
        named.setdefault(ppid, []).append(pid)
    out, todo, seen = [], list(procs), {p.pid for p in procs}
    while todo:
        parent = todo.pop().pid
        for pid in [*children_of(parent, reads.tasks(parent) if reads else None), *named.get(parent, ())]:
            if pid in seen:
                continue
            seen.add(pid)
            try:
                if os.stat(f"/proc/{pid}").st_uid != uid:
                    continue
                child = psutil.Process(pid)
            except (OSError, psutil.Error):
                continue
            if ours(child):
                out.append(child)
                todo.append(child)
    return out


# the kernel lists each thread's children (CONFIG_PROC_CHILDREN, in Debian's kernels); without it every look is wide
_CHILDREN = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def children_of(pid: int, tasks: list[str] | None = None) -> list[int]:
    """The pids of the process's children: those each of its threads forked (/proc/PID/task/TID/children,
    CONFIG_PROC_CHILDREN). A thread's list comes in one read() while it fits a page (~700 children): past that
    the kernel resumes it by position, and a child that exits between two reads can make it skip another.
    `tasks`: its threads, as the look listed them."""
    out: list[int] = []
    for tid in _tasks(pid) if tasks is None else tasks:
        try:
            fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            data = b""
            while chunk := os.read(fd, 65536):
                data += chunk
        except OSError:
            continue
        finally:
            os.close(fd)
        out += map(int, data.split())
    return out


def _group_members(root: psutil.Process, family: dict[int, tuple[int, int]]) -> list[psutil.Process]:
    try:
        if os.getpgid(root.pid) != root.pid:
            return []  # the root shares someone else's group (a shell's): do not take that group
    except OSError:
        return []
    return _alive(pid for pid, (_, pgrp) in family.items() if pgrp == root.pid and pid != root.pid)


def _key(proc: psutil.Process) -> tuple[int, float] | None:
    try:
        return proc.pid, proc.create_time()
    except psutil.Error:
        return None


def is_running(proc: psutil.Process) -> bool:
    """Alive and not a zombie (same process: psutil compares the start time)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _stat(pid: int) -> list[bytes] | None:
    """/proc/PID/stat's fields after the command (state at 0, ppid 1, pgrp 2, flags 6, utime 11, stime 12,
    starttime 19); None when gone. os.open and os.read: half the time of a buffered open()."""
    try:
        fields = read_small(f"/proc/{pid}/stat", 4096).rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 19 else None


def _uids(pid: int) -> tuple[int, ...] | None:
    """Real, effective, saved and filesystem uid (/proc/PID/status); None when gone."""
    try:
        data = read_small(f"/proc/{pid}/status", 8192)
        return tuple(map(int, data.split(b"\nUid:", 1)[1].split(b"\n", 1)[0].split()))
    except (OSError, IndexError, ValueError):
        return None


class Reads:
    """One look's reads of /proc: each process's stat, status, descriptors and threads read once, however often the
    look asks (it asked each process's stat and status up to six times through psutil, then three times, its
    descriptors three times: who holds the engine's socket, whether its tree does, which GPUs it has open; and its
    threads twice: their children, their waits). A look takes a millisecond: what it read stays true for it."""

    def __init__(self, protected: set[int] | None = None) -> None:
        self.protected = _protected() if protected is None else protected  # PID 1, gpuwarden, its ancestors
        self._stats: dict[int, list[bytes] | None] = {}
        self._uids: dict[int, tuple[int, ...] | None] = {}
        self._links: dict[int, frozenset[str]] = {}
        self._tasks: dict[int, list[str]] = {}

    def stat(self, pid: int) -> list[bytes] | None:
        if pid not in self._stats:
            self._stats[pid] = _stat(pid)
        return self._stats[pid]

    def started(self, pid: int) -> int | None:
        """Its start, in clock ticks since boot (None: gone)."""
        fields = self.stat(pid)
        return int(fields[19]) if fields else None

    def running(self, pid: int, started: int) -> bool:
        """The process that started then is alive and not a zombie."""
        fields = self.stat(pid)
        return fields is not None and int(fields[19]) == started and fields[0] != b"Z"

    def uids(self, pid: int) -> tuple[int, ...] | None:
        if pid not in self._uids:
            self._uids[pid] = _uids(pid)
        return self._uids[pid]

    def uid(self, pid: int) -> int | None:
        """Its real uid (None: gone)."""
        uids = self.uids(pid)
        return uids[0] if uids else None

    def owned_by(self, pid: int, uid: int) -> bool:
        """Real, effective and saved uid are all `uid` (a setuid child of the engine is someone else's)."""
        uids = self.uids(pid)
        return uids is not None and set(uids[:3]) == {uid}

    def killable(self, pid: int) -> bool:
        """Not PID 1, this daemon, one of its ancestors or a kernel thread; alive (is_killable, from this look's
        reads)."""
        fields = self.stat(pid)
        return pid not in self.protected and fields is not None and not _kernel(pid, fields)

    def ours(self, pid: int, uid: int) -> bool:
        """Wholly `uid`'s and killable."""
        return self.owned_by(pid, uid) and self.killable(pid)

    def links(self, pid: int) -> frozenset[str]:
        """What its descriptors link to (none: gone, or not ours to read)."""
        if pid not in self._links:
            self._links[pid] = frozenset(_links(pid) or ())
        return self._links[pid]

    def tasks(self, pid: int) -> list[str]:
        """Its threads' ids (its children are listed by thread, and its wait on a run queue read by thread)."""
        if pid not in self._tasks:
            self._tasks[pid] = _tasks(pid)
        return self._tasks[pid]

    def holds(self, pid: int, link: str) -> bool:
        """From its descriptors as read (the engine's processes: `links`); else read until `link` turns up: a process
        of another user on the engine's port (a squatter) may hold a million descriptors, and only this one counts."""
        links = self._links.get(pid)
        return link in links if links is not None else _holds(pid, link)

    def cpu_seconds(self, pid: int) -> float | None:
        """User and system CPU time, as psutil's cpu_times reads them."""
        fields = self._stats.get(pid)
        return (int(fields[11]) + int(fields[12])) / _TICKS if fields else None


_TICKS = os.sysconf("SC_CLK_TCK")


_PF_KTHREAD = 0x00200000  # task flag of kernel threads (include/linux/sched.h)


def is_killable(proc: psutil.Process, protected: set[int] | None = None) -> bool:
    """Never PID 1, this daemon, its ancestors (`protected`, looked up when not given), or kernel threads."""
    try:
        if proc.pid in (protected if protected is not None else _protected()):
            return False
        return not _kernel_thread(proc.pid)
    except psutil.Error:
        return False


def _kernel_thread(pid: int) -> bool:
    fields = _stat(pid)
    return fields is None or _kernel(pid, fields)  # gone or unreadable: not something to signal


def _kernel(pid: int, fields: list[bytes]) -> bool:
    return pid == 2 or int(fields[1]) == 2 or bool(int(fields[6]) & _PF_KTHREAD)  # ppid, flags


def _protected() -> set[int]:
    """PID 1, this daemon and its ancestors, up the parent chain of /proc/PID/stat (psutil's parents() built a
    Process of each, start time and all: a millisecond of every look). An ancestor whose pid was reused midway is
    protected with its own ancestors: more protected, never less."""
    out, pid = {1, os.getpid()}, os.getppid()
    while pid > 1 and pid not in out:
        out.add(pid)
        if (fields := _stat(pid)) is None:
            break
        pid = int(fields[1])
    return out


def describe(proc: psutil.Process) -> str:
    """`pid user command` for people, on one line and with its secrets masked (redact_command: it goes into
    events and alerts)."""
    try:
        command = redact_command(" ".join(proc.cmdline()) or f"[{proc.name()}]")
        return f"{proc.pid} {proc.username()} {command[:120]}"
    except psutil.Error:
        return str(proc.pid)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


_RENDER = re.compile(r"^/dev/dri/(renderD\d+|card\d+)$")


def gpus_in_use(procs: list[psutil.Process], proc_root: Path = Path("/proc"),
                sys_root: Path = Path("/sys"), reads: Reads | None = None) -> set[str] | None:
    """PCI addresses of the GPUs these processes hold open (DRM nodes, a vendor's own: /dev/nvidiaN); None when
    they hold a GPU that cannot be told apart (only /dev/kfd) or none at all: then the engine counts as using
    every GPU. `reads`: the look's, whose descriptors are read already."""
    found: set[str] = set()
    nodes = [node for vendor in vendors.all_vendors() for node in vendor.device_nodes]
    for proc in procs:
        for link in reads.links(proc.pid) if reads is not None else _links(proc.pid, str(proc_root)) or ():
            if m := _RENDER.match(link):
                found |= _drm_pci(sys_root, m.group(1))
                continue
            for node in nodes:
                if m := node.pattern.match(link):
                    found |= node.gpus(proc_root, m)
                    break
    return found or None


def _drm_pci(sys_root: Path, node: str) -> set[str]:
    try:
        return {normalize_pci((sys_root / "class/drm" / node / "device").resolve().name)}
    except (OSError, ValueError):
        return set()

