"""The exporter's own HTTP server (webserver.py) against real sockets, a real TLS client and real hung reads (a
FIFO where a picture should be: open() blocks until a writer comes), in this process: keep-alive and what ends a
connection, the bound on connections, the deadline on a client that sends nothing, never finishes its TLS hello or
never reads its answer, pages that block without holding up /metrics, a prompt stop. CONNECTION_TIMEOUT is made
short here so that the tests wait less; no assert is on time."""

import base64
import os
import socket
import ssl
import subprocess
import threading
import weakref
from collections.abc import Callable
from contextlib import contextmanager

import bcrypt
import pytest
from helpers import need, wait_for

from gpuwarden.config.web import WebConfig
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.store import bundles as report
from gpuwarden.web import server as webserver
from gpuwarden.web.exporter import Exporter


@pytest.fixture(autouse=True)
def short_deadline(monkeypatch):
    monkeypatch.setattr(webserver, "CONNECTION_TIMEOUT", 0.5)


@pytest.fixture
def serve(tmp_path):
    started = []

    def make(**kw) -> Exporter:
        exporter = Exporter(SelfMetrics(), "127.0.0.1", 0, **kw)
        exporter.start()
        started.append(exporter)
        return exporter
    yield make
    for exporter in started:
        exporter.stop()


def connect(exporter, timeout=10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", exporter.port), timeout)


_READERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def read_answer(sock, to_head: bool = False) -> tuple[str, dict[str, str], bytes]:
    """One HTTP answer off a kept-alive connection (status line, headers, body by Content-Length unless `to_head`),
    read through one buffered reader per socket, so that what came of the next answer is kept for it."""
    reader = _READERS.setdefault(sock, sock.makefile("rb"))
    status = reader.readline().decode("latin-1").rstrip("\r\n")
    assert status, "closed before an answer"
    headers = {}
    while (line := reader.readline().decode("latin-1").rstrip("\r\n")):
        name, _, value = line.partition(":")
        headers[name.lower()] = value.strip()
    body = b"" if to_head else reader.read(int(headers["content-length"]))
    assert len(body) == (0 if to_head else int(headers["content-length"])), "closed within the body"
    return status, headers, body


def closed_by_server(sock) -> bool:
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@contextmanager
def asking(exporter, count: int, request: Callable[[int], bytes], pause: float = 0.0):
    """`count` kept connections, each sending `request(answers so far)` again as soon as answered (or `pause` s
    later) until the block ends; yields the status lines they were answered. A dropped one stops asking."""
    stop, answered = threading.Event(), []
    socks = [connect(exporter) for _ in range(count)]

    def ask(sock):
        try:
            while not stop.is_set():
                sock.sendall(request(len(answered)))
                answered.append(read_answer(sock)[0])
                stop.wait(pause)
        except (OSError, AssertionError):
            pass  # dropped: its place is free
    threads = [threading.Thread(target=ask, args=(sock,)) for sock in socks]
    for thread in threads:
        thread.start()
    try:
        yield answered
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        for sock in socks:
            sock.close()


def test_keep_alive_http_1_0_and_what_closes_a_connection(serve):
    exporter = serve()
    with connect(exporter) as sock:  # HTTP/1.1: several requests on one connection, HEAD without a body
        for request in (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", b"HEAD /metrics HTTP/1.1\r\n\r\n",
                        b"GET /metrics?name[]=x HTTP/1.1\r\n\r\nGET /nowhere HTTP/1.1\r\n\r\n"):
            sock.sendall(request)
            status, headers, body = read_answer(sock, to_head=request.startswith(b"HEAD"))
            assert status == "HTTP/1.1 200 OK" and "connection" not in headers
            assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
            assert headers["x-content-type-options"] == "nosniff" and headers["cache-control"] == "no-store"
            assert (b"gpuwarden_build_info{" in body) == (not request.startswith(b"HEAD"))
        status, _, _ = read_answer(sock)  # the pipelined second request
        assert status == "HTTP/1.1 404 Not Found"
    for request, said in [(b"GET /metrics HTTP/1.0\r\n\r\n", "200 OK"),
                          (b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n", "200 OK"),
                          (b"GET /metrics HTTP/1.1\r\nContent-Length: 4\r\n\r\nGET ", "200 OK"),  # a body: closed
                          (b"GET /metrics HTTP/1.1\r\nContent-Length: 27\r\nContent-Length: 0\r\n\r\n"
                           b"GET /smuggled HTTP/1.1\r\n\r\n", "200 OK"),  # a body by its first length: closed
                          (b"POST /metrics HTTP/1.1\r\n\r\n", "405 Method Not Allowed"),
                          (b"GET /metrics\r\n\r\n", "400 Bad Request"),
                          (b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n", "400 Bad Request"),
                          (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * webserver.MAX_HEAD, "431 Request Header Fields")]:
        with connect(exporter) as sock:
            sock.sendall(request)
            status, headers, _ = read_answer(sock)
            assert status.startswith(f"HTTP/1.1 {said}") and headers["connection"] == "close", request
            assert closed_by_server(sock)
    with connect(exporter) as sock:  # a request then a half-close (printf ... | nc -N): answered, then closed
        sock.sendall(b"GET /metrics HTTP/1.1\n\n")  # bare LF, as typed
        sock.shutdown(socket.SHUT_WR)
        assert read_answer(sock)[0] == "HTTP/1.1 200 OK" and closed_by_server(sock)


def test_past_max_connections_a_new_one_takes_the_place_of_the_oldest_and_idle_ones_expire(serve):
    exporter = serve()
    before = open_fds()
    held = [connect(exporter) for _ in range(webserver.MAX_CONNECTIONS)]
    with connect(exporter) as extra:  # one too many: served, in the place of the one opened first
        extra.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        assert extra.recv(100).startswith(b"HTTP/1.1 200 OK")  # (not read_answer: its reader holds the socket)
    assert closed_by_server(held[0])
    assert all(closed_by_server(sock) for sock in held)  # nothing sent within CONNECTION_TIMEOUT: closed
    for sock in held:
        sock.close()
    wait_for(lambda: open_fds() <= before, 10, what="the server's descriptors to be released")
    with connect(exporter) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        assert read_answer(sock)[0] == "HTTP/1.1 200 OK"


def test_a_request_head_dripped_a_byte_at_a_time_is_dropped_at_the_deadline(serve):
    """Slowloris: one byte each third of CONNECTION_TIMEOUT. Each byte used to count as progress, so that a head
    of 8 KB held its place for hours; now the head has CONNECTION_TIMEOUT from its first byte."""
    exporter = serve()
    head = b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 60
    with connect(exporter) as sock:
        try:
            for byte in head:  # 30 deadlines' worth of drip at most
                sock.sendall(bytes([byte]))
                threading.Event().wait(webserver.CONNECTION_TIMEOUT / 3)
            sock.sendall(b"\r\n\r\n")
            answer = sock.recv(100)
        except (BrokenPipeError, ConnectionResetError):
            answer = b""
        assert answer == b"", f"a head dripped over {len(head)} bytes was answered: {answer!r}"


def test_clients_holding_every_place_with_a_request_now_and_then_do_not_keep_out_another(serve):
    """MAX_CONNECTIONS clients, each asking for a page well within the deadline: a new client used to be closed
    unanswered for as long as they went on; it takes the place of the one opened longest ago."""
    exporter = serve()
    with asking(exporter, webserver.MAX_CONNECTIONS, lambda n: b"GET /nowhere HTTP/1.1\r\n\r\n",
                pause=webserver.CONNECTION_TIMEOUT / 4):
        for _ in range(3):
            with connect(exporter) as sock:
                sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
                assert read_answer(sock)[0] == "HTTP/1.1 200 OK"


def test_a_client_that_does_not_read_its_answer_is_dropped(serve, tmp_path):
    """An 8 MB picture asked for and never read: the server holds it until the deadline, then lets it go."""
    incidents = tmp_path / "incidents"
    (incidents / "i1").mkdir(parents=True)
    (incidents / "i1" / report.PICTURE).write_bytes(b"<svg>" + b" " * ((8 << 20) - 11) + b"</svg>")
    exporter = serve(incidents=incidents)
    before = open_fds()
    sock = connect(exporter)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(f"GET /incidents/i1/{report.PICTURE} HTTP/1.1\r\n\r\n".encode())
    wait_for(lambda: open_fds() == before + 2, 10, what="the server's end")  # and the client's
    wait_for(lambda: open_fds() <= before + 1, 20, what="the server to drop the connection that does not read")
    sock.close()


@pytest.fixture
def tls(tmp_path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The server's context with a certificate made by the real openssl, and a client's that trusts it."""
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    subprocess.run([need("openssl", "openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True, timeout=60)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context, ssl.create_default_context(cafile=str(cert))


def test_tls_a_hello_never_finished_holds_nothing_and_plain_http_gets_no_answer(serve, tls):
    context, trust = tls
    exporter = serve(web=WebConfig(tls=context))
    before = open_fds()
    silent = [connect(exporter) for _ in range(webserver.MAX_CONNECTIONS)]  # they count while in the handshake
    half = connect(exporter)
    assert closed_by_server(half)  # the 17th: in the place of the first, no hello: closed
    assert all(closed_by_server(sock) for sock in silent)  # no hello within the deadline: closed
    for sock in [*silent, half]:
        sock.close()
    wait_for(lambda: open_fds() <= before, 10, what="the handshakes' descriptors to be released")
    with connect(exporter) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        assert closed_by_server(sock)  # plain HTTP on the TLS port: no answer
    with trust.wrap_socket(connect(exporter), server_hostname="127.0.0.1") as sock:
        for _ in range(2):  # kept alive over TLS
            sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            status, _, body = read_answer(sock)
            assert status == "HTTP/1.1 200 OK" and b"process_open_fds" in body


def test_blocking_pages_hold_up_neither_metrics_nor_the_stop(serve, tmp_path):
    """A status snapshot that waits on a stuck daemon loop and pictures on a hung disk (a FIFO: open() blocks)
    take pool threads; /metrics is answered meanwhile, a third picture is told busy, and stop() is not held."""
    release = threading.Event()
    incidents = tmp_path / "incidents"
    for name in ("a", "b", "c"):
        (incidents / name).mkdir(parents=True)
        os.mkfifo(incidents / name / report.PICTURE)
    exporter = serve(status=lambda: release.wait(30) and {}, incidents=incidents)
    waiting = []
    for path in ("/status.json", f"/incidents/a/{report.PICTURE}", f"/incidents/b/{report.PICTURE}"):
        sock = connect(exporter)
        sock.sendall(f"GET {path} HTTP/1.1\r\n\r\n".encode())
        waiting.append(sock)
    try:
        for _ in range(3):
            with connect(exporter) as sock:
                sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
                assert read_answer(sock)[0] == "HTTP/1.1 200 OK"
        with connect(exporter) as sock:
            def busy():
                sock.sendall(f"GET /incidents/c/{report.PICTURE} HTTP/1.1\r\n\r\n".encode())
                return read_answer(sock)[0] == "HTTP/1.1 503 Service Unavailable" or None
            wait_for(busy, 10, what="the third picture to be told busy while two reads hang")
        release.set()
        status, _, body = read_answer(waiting[0])
        assert status == "HTTP/1.1 200 OK" and body == b"{}"
        stopper = threading.Thread(target=exporter.stop)
        stopper.start()
        stopper.join(30)
        assert not stopper.is_alive()
        assert all(closed_by_server(sock) for sock in waiting[1:])  # the hung pictures' clients were let go
        with socket.socket() as again:  # the port is free at once
            again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            again.bind(("127.0.0.1", exporter.port))
    finally:
        release.set()
        for name in ("a", "b", "c"):  # a writer lets the hung open()s return
            try:
                os.close(os.open(incidents / name / report.PICTURE, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        for sock in waiting:
            sock.close()


def test_requests_pipelined_by_a_client_that_reads_nothing_do_not_pile_up(serve, monkeypatch):
    """Each answer written waits in the daemon until the client reads it: past the transport's high-water mark no
    more requests are read. 400 requests for a 200 KB page would otherwise be 80 MB held; all are answered once
    the client reads."""
    monkeypatch.setattr(webserver, "CONNECTION_TIMEOUT", 30.0)  # the client's pause here is not the one dropped
    exporter = serve()
    metrics = exporter._server._app._metrics  # the page made big: many series
    for i in range(2000):
        metrics.set("gpuwarden_source_up", 1, f"source-{i:05d}-" + "x" * 60)
    rendered = []
    snapshot = metrics.snapshot
    monkeypatch.setattr(metrics, "snapshot", lambda: rendered.append(1) or snapshot())
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", exporter.port))
    with sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n" * 400)
        seen = -1
        while seen != len(rendered):  # until the server stops making answers
            seen = len(rendered)
            threading.Event().wait(1.0)
        assert seen < 100, f"{seen} answers made for a client that read none"
        for i in range(400):
            status, _, body = read_answer(sock)
            assert status == "HTTP/1.1 200 OK" and len(body) > 150_000, (i, len(body))


def test_wrong_passwords_sent_without_a_pause_do_not_keep_a_right_one_out(serve):
    """Each password not proved lately costs a bcrypt, two at a time. Guessers that asked again as soon as told
    401 kept both checkers busy, and a scrape whose password was not proved yet was told 503 busy every time; now
    checks take turns, and the scrape waits for its own behind theirs."""
    exporter = serve(web=WebConfig(users={"prometheus": bcrypt.hashpw(b"right", bcrypt.gensalt(8))}))

    def request(password: str) -> bytes:
        token = base64.b64encode(f"prometheus:{password}".encode()).decode()
        return f"GET /metrics HTTP/1.1\r\nAuthorization: Basic {token}\r\n\r\n".encode()

    with asking(exporter, 4, lambda n: request(f"guess {n}")) as answered:
        wait_for(lambda: len(answered) >= 8, 30, what="the guessers to be answered")
        for _ in range(3):
            with connect(exporter) as sock:
                sock.sendall(request("right"))
                assert sock.recv(100).startswith(b"HTTP/1.1 200 OK")
            web = exporter._server._app._web
            with web._lock:
                web._proved.clear()  # proved again next time: a bcrypt, in its turn
        assert set(answered) == {"HTTP/1.1 401 Unauthorized"}


def test_a_picture_that_is_a_link_or_a_path_out_of_its_folder_is_not_served(serve, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("<svg>not for you</svg>")
    incidents = tmp_path / "incidents"
    (incidents / "i1").mkdir(parents=True)
    (incidents / "i1" / report.PICTURE).symlink_to(secret)
    (incidents / "i2").mkdir()
    (incidents / "i2" / report.PICTURE).write_text("<svg/>")
    exporter = serve(incidents=incidents)
    for path in (f"/incidents/i1/{report.PICTURE}", f"/incidents/%2e%2e/{report.PICTURE}",
                 f"/incidents/i2%2f..%2fi1/{report.PICTURE}", f"/incidents/i2/../i1/{report.PICTURE}"):
        with connect(exporter) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nConnection: close\r\n\r\n".encode())
            assert sock.recv(100).startswith(b"HTTP/1.1 404 "), path
    with connect(exporter) as sock:  # the plain file next to it is served: the 404s above are not for every path
        sock.sendall(f"GET /incidents/i2/{report.PICTURE} HTTP/1.1\r\nConnection: close\r\n\r\n".encode())
        assert sock.recv(100).startswith(b"HTTP/1.1 200 OK")


def test_clients_asking_for_the_status_page_again_and_again_do_not_keep_another_from_it(serve):
    """Four places in the status page's pool: four clients asking again as soon as answered had another told 503
    busy about 17 times in 20; now it waits for its turn behind theirs."""
    exporter = serve(status=lambda: threading.Event().wait(0.005) or {"ok": 1})
    with asking(exporter, 4, lambda n: b"GET /status.json HTTP/1.1\r\n\r\n") as answered:
        wait_for(lambda: len(answered) >= 20, 30, what="the askers to be answered")
        for _ in range(5):
            with connect(exporter) as sock:
                sock.sendall(b"GET /status.json HTTP/1.1\r\nConnection: close\r\n\r\n")
                assert sock.recv(100).startswith(b"HTTP/1.1 200 OK")


def test_tls_clients_asking_without_a_pause_and_coming_back_when_dropped_do_not_keep_out_another(serve, tls):
    """Sixteen TLS clients asking again as soon as answered, each back at once when dropped. Had the place of the
    one answered longest ago been given, that would always be the newcomer in its handshake: the first one it
    dropped, coming back, took its place (20 scrapes in 20 lost). The one opened longest ago gives its place."""
    context, trust = tls
    exporter = serve(web=WebConfig(tls=context))
    stop = threading.Event()

    def ask():
        while not stop.is_set():
            try:
                with trust.wrap_socket(connect(exporter), server_hostname="127.0.0.1") as sock:
                    while not stop.is_set():
                        sock.sendall(b"GET /nowhere HTTP/1.1\r\n\r\n")
                        if not sock.recv(65536):
                            break
            except OSError:
                pass
    threads = [threading.Thread(target=ask) for _ in range(webserver.MAX_CONNECTIONS)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(5):
            with trust.wrap_socket(connect(exporter), server_hostname="127.0.0.1") as sock:
                sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
                assert sock.recv(100).startswith(b"HTTP/1.1 200 OK")
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
