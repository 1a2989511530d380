"""Prometheus exporter: the daemon's self-metrics, served from a consistent in-memory snapshot.

Components write through `SelfMetrics`, naming a family by its handle (families.py); a scrape copies everything
under one lock and renders the copy, so concurrent scrapes (prometheus_client runs one thread per request)
never see a half-updated state.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import stat
import sys
import threading
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from gpuwarden import __version__, report
from gpuwarden import families as f
from gpuwarden.families import FAMILIES, Family
from gpuwarden.webconfig import WebConfig


class SelfMetrics:
    """Thread-safe values of the declared families, keyed by label values."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple[str, ...], float]] = defaultdict(dict)
        self._live: dict[str, Callable[[], float]] = {}
        # what platform.python_version() reads, without loading platform (1.5 ms of every start)
        self.set(f.BUILD_INFO, 1, __version__, sys.version.split()[0])

    def inc(self, family: Family | str, *labels: str, by: float = 1) -> None:
        name = _declared(family, labels)
        if not math.isfinite(by):
            return  # NaN or Inf would poison the series for good
        with self._lock:
            series = self._values[name]
            series[labels] = series.get(labels, 0) + by

    def set(self, family: Family | str, value: float, *labels: str) -> None:
        name = _declared(family, labels)
        if not math.isfinite(value):
            return  # NaN or Inf from a source is not a reading: the last good value stays
        with self._lock:
            self._values[name][labels] = value

    def replace(self, family: Family | str, series: dict[tuple[str, ...], float]) -> None:
        """All series of one family at once: series of a GPU that went away disappear with it."""
        name = _declared(family, *series)
        with self._lock:
            self._values[name] = {labels: v for labels, v in series.items() if math.isfinite(v)}

    def live(self, family: Family | str, value: Callable[[], float]) -> None:
        """A gauge without labels computed whenever it is read (a scrape, a snapshot), from the reader's thread:
        for a value that must be current while the loop that would set it is blocked. `value` must not block."""
        name = _declared(family, ())
        with self._lock:
            self._live[name] = value

    def snapshot(self) -> dict[str, dict[tuple[str, ...], float]]:
        with self._lock:
            values = {name: dict(series) for name, series in self._values.items()}
            live = list(self._live.items())
        for name, value in live:
            if math.isfinite(reading := value()):
                values[name] = {(): reading}
        return values


def _declared(family: Family | str, *label_sets: tuple[str, ...]) -> str:
    """The family's name, when it is declared in families.py (a handle, or its name from a test or a tool) and
    every label set fits its labels; anything else is a bug that must not pass silently."""
    declared = FAMILIES.get(family.name if isinstance(family, Family) else family)
    if declared is None or (isinstance(family, Family) and family != declared):
        raise KeyError(f"undeclared metric family {family!r}: declare it in gpuwarden/families.py")
    for labels in label_sets:
        if len(labels) != len(declared.labels):
            raise ValueError(f"{declared.name} has labels {declared.labels}, not {labels!r}")
    return declared.name


class _Collector:
    def __init__(self, metrics: SelfMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> list:
        return []  # collect() is cheap, but there is no need to run it at registration

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily  # loaded by Exporter()

        snapshot = self._metrics.snapshot()
        for name in [n for n in FAMILIES if n in snapshot]:  # declaration order, not the order of first use
            series, family = snapshot[name], FAMILIES[name]
            cls = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
            metric = cls(name.removesuffix("_total"), family.doc, labels=family.labels)
            for labels, value in sorted(series.items()):
                metric.add_metric(labels, value)
            yield metric


class Exporter:
    """/metrics; the status page at / and /status, its snapshot at /status.json, the incidents' pictures under
    /incidents/; 404 elsewhere. `status` gives the daemon's snapshot (from this server's threads: it may raise
    TimeoutError when the loop does not answer); `incidents` is the folder of the incident bundles; `web` its
    TLS and basic auth (webconfig.py), on every path."""

    def __init__(self, metrics: SelfMetrics, listen: str, port: int, status: Callable[[], dict] | None = None,
                 incidents: Path | None = None, web: WebConfig | None = None) -> None:
        # here, not at the top: the web stack (prometheus_client, wsgiref, http.server, email: 4 MB, 20 ms) is
        # loaded only by a daemon that serves metrics
        from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(metrics))
        ProcessCollector(registry=self.registry)  # process_*: the daemon's own CPU, memory, descriptors, start time
        self._listen, self._port, self._web = listen, port, web or WebConfig()
        self._pages = _Pages(make_wsgi_app(self.registry), status, incidents, self._web)
        self._server = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.server_port if self._server else self._port

    def start(self) -> None:
        family = socket.getaddrinfo(self._listen or None, self._port, type=socket.SOCK_STREAM,
                                    flags=socket.AI_PASSIVE)[0][0]
        from gpuwarden import webserver  # with Exporter(): the web stack only for a daemon that serves metrics

        try:
            self._server = webserver.serve(self._listen, self._port, self._pages, family, self._web.tls)
        except OSError as exc:  # the bare "Address already in use" names neither the address nor the setting
            host = f"[{self._listen}]" if ":" in self._listen else self._listen
            raise OSError(exc.errno, f"cannot serve metrics on {host}:{self._port} ([exporter] listen and "
                                     f"port; another gpuwarden?): {exc.strerror}") from None
        self._thread = threading.Thread(target=self._server.serve_forever, name="exporter", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None


class _Pages:
    """The server's WSGI application (its own object: the server holds it, and it holds nothing of the server)."""

    def __init__(self, metrics_app: Callable, status: Callable[[], dict] | None, incidents: Path | None,
                 web: WebConfig) -> None:
        self._metrics_app, self._status, self._incidents, self._web = metrics_app, status, incidents, web

    def __call__(self, environ: dict, start_response: Callable) -> list[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if not self._web.allows(environ.get("HTTP_AUTHORIZATION")):
            return _answer(start_response, "401 Unauthorized", "text/plain", b"unauthorized\n",
                           (("WWW-Authenticate", 'Basic realm="gpuwarden"'),))
        if path == "/metrics":
            return self._metrics_app(environ, start_response)
        if self._incidents and (picture := _PICTURE.fullmatch(path)):
            return self._picture(picture[1], start_response)
        if self._status is None or path not in ("/", "/status", "/status.json"):
            return _answer(start_response, "404 Not Found", "text/plain", b"not found: see /metrics\n")
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return _answer(start_response, "405 Method Not Allowed", "text/plain", b"GET only\n")
        from gpuwarden import statuspage  # with the first page asked for: it loads html and its entities (86 KB)

        try:
            snap = self._status()
        except TimeoutError as exc:
            if path == "/status.json":
                return _answer(start_response, "503 Service Unavailable", "application/json",
                               json.dumps({"error": str(exc)}).encode())
            return _answer(start_response, "503 Service Unavailable", "text/html; charset=utf-8",
                           statuspage.unavailable(str(exc)).encode())
        if path == "/status.json":
            return _answer(start_response, "200 OK", "application/json", json.dumps(snap).encode())
        return _answer(start_response, "200 OK", "text/html; charset=utf-8", statuspage.render(snap).encode())

    def _picture(self, incident: str, start_response: Callable) -> list[bytes]:
        """An incident's picture: a plain file in the bundle's folder (the name has no slash and no leading dot;
        a link is not followed). At most _PICTURE_READS at once, so a hung state disk never takes a scrape's
        thread."""
        if not _PICTURE_READS.acquire(blocking=False):
            return _answer(start_response, "503 Service Unavailable", "text/plain", b"busy\n")
        try:
            fd = os.open(self._incidents / incident / report.PICTURE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                data = f.read(_MAX_PICTURE + 1) if stat.S_ISREG(os.fstat(f.fileno()).st_mode) else None
        except OSError:
            data = None  # not drawn yet, drawing failed, or no such incident
        finally:
            _PICTURE_READS.release()
        if data is None or len(data) > _MAX_PICTURE:
            return _answer(start_response, "404 Not Found", "text/plain", b"no picture (yet)\n")
        return _answer(start_response, "200 OK", _PICTURE_TYPE, data)


_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'"  # its own style sheet and pictures only
_PICTURE = re.compile(r"/incidents/([A-Za-z0-9][A-Za-z0-9_.-]{0,127})/" + re.escape(report.PICTURE))
# report.PICTURE is an SVG: said here, as mimetypes would read the system's tables to say it (0.35 MB held for good)
_PICTURE_TYPE = "image/svg+xml"
_PICTURE_READS = threading.BoundedSemaphore(2)
_MAX_PICTURE = 8 << 20


def _answer(start_response: Callable, status: str, content_type: str, body: bytes,
            extra: tuple[tuple[str, str], ...] = ()) -> list[bytes]:
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body))),
                            ("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"),
                            ("Content-Security-Policy", _CSP), *extra])
    return [body]
