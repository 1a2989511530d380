"""Each engine's client and each canary used to build its own TLS context (the system's certificates loaded each
time, 0.7 MB and milliseconds per engine, for http:// too); they share the process's one."""

import asyncio
import json
import ssl
from http.server import BaseHTTPRequestHandler

from test_canary import Loopback

from gpuwarden.engine import scraper


def test_engine_clients_share_one_tls_context(monkeypatch):
    made = []
    real = ssl.create_default_context

    def counted(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counted)
    monkeypatch.setattr(scraper, "_TLS", [], raising=False)
    clients = [scraper.client(2.0) for _ in range(5)]
    assert len(made) == 1

    async def close():
        for c in clients:
            await c.aclose()

    asyncio.run(close())


class KeepAlive(Loopback):
    """A loopback HTTP/1.1 server that keeps connections open and counts those it accepted: /metrics, and
    Ollama's /api/ps and /api/generate for a canary."""

    def __init__(self):
        fake = self
        self.connections = 0

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                fake.connections += 1
                super().setup()

            def do_GET(self):
                self._send({"models": [{"name": "tiny:latest"}]} if self.path == "/api/ps" else "up 1\n")

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                self._send({"model": "tiny:latest", "response": "x", "done": True})

            def _send(self, answer):
                data = (answer if isinstance(answer, str) else json.dumps(answer)).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.serve(Handler)


def test_engine_clients_and_canaries_share_one_pool_of_connections():
    """Each client had its own pool (0.7 MB with its TLS context): an engine's scrape, its /slots and each canary
    opened a connection of their own. Now one connection serves them in turn, and a client's close (an engine
    gone) leaves the pool to the others."""
    from gpuwarden.engine.canary import api_for, canary

    server = KeepAlive()

    async def look() -> str:
        metrics, slots = scraper.client(2.0), scraper.client(2.0)
        await scraper.fetch(metrics, f"{server.url}/metrics", 1 << 20)
        await metrics.aclose()
        await scraper.fetch(slots, f"{server.url}/metrics", 1 << 20)
        outcome = (await canary(server.url, api_for("ollama", "auto"), 5)).outcome
        await scraper.fetch(slots, f"{server.url}/metrics", 1 << 20)
        await slots.aclose()
        return outcome

    try:
        assert asyncio.run(look()) == "ok"
        assert server.connections == 1
    finally:
        server.close()


def test_a_request_does_not_search_for_a_library_that_is_not_installed():
    """httpcore tries `import sniffio` on every request; where it is not installed (anyio no longer needs it)
    each try searched sys.path again: 60 µs of every scrape. (Where it is installed, its first import is the one
    search.)"""
    import sys

    searched = []

    class Counting:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name == "sniffio":
                searched.append(name)
            return None

    server = KeepAlive()
    sys.meta_path.insert(0, Counting)

    async def scrapes():
        http = scraper.client(2.0)
        for _ in range(3):
            await scraper.fetch(http, f"{server.url}/metrics", 1 << 20)
        await http.aclose()
    try:
        asyncio.run(scrapes())
    finally:
        sys.meta_path.remove(Counting)
        server.close()
    assert len(searched) <= 1
