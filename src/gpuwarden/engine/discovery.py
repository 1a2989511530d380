"""Find engine servers running on this host: a known server command line, and the port it listens on (for an
engine in a Docker container, the host port its container publishes); and which source each can be watched
through (its /metrics, llama.cpp's /slots, its unit's journal, or its container's log), with what a user can
switch on to get more."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from gpuwarden import enginekinds
from gpuwarden.config.settings import EngineTarget
from gpuwarden.core.plain import plain
from gpuwarden.engine.dockerapi import container_of, container_pids, name_of, published
from gpuwarden.engine.scraper import Plain, ScrapeError, client
from gpuwarden.runtime import sockets

_PROBE_TIMEOUT = 2.0
DOCKER_SOCKET = Path("/var/run/docker.sock")


@plain
class Found:
    """An engine server found on this host, and where to read its progress."""

    profile: str
    pid: int
    port: int
    command: str
    source: str = "metrics"  # metrics | slots | log | none
    log_unit: str | None = None
    container: str | None = None  # the Docker container it runs in (its name)
    log_container: str | None = None  # source "log" from that container's log
    installed: bool = False  # runs an engine's program that only root could have put there (`installed`)
    unit: str | None = None  # the system service it runs in (system_unit): root made it
    gpu: bool = False  # it, or a process it started, holds a GPU's device file open (holds_gpu)
    uid: int | None = None  # its user

    @property
    def rank(self) -> int:
        """What vouches for it, strongest first: a GPU held (3); a system unit or a container, which only root
        makes (2); root's installed program (1: any user may run it, 16 times over); only words on a command
        line (0, a look-alike). When [engines] max_discovered is reached, a server of a higher rank takes the
        place of one of a lower: a user's crowd never pushes out an engine the host vouches for more."""
        return 3 if self.gpu else 2 if self.unit or self.container else 1 if self.installed else 0

    @property
    def name(self) -> str:
        return f"{self.profile}-{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    @property
    def more(self) -> str:
        return enginekinds.named(self.profile).more

    @property
    def place(self) -> str:
        return f"pid {self.pid}" + (f" in container {self.container}" if self.container else "")

    @property
    def through(self) -> str:
        if self.log_unit:
            return f"the journal of {self.log_unit}"
        return f"the Docker log of container {self.log_container}" if self.log_container else self.source

    @property
    def target(self) -> EngineTarget:
        """The container's processes for an engine in one (the port is docker-proxy's), else the port's."""
        return EngineTarget(kind="docker", container=self.container) if self.container else EngineTarget()


def discover(docker_socket: Path = DOCKER_SOCKET) -> list[Found]:
    """One entry per engine server: the outermost process whose command line names a known server and that
    listens on a TCP port (its lowest, which is the HTTP API for all five engines); or, in a Docker container
    with its own network, that runs in a container publishing a port (the container's lowest)."""
    listening = listening_engines()
    found = []
    for pid, ports in listening.items():
        if (profile := _profile(pid)) is not None:
            container = container_of(pid)
            found.append(Found(profile[0], pid, min(ports), profile[1],
                               container=container and name_of(docker_socket, container),
                               installed=any(installed(p, profile[0]) for p in (pid, _parent(pid)) if p),
                               unit=system_unit(pid), gpu=holds_gpu(pid), uid=_uid(pid)))
    seen = {f.pid for f in found}
    by_container: dict[str, list[int]] = {}
    for port, name in published(docker_socket).items():
        by_container.setdefault(name, []).append(port)
    for name, ports in by_container.items():
        for pid in container_pids(docker_socket, name)[0]:
            if pid not in seen and listens(pid) and (profile := _profile(pid)) is not None:
                found.append(Found(profile[0], pid, min(ports), profile[1], container=name, gpu=holds_gpu(pid),
                                   uid=_uid(pid)))
                break
    return sorted(found, key=lambda f: f.port)


def listening_engines(proc: Path = Path("/proc")) -> dict[int, set[int]]:
    """The ports each process whose command line names a known server listens on (this network namespace's
    sockets, from the kernel's tables). Only such processes' descriptors are read: a user holding a million
    descriptors in processes that name no engine costs discovery nothing (psutil.net_connections read them all)."""
    ports: dict[int, set[int]] = {}
    for listener in sockets.listeners(proc_net=proc / "net"):
        ports.setdefault(listener.inode, set()).add(listener.port)
    out: dict[int, set[int]] = {}
    if not ports:
        return out
    with os.scandir(proc) as entries:
        pids = [int(e.name) for e in entries if e.name.isdigit()]
    for pid in pids:
        if _profile(pid) is None:
            continue
        try:
            with os.scandir(proc / str(pid) / "fd") as fds:
                for fd in fds:
                    link = _link(fd.path)
                    if link.startswith("socket:[") and (held := ports.get(int(link[8:-1]))):
                        out.setdefault(pid, set()).update(held)
        except (OSError, ValueError):
            continue
    return out


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def probe_order(new: list[Found], probed: dict[str, float]) -> list[Found]:
    """The servers not watched yet: the highest rank first (Found.rank), then the longest unprobed: with at most
    [engines] max_discovered probed a round, a crowd (of look-alikes, of root's own program run by a user, of
    servers that never answer) cannot keep an engine the host vouches for more from its turn."""
    return sorted(new, key=lambda f: (-f.rank, probed.get(f.name, float("-inf"))))


def programs(name: str) -> set[str]:
    """The program file of an engine (a native server, or the console script an interpreter runs): the first word
    of its kind's commands that is a plain file name; none for a name no kind has."""
    commands = kind.commands if (kind := enginekinds.named(name)) else ()
    return {c.split()[0] for c in commands if "." not in c.split()[0] and "/" not in c.split()[0]}


_INTERPRETER = re.compile(r"(python|pypy)[0-9.]*")


def installed(pid: int, profile: str, proc: Path = Path("/proc")) -> bool:
    """The process runs the engine's own program (its executable, or the script right after its interpreter:
    /usr/bin/llama-server, /opt/venv/bin/vllm), and that file and its folder are root's and writable by no one
    else (discovery asks it of the serving process and of the process that started it). Any user can start a
    look-alike (`python3 x.py vllm serve` carries the words); only root installs. An engine its user installed
    in a home is not `installed`: it is watched the same, but not preferred."""
    try:
        exe = os.readlink(proc / str(pid) / "exe").removesuffix(" (deleted)")
        argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    # seen from the process's own root and folder: an engine in a container runs its image's files
    program = os.path.join(proc / str(pid) / "root", exe.lstrip("/"))
    if _INTERPRETER.fullmatch(os.path.basename(exe)):
        if len(argv) < 2 or not argv[1] or argv[1].startswith(b"-"):
            return False  # `-m module`, `-c code`: nothing to prove it by
        script = os.fsdecode(argv[1])
        program = os.path.join(proc / str(pid) / ("root" if script.startswith("/") else "cwd"), script.lstrip("/"))
    if os.path.basename(program) not in programs(profile):
        return False
    try:
        return all(st.st_uid == 0 and not st.st_mode & 0o022
                   for st in (os.stat(program), os.stat(os.path.dirname(program))))
    except OSError:
        return False


def listens(pid: int, proc: Path = Path("/proc")) -> bool:
    """The process holds a listening TCP socket, in whatever network namespace it is (its own /proc/<pid>/net
    shows that namespace's sockets; psutil shows only ours)."""
    listening = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = (proc / str(pid) / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        listening |= {f"socket:[{row.split()[9]}]" for row in rows if row.split()[3] == "0A"}  # 0A: LISTEN
    try:
        return any(os.readlink(proc / str(pid) / "fd" / fd) in listening for fd in os.listdir(proc / str(pid) / "fd"))
    except OSError:
        return False


def _parent(pid: int) -> int | None:
    """The process that started `pid` (a launcher owns the server it starts: TGI's launcher, its router)."""
    try:
        return psutil.Process(pid).ppid() or None
    except psutil.Error:
        return None


def _profile(pid: int) -> tuple[str, str] | None:
    """The engine a process's command line names, and the command line."""
    try:
        command = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return None
    kind = next((k for k in enginekinds.all_kinds() if any(c in command for c in k.commands)), None)
    return (kind.name, command) if kind else None


def with_source(found: Found) -> Found:
    """The best source this engine offers now: /metrics when it answers, else llama.cpp's /slots, else the
    journal of the systemd unit it runs in or the log of its Docker container (for an engine with a log
    profile), else none."""
    base, kind = f"http://127.0.0.1:{found.port}", enginekinds.named(found.profile)
    if kind.metrics and _answers(f"{base}/metrics"):
        return found
    if kind.slots and _answers(f"{base}/slots"):
        return Found(**{**_fields(found), "source": "slots"})
    unit = unit_of(found.pid)
    if unit and kind.log:
        return Found(**{**_fields(found), "source": "log", "log_unit": unit})
    if found.container and kind.log:
        return Found(**{**_fields(found), "source": "log", "log_container": found.container})
    return Found(**{**_fields(found), "source": "none"})


def system_unit(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The system service a process runs in: a `.service` under system.slice, which only root makes. A user's
    own units (systemd --user: user.slice/user-N.slice/user@N.service/…) are not one."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)[-1].split("/")
        if len(parts) > 2 and parts[1] == "system.slice" and parts[2].endswith(".service"):
            return parts[2]
    return None


_GPU_FILE = re.compile(r"/dev/(nvidia\d+|dri/(renderD|card)\d+|kfd)")
_TREE = 64  # processes of a server's tree looked at for a GPU: its user may start thousands


def holds_gpu(pid: int, proc: Path = Path("/proc")) -> bool:
    """The server, or one of the first processes it started (vLLM's engine core holds the GPU, its API server
    does not), holds a GPU's device file open: something only a process that really runs on it does."""
    try:
        pids = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True)[:_TREE])]
    except psutil.Error:
        return False
    for each in pids:
        fds = proc / str(each) / "fd"
        try:
            names = os.listdir(fds)
        except OSError:
            continue
        for name in names:
            try:
                if _GPU_FILE.fullmatch(os.readlink(fds / name)):
                    return True
            except OSError:
                continue
    return False


def _uid(pid: int) -> int | None:
    try:
        return psutil.Process(pid).uids().real
    except psutil.Error:
        return None


def unit_of(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The systemd service a process runs in, from its cgroup path (…/name.service[/…])."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        for part in reversed(line.split(":", 2)[-1].split("/")):
            if part.endswith(".service"):
                return part
    return None


def _answers(url: str) -> bool:
    """A 200 status within _PROBE_TIMEOUT for the whole exchange: anyone can serve what discovery asks, one byte
    at a time (a timeout per read would wait on it for ever, and on every engine after it). http:// through
    scraper.Plain (discovery's are all http://: no httpx loaded), https:// through httpx."""
    if urlsplit(url).scheme == "http":
        try:
            return asyncio.run(Plain(url, _PROBE_TIMEOUT).status()) == 200
        except (ScrapeError, TimeoutError, ValueError):  # ValueError: a port that is no number
            return False
    import httpx  # on first use: 90 ms of import that a start without engines never needs

    async def status() -> int:
        async with (client(_PROBE_TIMEOUT, shared=False) as http, asyncio.timeout(_PROBE_TIMEOUT),
                    http.stream("GET", url) as r):
            return r.status_code
    try:
        return asyncio.run(status()) == 200
    except (httpx.HTTPError, httpx.InvalidURL, TimeoutError):
        return False


def _fields(found: Found) -> dict:
    return {"profile": found.profile, "pid": found.pid, "port": found.port, "command": found.command,
            "container": found.container, "installed": found.installed, "unit": found.unit, "gpu": found.gpu,
            "uid": found.uid}


def hint(metrics_url: str) -> str | None:
    """For `probe` when /metrics does not answer: a source the engine at that address does offer."""
    parts = metrics_url.split("/", 3)
    base = "/".join(parts[:3])
    box = published(DOCKER_SOCKET).get(urlsplit(metrics_url).port or 80)
    docker = f'its Docker container {box} has its log: source = "log", log_container = "{box}"' if box else None
    for kind in enginekinds.all_kinds():
        if kind.answers_at and _answers(base + kind.answers_at):
            return f"{kind.title} ({kind.answers_at} answers, /metrics does not): {kind.more}: " + \
                " or ".join(f'source = "{s}"' + (f', log_container = "{box}" (its Docker container)'
                                                 if s == "log" and box else "")
                            for s in kind.sources if s != "metrics")
    return docker
