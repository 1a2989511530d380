"""Which processes make up an engine, and which GPUs they hold. Synchronous psutil/procfs reads: callers run
them off the event loop.

Orphans: psutil's `children(recursive=True)` loses descendants whose parent exited, so a tracker remembers
every descendant it has seen (by pid and start time, so a reused pid is never mistaken for it), and also takes
members of the root's process group when the root leads that group.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from gpuwarden.model import normalize_pci


@dataclass(frozen=True, slots=True)
class TargetSpec:
    kind: str  # port | pidfile | cmdline | unit | cgroup | docker
    port: int | None = None
    pidfile: Path | None = None
    pattern: str | None = None
    unit: str | None = None
    cgroup: Path | None = None
    container: str | None = None
    docker_socket: Path = Path("/var/run/docker.sock")


def roots(spec: TargetSpec) -> list[psutil.Process]:
    """The top processes of the target (their descendants are found by the tracker)."""
    if spec.kind == "port":
        return _listening_on(spec.port)
    if spec.kind == "pidfile":
        try:
            return [psutil.Process(int(spec.pidfile.read_text().split()[0]))]
        except (OSError, ValueError, IndexError, psutil.Error):
            return []
    if spec.kind == "cmdline":
        return _matching(re.compile(spec.pattern))
    if spec.kind in ("unit", "cgroup"):
        return _in_cgroup(spec.cgroup if spec.kind == "cgroup" else _unit_cgroup(spec.unit))
    if spec.kind == "docker":
        return _in_container(spec.docker_socket, spec.container)
    raise ValueError(f"no process roots for target kind {spec.kind!r}")


def _listening_on(port: int) -> list[psutil.Process]:
    pids = {c.pid for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
    return _alive(pids)


def _matching(pattern: re.Pattern[str]) -> list[psutil.Process]:
    found = {}
    for proc in psutil.process_iter(["cmdline"]):
        if pattern.search(" ".join(proc.info["cmdline"] or ())):
            found[proc.pid] = proc
    return [p for p in found.values() if _ppid(p) not in found]


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


def _in_cgroup(path: Path | None) -> list[psutil.Process]:
    if path is None or not path.is_dir():
        return []
    pids = set()
    for procs in path.rglob("cgroup.procs"):
        try:
            pids.update(int(x) for x in procs.read_text().split())
        except OSError:
            continue
    return _alive(pids)


def _in_container(socket: Path, container: str) -> list[psutil.Process]:
    """The container's processes as host pids, from the Docker Engine API (`GET /containers/{id}/top`)."""
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)), base_url="http://docker",
                          timeout=5) as client:
            response = client.get(f"/containers/{container}/top", params={"ps_args": "-o pid"})
    except httpx.HTTPError:
        return []
    if response.status_code != 200:
        return []
    top = response.json()
    column = top["Titles"].index("PID")
    return _alive(int(row[column]) for row in top["Processes"])


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


@dataclass
class Tracker:
    """Every process seen as part of one engine, kept across scrapes."""

    seen: dict[tuple[int, float], psutil.Process] = field(default_factory=dict)

    def refresh(self, top: list[psutil.Process]) -> list[psutil.Process]:
        """The engine's live processes now: the roots, their descendants, the roots' own process groups,
        and every earlier member still alive."""
        current: dict[tuple[int, float], psutil.Process] = {}
        for proc in top:
            for member in [proc, *_descendants(proc), *_group_members(proc)]:
                key = _key(member)
                if key:
                    current[key] = self.seen.get(key, member)
        for key, proc in self.seen.items():
            if key not in current and _key(proc) == key:
                current[key] = proc  # an orphan: its parent exited, it did not
        self.seen = current
        return [p for p in current.values() if is_running(p) and is_killable(p)]


def _descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def _group_members(root: psutil.Process) -> list[psutil.Process]:
    try:
        if os.getpgid(root.pid) != root.pid:
            return []  # the root shares someone else's group (a shell's): do not take that group
    except OSError:
        return []
    members = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != root.pid and os.getpgid(proc.pid) == root.pid:
                members.append(proc)
        except (OSError, psutil.Error):
            continue
    return members


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


_PROTECTED = {1, os.getpid()}


def is_killable(proc: psutil.Process) -> bool:
    """Never PID 1, this daemon, its ancestors, or kernel threads."""
    try:
        if proc.pid in _PROTECTED or proc.pid in _ancestors():
            return False
        return not (proc.pid == 2 or proc.ppid() == 2)  # kthreadd and its kernel threads
    except psutil.Error:
        return False


def _ancestors() -> set[int]:
    return {p.pid for p in psutil.Process().parents()}


def cpu_percents(procs: list[psutil.Process]) -> list[float]:
    """Each process's share of a core since the last call (psutil needs two looks: the first says 0)."""
    values = []
    for proc in procs:
        try:
            values.append(proc.cpu_percent(None))
        except psutil.Error:
            continue
    return values


_RENDER = re.compile(r"^/dev/dri/(renderD\d+|card\d+)$")
_NVIDIA = re.compile(r"^/dev/nvidia(\d+)$")


def gpus_in_use(procs: list[psutil.Process], proc_root: Path = Path("/proc"),
                sys_root: Path = Path("/sys")) -> set[str] | None:
    """PCI addresses of the GPUs these processes hold open (DRM nodes, /dev/nvidiaN); None when they hold a
    GPU that cannot be told apart (only /dev/kfd) or none at all: then the engine counts as using every GPU."""
    found: set[str] = set()
    for proc in procs:
        fd_dir = proc_root / str(proc.pid) / "fd"
        try:
            links = [os.readlink(fd_dir / name) for name in os.listdir(fd_dir)]
        except OSError:
            continue
        for link in links:
            if m := _RENDER.match(link):
                found |= _drm_pci(sys_root, m.group(1))
            elif m := _NVIDIA.match(link):
                found |= _nvidia_pci(proc_root, int(m.group(1)))
    return found or None


def _drm_pci(sys_root: Path, node: str) -> set[str]:
    try:
        return {normalize_pci((sys_root / "class/drm" / node / "device").resolve().name)}
    except (OSError, ValueError):
        return set()


def _nvidia_pci(proc_root: Path, minor: int) -> set[str]:
    for info in (proc_root / "driver/nvidia/gpus").glob("*/information"):
        try:
            if re.search(rf"^Device Minor:\s*{minor}\s*$", info.read_text(), re.M):
                return {normalize_pci(info.parent.name)}
        except (OSError, ValueError):
            continue
    return set()
