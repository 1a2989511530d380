"""The exporter's HTTP server: one thread running its own asyncio loop, off the daemon's (a blocked daemon loop must
still be scraped: the loop-lag gauge says it is blocked), a small HTTP/1.x reader, no thread per connection and no
polling (wsgiref's server started a thread a connection and woke twice a second: most of a scrape's 2.9 ms).

HTTP: GET and HEAD; HTTP/1.1 connections are kept alive between requests (Prometheus reuses its connection, and
a TLS handshake a scrape would cost more than the scrape), HTTP/1.0 ones and requests with a body are answered
and closed; a request head is at most MAX_HEAD bytes. An answer the app gives at once (/metrics) is written from
the callback that read the request; one that may block (the status page, a picture) is a coroutine the app runs
through its bounded pools, and the connection waits for it without holding up others.

Anyone on the box can connect. One thread per connection with no deadline let a local user hold a descriptor and
a thread of the daemon per connection until it had none left (systemd's soft LimitNOFILE is 1024), which starves
everything else it opens: /proc, sockets, the store. So a connection is closed after CONNECTION_TIMEOUT without
progress (a request not coming, a TLS hello not finished, an answer not read), a request head must come whole
within CONNECTION_TIMEOUT of its first byte (a byte now and then is no progress: 16 clients dripping one each 4 s
held every place), and past MAX_CONNECTIONS at once (those in their TLS handshake included) a new one closes the
one opened longest ago: 16 clients asking for a page each few seconds, or dripping, would otherwise keep every
other client out for good. (Not the one answered longest ago: clients asking without a pause are always answered
later than a new one in its TLS handshake, and each of them dropped took that one's place as it came back.)
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable
from typing import NamedTuple

MAX_CONNECTIONS = 16
CONNECTION_TIMEOUT = 5.0
MAX_HEAD = 8192
_STOP_DEADLINE = 5.0
_END = re.compile(rb"\r?\n\r?\n")  # the end of a request head (curl and browsers send CRLF; a person typing, LF)


class Answer(NamedTuple):
    status: str  # "200 OK"
    headers: tuple[tuple[str, str], ...]  # without Content-Length and Connection, which the server adds
    body: bytes


# The app: (method, path, Authorization header or None) -> an answer now, or a coroutine that gives one
App = Callable[[str, str, str | None], Answer | Awaitable[Answer]]


class Server:
    """Bound by start() in the caller's thread (so that a port in use is the caller's error), served from its own
    thread until stop()."""

    def __init__(self, app: App, tls: ssl.SSLContext | None) -> None:
        self._app, self._tls = app, tls
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def start(self, listen: str, port: int, family: int) -> None:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart binds while old ones TIME_WAIT
            sock.bind((listen, port))
        except BaseException:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        self.serve(sock)

    def serve(self, sock: socket.socket) -> None:
        """Serves a bound socket (TCP, or the daemon's Unix socket for `gpuwarden status`), which it then owns."""
        try:
            sock.listen(MAX_CONNECTIONS)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, args=(self._loop, sock), name="exporter", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Closes the port and every connection; returns within _STOP_DEADLINE (a page's pool thread is not
        waited for)."""
        if self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._loop.stop)
        except RuntimeError:
            pass  # the loop already ended
        self._thread.join(_STOP_DEADLINE)
        self._loop = None

    def _run(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        connections = _Connections(self._app, self._tls, loop)
        try:
            server = loop.run_until_complete(loop.create_server(connections.new, sock=sock, backlog=MAX_CONNECTIONS))
            try:
                loop.run_forever()
            finally:
                server.close()  # the port first: a reload binds it again at once
                connections.close()
                if tasks := asyncio.all_tasks(loop):  # handshakes and pages, cancelled by the aborts
                    loop.run_until_complete(asyncio.wait(tasks, timeout=_STOP_DEADLINE / 2))
        finally:
            sock.close()
            loop.close()


class _Connections:
    """The open connections, counted and closed on stop; held by the loop's thread only."""

    def __init__(self, app: App, tls: ssl.SSLContext | None, loop: asyncio.AbstractEventLoop) -> None:
        self.app, self.tls, self.loop = app, tls, loop
        self.open: set[_Connection] = set()

    def new(self) -> _Connection:
        return _Connection(self)

    def close(self) -> None:
        for connection in list(self.open):
            connection.abort()


class _Connection(asyncio.Protocol):
    def __init__(self, connections: _Connections) -> None:
        self._all = connections
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._scanned = 0  # how much of the buffer holds no head's end: a dripping client is not scanned again
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0  # when the connection is dropped unless it made progress (loop time)
        self._opened = 0.0  # the one opened longest ago gives its place to a new one
        self._hello: asyncio.Task | None = None  # the TLS handshake
        self._task: asyncio.Task | None = None  # an answer being made: one request at a time
        self._unsent = 0  # what the transport held to send at the last deadline: progress is a smaller number
        self._closing = self._eof = self._full = False  # _full: the transport holds too much unsent

    def connection_made(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        if len(self._all.open) >= MAX_CONNECTIONS:
            # even one whose answer is being made (a page's pool thread runs on, bounded by the pool): 16 clients
            # each waiting in turn for its password's check would otherwise keep every other one out
            min(self._all.open, key=lambda c: c._opened).abort()
        self._all.open.add(self)
        self._opened = self._all.loop.time()
        self._deadline()
        if self._all.tls:
            transport.pause_reading()  # now, before the loop reads the hello into this plain protocol
            self._hello = self._all.loop.create_task(self._handshake(transport))

    async def _handshake(self, transport: asyncio.Transport) -> None:
        try:
            tls = await self._all.loop.start_tls(transport, self, self._all.tls, server_side=True,
                                                 ssl_handshake_timeout=CONNECTION_TIMEOUT)
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError):
            tls = None  # plain HTTP on the TLS port, a client that does not trust us, one that never ends its hello
        self._hello = None
        if tls is None:  # failed, or lost during the handshake (then start_tls returns None, and no
            transport.abort()  # connection_lost comes here)
            self.connection_lost(None)
            return
        self._transport = tls
        self._deadline()
        self._next()  # what came with the end of the handshake, before this coroutine resumed

    def data_received(self, data: bytes) -> None:
        if not self._buffer:  # a request begins: its head has CONNECTION_TIMEOUT to come whole
            self._deadline()
        self._buffer += data
        if self._hello is None:  # until start_tls returns, self._transport is the plain one: not to answer on
            self._next()

    def pause_writing(self) -> None:
        """A client that pipelines requests and reads no answer would have them pile up here: no more requests are
        read until it reads what it was sent (or the deadline drops it)."""
        self._full = True
        self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._full = False
        if self._task is None and not self._closing:
            self._transport.resume_reading()
            self._next()

    def eof_received(self) -> bool:
        """A client that sent its request and half-closed (printf ... | nc -N) still gets its answer."""
        self._eof = True
        if self._task is None:
            self._closing = True
            self._transport.close()
        return not self._all.tls  # half-open is not a thing over TLS (asyncio warns when asked)

    def connection_lost(self, exc: Exception | None) -> None:
        self._all.open.discard(self)
        self._closing = True
        if self._timer:
            self._timer.cancel()
        for task in (self._hello, self._task):
            if task:
                task.cancel()  # a page being made: its pool's thread runs on, bounded by the pool

    def abort(self) -> None:
        self._all.open.discard(self)  # now: its place is taken before connection_lost comes
        if self._transport:
            self._transport.abort()  # connection_lost follows, from the loop

    def _deadline(self) -> None:
        """CONNECTION_TIMEOUT from now. One timer a connection, moved on when it fires rather than made anew at
        each read and answer (a scrape a second on a kept connection arms none)."""
        self._due = self._all.loop.time() + CONNECTION_TIMEOUT
        if self._timer is None:
            self._timer = self._all.loop.call_at(self._due, self._expired)

    def _expired(self) -> None:
        """No request came, no hello ended, or an answer was not read within CONNECTION_TIMEOUT: closed. An answer
        being made is bounded by the app's pool; a big one being read slowly is fine while it moves."""
        self._timer = None
        if self._all.loop.time() < self._due:  # a read or an answer since it was armed
            self._timer = self._all.loop.call_at(self._due, self._expired)
            return
        unsent = 0 if self._hello else self._transport.get_write_buffer_size()
        if self._task is not None or 0 < unsent < self._unsent:
            self._unsent = unsent
            self._deadline()
            return
        self.abort()

    def _next(self) -> None:
        """Answers the requests in the buffer, one at a time."""
        while self._task is None and not self._closing and not self._full:
            end = _END.search(self._buffer, max(0, self._scanned - 3), MAX_HEAD)
            if end is None:
                self._scanned = len(self._buffer)
                if len(self._buffer) >= MAX_HEAD:
                    self._send(_plain("431 Request Header Fields Too Large", "request head too large\n"), "GET",
                               keep=False)
                return
            head = bytes(self._buffer[:end.start()]).decode("latin-1")
            del self._buffer[:end.end()]
            self._scanned = 0
            self._request(head)

    def _request(self, head: str) -> None:
        lines = head.split("\n")
        parts = lines[0].rstrip("\r").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
            self._send(_plain("400 Bad Request", "bad request\n"), "GET", keep=False)
            return
        method, target, version = parts
        headers = {}
        body = False  # any Content-Length but 0, in any of its lines (the last one alone let "5, then 0" through)
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                self._send(_plain("400 Bad Request", "bad header line\n"), "GET", keep=False)
                return
            name, value = name.strip().lower(), value.strip()
            headers[name] = value
            body = body or name == "transfer-encoding" or (name == "content-length" and value != "0")
        # a body is not read: its request is answered and the connection closed, rather than the body read as a
        # request; HTTP/1.0 closes after each answer
        keep = (version == "HTTP/1.1" and headers.get("connection", "").lower() != "close" and not self._eof
                and not body)
        if method not in ("GET", "HEAD"):
            self._send(_plain("405 Method Not Allowed", "GET only\n", (("Allow", "GET, HEAD"),)), method, False)
            return
        path = target.partition("?")[0]
        if "%" in path:
            from urllib.parse import unquote  # as wsgiref decoded PATH_INFO

            path = unquote(path, "latin-1")
        answer = self._all.app(method, path, headers.get("authorization"))
        if isinstance(answer, Answer):
            self._send(answer, method, keep)
            return
        self._transport.pause_reading()  # one request at a time: the next one waits in the socket
        self._task = self._all.loop.create_task(self._later(answer, method, keep))

    async def _later(self, answer: Awaitable[Answer], method: str, keep: bool) -> None:
        try:
            made = await answer
        except Exception:  # a page's bug: the client is told, the server goes on
            made = _plain("500 Internal Server Error", "internal error\n")
        self._task = None
        if self._closing:
            return
        keep = keep and not self._eof
        self._send(made, method, keep)
        if keep and not self._full:
            self._transport.resume_reading()
            self._next()

    def _send(self, answer: Answer, method: str, keep: bool) -> None:
        head = [f"HTTP/1.1 {answer.status}\r\n", *(f"{name}: {value}\r\n" for name, value in answer.headers),
                f"Content-Length: {len(answer.body)}\r\n", "\r\n" if keep else "Connection: close\r\n\r\n"]
        data = "".join(head).encode("latin-1")
        self._transport.write(data if method == "HEAD" else data + answer.body)
        self._unsent = self._transport.get_write_buffer_size()
        self._deadline()
        if not keep:
            self._closing = True
            self._transport.close()  # once what is written is sent; the deadline aborts it if it is not read


def _plain(status: str, text: str, extra: tuple[tuple[str, str], ...] = ()) -> Answer:
    return Answer(status, (("Content-Type", "text/plain"), *extra), text.encode())
