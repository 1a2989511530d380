"""The exporter's HTTP server: wsgiref's, with a thread per connection, a bounded number of them, a deadline on
each read, and the TLS handshake in the connection's own thread. Its own module so that the web stack
(wsgiref, http.server, email: megabytes) is loaded only by a daemon that serves metrics."""

from __future__ import annotations

import ssl
import sys
import threading
from collections.abc import Callable
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

# Anyone on the box can connect to the exporter. One thread per connection with no deadline let a local user
# hold a descriptor and a thread of the daemon per connection until it had none left (systemd's soft
# LimitNOFILE is 1024), which starves everything else it opens: /proc, sockets, the store. So a connection has
# CONNECTION_TIMEOUT per read, and past MAX_CONNECTIONS at once a new one is closed unanswered.
MAX_CONNECTIONS = 16
CONNECTION_TIMEOUT = 5.0


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    tls: ssl.SSLContext | None = None  # set: each connection's TLS handshake runs in its own thread, bounded

    def __init__(self, *args, **kw) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(*args, **kw)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            if self.tls:
                request.settimeout(CONNECTION_TIMEOUT)  # a client that never finishes its hello holds no thread
                try:
                    request = self.tls.wrap_socket(request, server_side=True)
                except OSError:  # a failed handshake (plain HTTP on the TLS port, a bad client) is the client's
                    self.shutdown_request(request)
                    return
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # a client that timed out or hung up is no error of ours
            super().handle_error(request, client_address)


class _Handler(WSGIRequestHandler):
    timeout = CONNECTION_TIMEOUT

    def log_message(self, format, *args) -> None:
        pass


def serve(listen: str, port: int, app: Callable, family: int, tls: ssl.SSLContext | None) -> WSGIServer:
    """A bound server for `app` (not yet serving: the caller runs serve_forever in its thread)."""
    server_class = type("Server", (_Server,), {"address_family": family, "tls": tls})
    return make_server(listen, port, app, server_class, _Handler)
