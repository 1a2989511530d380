"""Prometheus exporter: the daemon's self-metrics, served from a consistent in-memory snapshot.

Components write through `SelfMetrics`, naming a family by its handle (families.py); a scrape copies everything
under one lock and renders the copy (exposition.py), so a scrape, from the server's thread (webserver.py), never
sees a half-updated state.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path

from gpuwarden.config.web import WebConfig
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.core.model import Event, Severity, Sink
from gpuwarden.runtime.logsetup import redact_command
from gpuwarden.runtime.offloop import Busy, OffLoop
from gpuwarden.store import bundles as report
from gpuwarden.web import exposition
from gpuwarden.web.server import Answer, Server


class Exporter:
    """/metrics; the status page at / and /status, its snapshot at /status.json, the incidents' pictures under
    /incidents/; 404 elsewhere. `status` gives the daemon's snapshot (from a pool thread: it may raise
    TimeoutError when the loop does not answer); `incidents` is the folder of the incident bundles; `web` its
    TLS and basic auth (webconfig.py), on every path."""

    def __init__(self, metrics: SelfMetrics, listen: str, port: int, status: Callable[[], dict] | None = None,
                 incidents: Path | None = None, web: WebConfig | None = None) -> None:
        self._listen, self._port, self._web = listen, port, web or WebConfig()
        self._server = Server(_Pages(metrics, status, incidents, self._web), self._web.tls)
        self._serving = False

    @property
    def port(self) -> int:
        return self._server.port if self._serving else self._port

    def start(self) -> None:
        family = socket.getaddrinfo(self._listen or None, self._port, type=socket.SOCK_STREAM,
                                    flags=socket.AI_PASSIVE)[0][0]
        try:
            self._server.start(self._listen, self._port, family)
        except OSError as exc:  # the bare "Address already in use" names neither the address nor the setting
            host = f"[{self._listen}]" if ":" in self._listen else self._listen
            raise OSError(exc.errno, f"cannot serve metrics on {host}:{self._port} ([exporter] listen and "
                                     f"port; another gpuwarden?): {exc.strerror}") from None
        self._serving = True

    def stop(self) -> None:
        if self._serving:
            self._server.stop()
            self._serving = False


def port_taken(sink: Sink, listen: str, port: int, uid: int, interval: float) -> str:
    """Another user serves on the exporter's port (gpuwarden's is unprivileged): Prometheus scrapes that user's
    answers, sends it its basic-auth password, and sees no exporter down. One `exporter_port_taken` warning (an
    alert) naming the holder; returns it (`pid user command`, its secrets masked; else its uid)."""
    who = holders_of(port, uid) or f"uid {uid}"
    sink.record([Event(
        "exporter_port_taken", Severity.WARNING,
        f"the exporter's port {port} is held by another user ({who}): Prometheus scrapes that process, not "
        f"gpuwarden, and sends it its credentials, until the port is free (tried every {interval:.0f} s). "
        "gpuwarden watches and acts as ever; a port below 1024 cannot be taken (docs/security.md)", time.time(),
        evidence={"port": port, "listen": listen, "uid": uid, "holder": who})])
    return who


def holders_of(port: int, uid: int) -> str:
    """`pid user command` of `uid`'s processes listening on `port` (secrets masked), from the kernel's socket table
    and that user's processes alone, at most FOREIGN_LINKS of their descriptors read: a scan of every process's
    descriptors (psutil.net_connections) is what a user holding a million of them turns into seconds on the loop."""
    import psutil

    from gpuwarden.engine.processes import FOREIGN_LINKS, holders
    from gpuwarden.runtime.sockets import listeners

    found = []
    for listener in listeners(port):
        if listener.uid == uid:
            found += holders(listener.inode, uid, limit=FOREIGN_LINKS)
    described = []
    for pid in sorted(set(found)):
        try:
            proc = psutil.Process(pid)
            described.append(f"{pid} {proc.username()} {redact_command(' '.join(proc.cmdline()))[:120]}")
        except psutil.Error:
            continue  # gone meanwhile
    return ", ".join(described)


STATUS_SOCKET = "status.sock"  # in the state directory


class LocalStatus:
    """The daemon's pages on a Unix socket in its state directory, for `gpuwarden status`: the exporter's TCP port
    is unprivileged, and any local user who holds it while gpuwarden restarts would answer root's `status` as the
    daemon. Only the daemon's user can make this file (the state directory is its own, 0700), it is 0600, and
    the client checks the peer's credentials too (SO_PEERCRED). No basic auth here: the file's mode is the
    access control."""

    def __init__(self, metrics: SelfMetrics, path: Path, status: Callable[[], dict],
                 incidents: Path | None) -> None:
        self.path = path
        self._server = Server(_Pages(metrics, status, incidents, WebConfig()), None)
        self._serving = False

    def start(self) -> None:
        """Binds the socket, replacing a socket left by a daemon that did not stop (anything else there is an
        error: never unlinked)."""
        try:
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(self.path))
            os.chmod(self.path, 0o600)
        except BaseException:
            sock.close()
            raise
        self._server.serve(sock)
        self._serving = True

    def stop(self) -> None:
        if self._serving:
            self._server.stop()
            self._serving = False
            try:
                os.unlink(self.path)
            except OSError:
                pass


class _Pages:
    """The server's app (its own object: the server holds it, and it holds nothing of the server). /metrics is
    answered at once, from the server's loop; what may block (a snapshot from a busy daemon loop, a picture on a
    hung disk, a bcrypt) runs in a bounded pool, so that it never holds up a scrape."""

    def __init__(self, metrics: SelfMetrics, status: Callable[[], dict] | None, incidents: Path | None,
                 web: WebConfig) -> None:
        self._metrics, self._status, self._incidents, self._web = metrics, status, incidents, web
        self._process = exposition.Process()
        self._requests = 0  # names each pool call: the pools bound how many at once, not one per page
        self._turns: tuple[asyncio.AbstractEventLoop, dict[OffLoop, asyncio.Semaphore]] | None = None  # _in_turn

    def __call__(self, method: str, path: str, authorization: str | None):
        allowed = self._web.cached(authorization)
        if allowed is None:
            return self._checked(method, path, authorization)
        return self._page(method, path) if allowed else _UNAUTHORIZED

    async def _checked(self, method: str, path: str, authorization: str | None):
        """A password not proved lately costs a bcrypt (tens of ms on purpose): in the pool, not on the loop."""
        try:
            async with asyncio.timeout(_PAGE_DEADLINE):
                allowed = await self._in_turn(_CHECKS, self._web.allows, authorization)
        except (Busy, TimeoutError):
            return self._plain("503 Service Unavailable", b"busy\n")
        if not allowed:
            return _UNAUTHORIZED
        page = self._page(method, path)
        return page if isinstance(page, Answer) else await page

    async def _in_turn(self, pool: OffLoop, fn: Callable, *args):
        """`fn` in `pool` when a place is free, first come first served (the caller bounds the wait). Told busy at
        once instead, a scrape not yet proved lost every time to wrong passwords sent without a pause, and a
        status page 17 times in 20 to four clients asking for it again and again; those waiting are bounded by the
        server's connections. A place is held until its thread returns, even for a client gone: the pool counts
        that thread until then, and the next in turn would be told busy."""
        loop = asyncio.get_running_loop()
        if self._turns is None or self._turns[0] is not loop:  # a semaphore belongs to the loop it waited in
            self._turns = (loop, {})
        if (turn := self._turns[1].get(pool)) is None:
            turn = self._turns[1][pool] = asyncio.Semaphore(pool.limit)
        await turn.acquire()
        call = loop.create_task(self._pool(pool, _PAGE_DEADLINE, fn, *args))

        def done(call: asyncio.Task) -> None:
            turn.release()
            if not call.cancelled():
                call.exception()  # read: a client gone leaves no "exception never retrieved"
        call.add_done_callback(done)
        return await asyncio.shield(call)

    def _page(self, method: str, path: str):
        if path == "/metrics":
            body = exposition.render(self._metrics.snapshot(), self._process.render())
            return Answer("200 OK", _METRICS_HEADERS, body)
        if self._incidents and (picture := _PICTURE.fullmatch(path)):
            return self._picture(picture[1])
        if self._status is None or path not in ("/", "/status", "/status.json"):
            return self._plain("404 Not Found", b"not found: see /metrics\n")
        return self._status_page(path)

    async def _status_page(self, path: str):
        try:
            async with asyncio.timeout(_PAGE_DEADLINE):
                return await self._in_turn(_PAGES, self._render, path)
        except Busy:
            return self._plain("503 Service Unavailable", b"busy\n")
        except TimeoutError as exc:  # the pool's deadline; the daemon's own comes first and is rendered
            return self._plain("503 Service Unavailable", f"{exc or 'no answer'}\n".encode())

    def _render(self, path: str):
        """The page, from a pool thread: the snapshot waits on the daemon's loop, up to its deadline."""
        from gpuwarden.web import statuspage  # with the first page asked for: it loads html and its entities (86 KB)

        try:
            snap = self._status()
        except TimeoutError as exc:
            if path == "/status.json":
                return Answer("503 Service Unavailable", _headers("application/json"),
                              json.dumps({"error": str(exc)}).encode())
            return Answer("503 Service Unavailable", _headers("text/html; charset=utf-8"),
                          statuspage.unavailable(str(exc)).encode())
        if path == "/status.json":
            return Answer("200 OK", _headers("application/json"), json.dumps(snap).encode())
        return Answer("200 OK", _headers("text/html; charset=utf-8"), statuspage.render(snap).encode())

    async def _picture(self, incident: str):
        try:
            data = await self._pool(_PICTURES, _PAGE_DEADLINE, self._read_picture, incident)
        except (Busy, TimeoutError):  # a hung state disk: its reads hold pool threads, never the server's loop
            return self._plain("503 Service Unavailable", b"busy\n")
        if data is None:
            return self._plain("404 Not Found", b"no picture (yet)\n")
        return Answer("200 OK", _headers(_PICTURE_TYPE), data)

    def _read_picture(self, incident: str) -> bytes | None:
        """An incident's picture: a plain file in the bundle's folder (the name has no slash and no leading dot;
        a link is not followed), at most _MAX_PICTURE."""
        try:
            fd = os.open(self._incidents / incident / report.PICTURE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                data = f.read(_MAX_PICTURE + 1) if stat.S_ISREG(os.fstat(f.fileno()).st_mode) else None
        except OSError:
            return None  # not drawn yet, drawing failed, or no such incident
        return data if data is not None and len(data) <= _MAX_PICTURE else None

    def _pool(self, pool: OffLoop, deadline: float, fn: Callable, *args):
        self._requests += 1
        return pool.run(str(self._requests), deadline, fn, *args)

    def _plain(self, status: str, body: bytes) -> Answer:
        return Answer(status, _headers("text/plain"), body)


_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'"  # its own style sheet and pictures only
_PICTURE = re.compile(r"/incidents/([A-Za-z0-9][A-Za-z0-9_.-]{0,127})/" + re.escape(report.PICTURE))
# report.PICTURE is an SVG: said here, as mimetypes would read the system's tables to say it (0.35 MB held for good)
_PICTURE_TYPE = "image/svg+xml"
_MAX_PICTURE = 8 << 20
# Pools of what may block (each call a thread, at most `limit` at once). The status snapshot has its own deadline
# (the daemon's, 2 s), under this one.
_PAGE_DEADLINE = 10.0
_PAGES = OffLoop("status page", limit=4)
_PICTURES = OffLoop("picture", limit=2)
_CHECKS = OffLoop("password check", limit=2)


def _headers(content_type: str, extra: tuple[tuple[str, str], ...] = ()) -> tuple[tuple[str, str], ...]:
    return (("Content-Type", content_type), ("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"),
            ("Content-Security-Policy", _CSP), *extra)


_METRICS_HEADERS = _headers(exposition.CONTENT_TYPE)
_UNAUTHORIZED = Answer("401 Unauthorized", _headers("text/plain", (("WWW-Authenticate", 'Basic realm="gpuwarden"'),)),
                       b"unauthorized\n")
