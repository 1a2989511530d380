"""The Docker Engine API over its unix socket, trusted only when root's: a bounded GET, a followed stream, and a
container's processes proven by their cgroup. Synchronous, every call bounded by socket timeouts: callers run
it off the event loop.

Whoever answers on the socket names the processes root kills, so the socket is trusted only when no one but root
can put a listener there (the socket and every directory above it, as written and as resolved, are root's and
not writable by others) and the listener on this very connection is root (SO_PEERCRED). The requests are
HTTP/1.0 on a connection of their own: the trust check is made on the connection the request goes over, and
the response body is the bytes as dockerd writes them (never chunked) until it closes, which is how a followed
log streams. Paths are unversioned: each engine serves its own API version, and these calls are in all of them.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import struct
import time
from pathlib import Path
from urllib.parse import quote

TIMEOUT = 1.5  # for the head of an answer, then for its body: a log look (inspect, then logs) has 5 s
_MAX_HEAD = 64 << 10
_MAX_JSON = 4 << 20  # /containers/{id}/json of a large container is tens of KB


class DockerError(Exception):
    """Why the Engine API gave no answer to use (for people: events, `check`)."""


def untrusted(path: Path) -> str | None:
    """Why someone other than root could be the one answering at `path` (None: only root can)."""
    given, real = Path(os.path.abspath(path)), Path(os.path.realpath(path))
    for part in dict.fromkeys([given, *given.parents, real, *real.parents]):
        try:
            st = os.lstat(part)
        except OSError as exc:
            return f"{part}: {exc.strerror or exc}"
        if st.st_uid != 0:
            return f"{part} belongs to uid {st.st_uid}, not root"
        # The socket's own mode says who may connect (dockerd's group), not who may replace it.
        if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"{part} is writable by group or others"
    return None


def connect(path: Path, timeout: float = TIMEOUT) -> socket.socket:
    if not os.path.exists(path):
        raise DockerError(f"no Docker daemon: {path} does not exist")
    if why := untrusted(path):
        raise DockerError(f"the Docker socket is not trusted: {why}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError as exc:
        sock.close()
        raise DockerError(f"cannot connect to {path}: {exc.strerror or exc}") from None
    if uid != 0:
        sock.close()
        raise DockerError(f"the Docker socket is not trusted: {path} is served by uid {uid}, not root")
    return sock


def _recv(sock: socket.socket, deadline: float) -> bytes:
    """One read, within what is left of the call's time (a drip of bytes cannot stretch it)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    sock.settimeout(left)
    return sock.recv(65536)


def open_stream(path: Path, target: str, timeout: float = TIMEOUT,
                method: str = "GET") -> tuple[int, socket.socket, bytes]:
    """Send `method` `target` (a POST without a body); the status, the connection, and the first bytes of the
    body, within `timeout`."""
    deadline = time.monotonic() + timeout
    sock = connect(path, timeout)
    length = "Content-Length: 0\r\n" if method != "GET" else ""
    try:
        sock.sendall(f"{method} {target} HTTP/1.0\r\nHost: docker\r\n{length}\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = _recv(sock, deadline)
            if not chunk or len(data) > _MAX_HEAD:
                raise DockerError(f"{path}: no HTTP response to {method} {target}")
            data += chunk
    except OSError as exc:
        sock.close()
        raise DockerError(f"{path}: {method} {target}: {exc.strerror or exc}") from None
    except DockerError:
        sock.close()
        raise
    head, body = data.split(b"\r\n\r\n", 1)
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        sock.close()
        raise DockerError(f"{path}: not an HTTP response to {method} {target}") from None
    return status, sock, body


def get(path: Path, target: str, limit: int = _MAX_JSON, timeout: float = TIMEOUT,
        method: str = "GET") -> tuple[int, bytes]:
    """The status and the whole body of `method` `target` (at most `limit` bytes), within twice `timeout`."""
    status, sock, body = open_stream(path, target, timeout, method)
    deadline = time.monotonic() + timeout
    with sock:
        try:
            while len(body) <= limit and (chunk := _recv(sock, deadline)):
                body += chunk
        except OSError as exc:
            raise DockerError(f"{path}: {method} {target}: {exc.strerror or exc}") from None
    if len(body) > limit:
        raise DockerError(f"{path}: {method} {target}: the answer is over {limit} bytes")
    return status, body


def get_json(path: Path, target: str) -> tuple[int, object]:
    status, body = get(path, target)
    try:
        return status, json.loads(body)
    except ValueError:
        raise DockerError(f"{path}: GET {target}: HTTP {status}, not JSON") from None


def error_of(status: int, answer: object) -> str:
    message = answer.get("message") if isinstance(answer, dict) else None
    return f"HTTP {status}: {message or answer}"[:300]


def inspect(path: Path, container: str) -> dict:
    """GET /containers/{name}/json: the container, or DockerError saying why not (no such container...)."""
    status, info = get_json(path, f"/containers/{quote(container.lstrip('/'), safe='')}/json")
    if status != 200 or not isinstance(info, dict):
        raise DockerError(f"container {container}: {error_of(status, info)}")
    return info


def start(path: Path, container: str, timeout: float = 10.0) -> bool:
    """POST /containers/{name}/start: True when it started now, False when it already ran (its restart policy
    was quicker); DockerError saying why not. dockerd answers once the container's process runs, not once the
    engine in it serves."""
    status, body = get(path, f"/containers/{quote(container.lstrip('/'), safe='')}/start", timeout=timeout,
                       method="POST")
    if status in (204, 304):
        return status == 204
    try:
        answer = json.loads(body)
    except ValueError:
        answer = body.decode("utf-8", "replace")
    raise DockerError(f"container {container}: start: {error_of(status, answer)}")


def container_pids(path: Path, container: str) -> tuple[list[int], list[str]]:
    """The container's processes as host pids (`GET /containers/{id}/top`), each proven to be in the
    container's cgroup; and what was refused, with why."""
    try:
        info = inspect(path, container)
        cid = info["Id"]
        if not info["State"]["Running"]:
            return [], []
        status, top = get_json(path, f"/containers/{cid}/top?ps_args=-o+pid")
        if status != 200 or not isinstance(top, dict):
            raise DockerError(f"container {container}: top: {error_of(status, top)}")
        column = top["Titles"].index("PID")
        pids = [int(row[column]) for row in top["Processes"]]
    except DockerError as exc:
        return [], [str(exc)]
    except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
        return [], [f"container {container}: an Engine API answer of an unknown shape ({type(exc).__name__})"]
    proven = [pid for pid in pids if in_cgroup_of(pid, cid)]
    refused = [f"{pid}: the Engine API names it, but it is not in container {cid[:12]}'s cgroup"
               for pid in pids if pid not in proven]
    return proven, refused


def in_cgroup_of(pid: int, cid: str, proc: Path = Path("/proc")) -> bool:
    """The process's cgroup (any hierarchy) is the container's or below it: …/docker/<id> (cgroupfs driver),
    …/docker-<id>.scope (systemd driver)."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return False
    own = re.compile(rf"(?:^|/)(?:docker-)?{re.escape(cid)}(?:\.scope)?(?:/|$)")
    return any(own.search(line.split(":", 2)[-1]) for line in lines)


def container_of(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The id of the Docker container a process runs in, from its cgroup path; None when it is in none."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    m = re.search(r"/(?:docker/|docker-)([0-9a-f]{64})(?:\.scope)?(?:/|$)", text, re.M)
    return m.group(1) if m else None


def published(path: Path) -> dict[int, str]:
    """Host TCP ports that running containers publish, with the container's name (`GET /containers/json`);
    empty when no trusted Docker daemon answers."""
    try:
        status, listing = get_json(path, "/containers/json")
    except DockerError:
        return {}
    ports: dict[int, str] = {}
    for box in listing if status == 200 and isinstance(listing, list) else ():
        names = box.get("Names") or [box.get("Id", "")]
        for port in box.get("Ports") or ():
            if port.get("Type") == "tcp" and port.get("PublicPort"):
                ports.setdefault(int(port["PublicPort"]), names[0].lstrip("/"))
    return ports


def name_of(path: Path, cid: str) -> str | None:
    try:
        return inspect(path, cid)["Name"].lstrip("/")
    except (DockerError, KeyError, AttributeError):
        return None
