"""An engine's http:// endpoints are read by scraper.Plain (asyncio's streams), not httpx: each bound httpx held,
held by Plain itself, against real loopback servers that answer each connection with the bytes a test scripts."""

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuwarden.engine import scraper
from gpuwarden.engine.metrics import chosen
from gpuwarden.engine.scraper import HEAD_BYTES, Plain, ScrapeError, Scraper

BODY = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"


class Raw:
    """A loopback TCP server: each connection reads requests and answers each with `answer(n)`, the bytes (or a
    list of pieces, sent `gap` seconds apart) for the n-th request on any connection; None closes the connection."""

    def __init__(self, answer, gap=0.0):
        self.answer, self.gap, self.requests, self.connections = answer, gap, [], 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/metrics"
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.connections += 1
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn, contextlib.suppress(OSError):
            while not self.closed.is_set():
                request = conn.recv(65536)
                if not request:
                    return
                self.requests.append(request)
                answer = self.answer(len(self.requests))
                if answer is None:
                    return
                for piece in answer if isinstance(answer, list) else [answer]:
                    if piece is None or self.closed.is_set():
                        return
                    conn.sendall(piece)
                    time.sleep(self.gap)

    def close(self):
        self.closed.set()
        self.sock.close()


@pytest.fixture
def raw():
    servers = []

    def make(answer, gap=0.0):
        servers.append(Raw(answer, gap))
        return servers[-1]
    yield make
    for server in servers:
        server.close()


def ok(body=BODY, extra=b""):
    return b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body


def get(url, max_bytes=1 << 20, timeout=10.0, times=1):  # a deadline no loaded machine meets by chance
    async def run():
        client = Plain(url, timeout)
        try:
            return [await client.get(max_bytes) for _ in range(times)]
        finally:
            await client.aclose()
    return asyncio.run(run())


def failure(url, **kw) -> ScrapeError:
    with pytest.raises(ScrapeError) as caught:
        get(url, **kw)
    return caught.value


def test_an_http_engine_is_scraped_without_httpx_and_https_still_through_it():
    assert isinstance(Scraper("http://127.0.0.1:9/metrics")._client, Plain)
    assert not isinstance(Scraper("https://127.0.0.1:9/metrics")._client, Plain)


def test_a_kept_alive_connection_serves_the_next_scrape(raw):
    server = raw(lambda n: ok())
    assert get(server.url, times=3) == [BODY] * 3
    assert server.connections == 1
    assert server.requests[0].startswith(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:")


def test_a_connection_the_server_closes_is_not_kept(raw):
    server = raw(lambda n: ok(extra=b"Connection: close\r\n"))
    assert get(server.url, times=2) == [BODY] * 2
    assert server.connections == 2


def test_a_kept_connection_closed_by_the_server_while_idle_is_replaced(raw):
    """vLLM's server closes an idle connection after 5 s, a scrape's interval: the next scrape must not fail."""
    server = raw(lambda n: ok() if n % 2 else None)  # every second request: the connection closed unanswered
    assert get(server.url, times=2) == [BODY] * 2
    assert server.connections == 2


def test_a_dripping_server_fails_at_the_deadline_not_at_each_read(raw):
    server = raw(lambda n: [bytes([b]) for b in ok()], gap=0.05)  # every read comes in 50 ms
    error = failure(server.url, timeout=0.5)
    assert error.reason == "timeout" and "no whole answer within 0.5 s" in str(error)


def test_a_body_over_the_cap_is_refused_however_it_is_framed(raw):
    big = b"x" * 5000
    framings = [ok(big),
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + (b"400\r\n" + big[:1024] + b"\r\n") * 5
                + b"0\r\n\r\n",
                b"HTTP/1.0 200 OK\r\n\r\n" + big]  # no framing: the body ends with the connection
    for answer in framings:
        server = raw(lambda n, answer=answer: [answer, None])
        error = failure(server.url, max_bytes=4096)
        assert error.reason == "too_large" and "body larger than 4096 bytes" in str(error), answer[:40]


def test_headers_over_the_cap_are_refused(raw):
    server = raw(lambda n: b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"y" * HEAD_BYTES + b"\r\n\r\n")
    error = failure(server.url)
    assert error.reason == "too_large" and "headers larger than" in str(error)


def test_a_chunked_body_is_joined(raw):
    chunks = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(part), part) for part in BODY.splitlines(keepends=True))
    server = raw(lambda n: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks
                 + b"0\r\nX-Trailer: 1\r\n\r\n")
    assert get(server.url, times=2) == [BODY] * 2
    assert server.connections == 1


@pytest.mark.parametrize("size", [b"-1", b"0x10", b"zz", b""])
def test_a_chunk_size_that_is_not_hex_is_an_error(raw, size):
    server = raw(lambda n: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + size + b"\r\nabc\r\n0\r\n\r\n")
    error = failure(server.url)
    assert error.reason == "http" and "chunk size" in str(error)


def test_a_body_shorter_than_its_content_length_is_an_error_not_a_short_body(raw):
    server = raw(lambda n: [b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + BODY[:10], None])
    error = failure(server.url)
    assert error.reason == "http" and "closed the connection after 10 of the body's 100 bytes" in str(error)


def test_a_server_that_closes_before_answering_is_an_error(raw):
    server = raw(lambda n: None)
    error = failure(server.url)
    assert error.reason == "http" and "closed the connection before the whole answer" in str(error)


def test_a_redirect_is_not_followed(raw):
    server = raw(lambda n: b"HTTP/1.1 301 Moved\r\nLocation: http://127.0.0.1:9/\r\nContent-Length: 0\r\n\r\n")
    error = failure(server.url)
    assert (error.reason, str(error)) == ("http", "http: HTTP 301")
    assert len(server.requests) == 1


def test_a_closed_port_is_refused():
    with socket.create_server(("127.0.0.1", 0)) as held:
        url = f"http://127.0.0.1:{held.getsockname()[1]}/metrics"
    assert failure(url).reason == "refused"


def test_a_body_in_an_encoding_not_asked_for_is_an_error(raw):
    server = raw(lambda n: ok(extra=b"Content-Encoding: gzip\r\n"))
    error = failure(server.url)
    assert error.reason == "http" and "'gzip' encoding" in str(error)


def test_the_urls_user_and_query_are_sent(raw):
    server = raw(lambda n: ok())
    get(server.url.replace("http://", "http://us%40er:p%3Ass@") + "?name[]=a b&c=%41")
    request = server.requests[0].decode()
    assert request.startswith("GET /metrics?name[]=a%20b&c=%41 HTTP/1.1\r\n")  # encoded as httpx did
    assert "Authorization: Basic dXNAZXI6cDpzcw==\r\n" in request  # us@er:p:ss


def test_the_fetch_of_slots_and_metrics_names_the_endpoint(raw):
    server = raw(lambda n: b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

    async def run():
        client = scraper.client_for(server.url, 2.0)
        try:
            await scraper.fetch(client, server.url, 1 << 20, "/slots: ")
        finally:
            await client.aclose()
    with pytest.raises(ScrapeError, match=r"^http: /slots: HTTP 404$"):
        asyncio.run(run())


def test_the_profiles_lines_are_found_whatever_the_line_ends_and_only_at_a_lines_start():
    """Guard of the one-pass line filter (scraper._lines_of): CRLF line ends, a wanted name inside another line
    (a label value) or after an indent is not a line of it."""
    lf = (b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{m="a"} 2\n'
          b'other{v="\\nvllm:num_requests_running 50"} 1\n vllm:num_requests_waiting 9\nvllm:num_requests_waiting 4\n')
    for body in (lf, lf.replace(b"\n", b"\r\n")):
        sample = scraper._parse(body, "auto")
        assert (sample.profile, sample.running, sample.waiting) == ("vllm", 2.0, 4.0)


def test_an_auto_scraper_reads_the_kind_it_found_until_the_port_serves_another(raw, monkeypatch):
    """Detecting counts every kind's lines in the whole body (more than half of a parse): done once while the
    port keeps serving that kind, again when another engine answers there, against a real loopback server."""
    corpus = Path(__file__).parents[1] / "corpus" / "metrics"
    vllm, llamacpp = ((corpus / name).read_bytes() for name in ("vllm-01.prom", "llamacpp-01.prom"))
    bodies = [vllm, vllm, vllm, llamacpp, llamacpp, vllm]
    server = raw(lambda n: ok(bodies[n - 1]))
    detected = []
    monkeypatch.setattr(scraper, "chosen", lambda text, profile: detected.append(profile) or chosen(text, profile))

    async def run():
        reader = Scraper(server.url, timeout=10.0)
        try:
            return [(await reader.scrape()).profile for _ in bodies]
        finally:
            await reader.close()
    assert asyncio.run(run()) == ["vllm", "vllm", "vllm", "llamacpp", "llamacpp", "vllm"]
    # the first body detected; then read as vllm, until llama.cpp's body holds none of vllm's lines (read as vllm,
    # refused, detected), and back
    assert detected == ["auto", "vllm", "vllm", "vllm", "auto", "llamacpp", "llamacpp", "auto"]


def test_an_auto_scraper_detects_again_after_a_failed_scrape_and_every_so_many_bodies(raw, monkeypatch):
    """A body may hold two kinds' lines, and another engine may take the port: the kind found is kept for
    scraper.REDETECT bodies at most, and forgotten at a failed scrape (a restart's refused connection)."""
    vllm = (Path(__file__).parents[1] / "corpus" / "metrics" / "vllm-01.prom").read_bytes()
    answers = [ok(vllm)] * 3 + [b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"] + \
        [ok(vllm)] * (scraper.REDETECT + 1)
    server = raw(lambda n: answers[n - 1])
    detected = []
    monkeypatch.setattr(scraper, "chosen", lambda text, profile: detected.append(profile) or chosen(text, profile))

    async def run():
        reader = Scraper(server.url, timeout=10.0)
        try:
            for _ in answers:
                with contextlib.suppress(ScrapeError):
                    await reader.scrape()
        finally:
            await reader.close()
    asyncio.run(run())
    # detected, read as vllm twice; the failure; detected again, read as vllm until REDETECT bodies, detected again
    assert detected == ["auto", "vllm", "vllm", "auto", *["vllm"] * (scraper.REDETECT - 1), "auto"]


def test_discoverys_probe_reads_the_status_alone_within_its_deadline(raw, monkeypatch):
    """A status is all discovery asks: a 200 whose body never ends still answers; a dripping head does not."""
    from gpuwarden.engine import discovery

    endless = raw(lambda n: [b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"] + [b"#"] * 100, gap=0.1)
    dripping = raw(lambda n: [bytes([b]) for b in ok()], gap=0.2)  # 20 s for the whole head
    monkeypatch.setattr(discovery, "_PROBE_TIMEOUT", 10.0)  # the endless body's 10 s are never waited for
    assert discovery._answers(endless.url) is True
    monkeypatch.setattr(discovery, "_PROBE_TIMEOUT", 1.0)
    assert discovery._answers(dripping.url) is False


# --- a hostile answer: whatever its bytes, a ScrapeError (anything else ended the engines' watch, every engine's) ---

@pytest.mark.parametrize("length", [b"\xb2", b"1" * 5000])  # '²' is a digit to isdigit(), not to int()
def test_a_content_length_that_is_not_a_number_is_an_error_not_a_crash(raw, length):
    server = raw(lambda n: b"HTTP/1.1 200 OK\r\nContent-Length: " + length + b"\r\n\r\n" + BODY)
    error = failure(server.url)
    assert error.reason == "http" and "Content-Length" in str(error)


def test_a_status_that_is_not_ascii_digits_is_an_error_not_a_crash(raw):
    server = raw(lambda n: b"HTTP/1.1 \xb200 OK\r\nContent-Length: 0\r\n\r\n")
    error = failure(server.url)
    assert error.reason == "http" and "not an HTTP/1 answer" in str(error)


def test_a_trailer_line_over_the_cap_is_an_error_not_a_crash(raw):
    server = raw(lambda n: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: "
                 + b"y" * HEAD_BYTES + b"\r\n\r\n")
    error = failure(server.url)
    assert error.reason == "too_large" and "trailers" in str(error)


def test_a_body_of_countless_tiny_chunks_is_refused(raw):
    """Each chunk is a few reads on the loop, none of which yields while the bytes are there: a fake engine's
    million one-byte chunks would hold the loop for its whole timeout at each scrape."""
    server = raw(lambda n: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                 + b"1\r\nx\r\n" * (scraper.MAX_CHUNKS + 1) + b"0\r\n\r\n")
    error = failure(server.url)
    assert error.reason == "too_large" and f"more than {scraper.MAX_CHUNKS} chunks" in str(error)


def test_a_body_of_as_many_chunks_as_allowed_is_read(raw):
    server = raw(lambda n: b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                 + b"1\r\nx\r\n" * scraper.MAX_CHUNKS + b"0\r\n\r\n")
    assert get(server.url) == [b"x" * scraper.MAX_CHUNKS]


def test_a_lost_kept_connection_is_replaced_only_with_the_callers_word(raw):
    """The watch proves the address the engine's before each scrape, not before a connection made within one: the
    engine killed while a scrape waited on it, a squatter that took its port would get the request (and the URL's
    credentials) by the reconnect."""
    server = raw(lambda n: ok() if n == 1 else None)  # the second request: the connection closed unanswered
    asked = []

    async def run():
        client = Plain(server.url, 10.0)
        client.may_reconnect = lambda: asked.append(1) is not None  # no longer the engine's (append gives None)
        try:
            assert await client.get(1 << 20) == BODY  # a new connection: the caller's check came just before
            with pytest.raises(ScrapeError) as caught:
                await client.get(1 << 20)
            return caught.value
        finally:
            await client.aclose()
    error = asyncio.run(run())
    assert error.reason == "refused" and "no longer proven the engine's" in str(error)
    assert asked == [1] and server.connections == 1


def test_an_error_answer_leaves_nothing_for_the_next_scrape_to_read(raw):
    """A 404 with a body, then a 200: the next scrape reads its own answer, not the rest of the last one."""
    server = raw(lambda n: b"HTTP/1.1 404 Not Found\r\nContent-Length: 5\r\n\r\nnope\n" if n == 1 else ok())

    async def run():
        client = Plain(server.url, 10.0)
        try:
            with pytest.raises(ScrapeError):
                await client.get(1 << 20)
            return await client.get(1 << 20)
        finally:
            await client.aclose()
    assert asyncio.run(run()) == BODY


@pytest.mark.parametrize("body", [b"[" * 100_000, b'[{"id":0,"id_task":1,"n_past":1e400}]',
                                  b'[{"id":0,"id_task":1,"n_past":1' + b"0" * 400 + b"}]"])
def test_a_hostile_slots_body_is_unparsable_not_a_crash(raw, body):
    from gpuwarden.engine.slots import SlotsScraper

    server = raw(lambda n: ok(body))

    async def run():
        slots = SlotsScraper(server.url.removesuffix("/metrics"), 10.0)
        try:
            await slots.scrape()
        finally:
            await slots.close()
    with pytest.raises(ScrapeError) as caught:
        asyncio.run(run())
    assert caught.value.reason == "unparsable"


def test_slots_no_longer_answered_are_forgotten():
    """A /slots answer of new slot ids each time: remembered for ever, 40-60 MB more each scrape of 8 MiB."""
    from gpuwarden.engine.slots import SlotsProgress

    progress = SlotsProgress()
    for n in range(50):
        progress.sample([{"id": n * 1000 + i, "id_task": 1, "n_past": 1} for i in range(1000)])
    assert len(progress._seen) == 1000
    assert progress.total == 50 * 1000  # each new slot's tokens counted once


def test_a_long_malformed_metrics_line_is_refused_in_one_pass():
    """A name and a value that could split one run of letters every way: with backtracking, a failed match tried
    every split, seconds for a line of 100,000 letters with the GIL held. In a child, with a deadline: a regression
    must fail the test, not hang the run."""
    code = ("from gpuwarden.engine import scraper\n"
            "try:\n    scraper._parse(b'vllm:num_requests_running' + b'a' * 100_000 + b' 1 2 3\\n', 'vllm')\n"
            "except scraper.ScrapeError as e:\n    print(e.reason)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "unparsable", done.stderr[-2000:]


def test_a_large_slots_answer_is_parsed_off_the_loop_a_small_one_on_it(raw, monkeypatch):
    """/slots is read as /metrics is: a body over OFF_LOOP_BYTES is parsed in a thread (8 MiB of JSON held the loop
    0.3 s here, and its slots as long again), a small one on the loop, where a thread would cost more than it."""
    import json

    from gpuwarden.engine.slots import SlotsProgress, SlotsScraper

    threads, real = [], SlotsProgress.sample
    monkeypatch.setattr(SlotsProgress, "sample", lambda self, slots: threads.append(
        threading.current_thread() is threading.main_thread()) or real(self, slots))
    small = json.dumps([{"id": 0, "id_task": 1, "n_past": 7}]).encode()
    large = json.dumps([{"id": i, "id_task": 1, "n_past": 7} for i in range(12_000)]).encode()
    assert len(small) <= scraper.OFF_LOOP_BYTES < len(large)
    server = raw(lambda n: ok(small if n == 1 else large))

    async def run():
        slots = SlotsScraper(server.url.removesuffix("/metrics"), 10.0)
        try:
            return [(await slots.scrape()).progress for _ in range(2)]
        finally:
            await slots.close()
    assert asyncio.run(run()) == [7.0, 12_000 * 7.0]
    assert threads == [True, False]
