"""Scrape an engine's /metrics over HTTP: bounded in time and size, one client per engine, one pool of kept-alive
connections for all of them.

`timeout` bounds the whole scrape (connect, every byte of the body, the parse), not each read: a server that
sends one byte a second fails at the deadline. A large body is parsed off the loop, and only the lines of the
profile's metrics are parsed, at most MAX_SERIES of them.
"""

from __future__ import annotations

import asyncio
import ssl
import sys
from typing import TYPE_CHECKING

from gpuwarden.engine.metrics import EngineSample, UnparsableMetrics, chosen, parse
from gpuwarden.runtime.offloop import Busy, OffLoop

OFF_LOOP_BYTES = 256 << 10  # a body above this is parsed in a thread (a 7.7 MB body takes seconds)
MAX_SERIES = 10_000  # lines of the profile's metrics; an engine reports a few hundred
if TYPE_CHECKING:
    import httpx

_PARSES = OffLoop("metrics parse", limit=32)  # one parse in flight per engine


class ScrapeError(Exception):
    """Why a scrape failed: `reason` is one of timeout, refused, http, too_large, unparsable."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class Scraper:
    def __init__(self, url: str, profile: str = "auto", timeout: float = 5.0, max_bytes: int = 8 << 20) -> None:
        self.url, self.profile, self.timeout, self.max_bytes = url, profile, timeout, max_bytes
        self._client = client(timeout)

    async def scrape(self) -> EngineSample:
        try:
            async with asyncio.timeout(self.timeout):
                body = await fetch(self._client, self.url, self.max_bytes)
                if len(body) <= OFF_LOOP_BYTES:
                    return _parse(body, self.profile)
                return await _PARSES.run(self.url, self.timeout, _parse, body, self.profile)
        except TimeoutError:
            raise ScrapeError("timeout", f"no whole answer within {self.timeout:g} s") from None
        except Busy as exc:
            raise ScrapeError("timeout", str(exc)) from None

    async def close(self) -> None:
        await self._client.aclose()


def client(timeout: float, *, shared: bool = True) -> httpx.AsyncClient:
    """An engine's client: no proxy from the environment, the process's one TLS context, and the connections of
    the loop's one pool (shared_transport), where each engine keeps its kept-alive connection. `shared=False`
    for a client of a throwaway loop (discovery's probe runs one per asyncio.run): a pool of its own, closed
    with it."""
    import httpx  # on first use: 90 ms of import that a start without engines never needs

    return httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=min(timeout, 2.0)), verify=tls(),
                             transport=shared_transport() if shared else None,
                             limits=httpx.Limits(max_keepalive_connections=1), trust_env=False)


# the running loop's pool of connections to the engines (a connection belongs to the loop that opened it); not
# weak: a pool's connections hold their loop
_POOLS: dict[asyncio.AbstractEventLoop, httpx.AsyncHTTPTransport] = {}
_SHARED: list[httpx.AsyncBaseTransport] = []
KEPT_ALIVE = 128  # idle connections the pool keeps (5 s each): 32 engines' scrapes, /slots and canaries


def shared_transport() -> httpx.AsyncBaseTransport:
    """The one transport of every engine client and canary. httpx gives each client its own pool (0.7 MB with
    its TLS context, per engine); this one hands each request to the running loop's pool, and a client's close
    leaves the pool to the others. No limit on connections: a stuck engine holding its requests must not make
    another engine's scrape wait for a free one (each request is bounded by its own timeout)."""
    if not _SHARED:
        import importlib.util

        import httpx

        if importlib.util.find_spec("sniffio") is None:
            # httpcore imports sniffio on each request, where it may be: absent (anyio no longer needs it), each
            # try searched sys.path again, 60 µs; marked absent, the import fails at once
            sys.modules["sniffio"] = None

        class Shared(httpx.AsyncBaseTransport):
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                loop = asyncio.get_running_loop()
                pool = _POOLS.get(loop)
                if pool is None:
                    for closed in [other for other in _POOLS if other.is_closed()]:  # a CLI's or a test's run
                        del _POOLS[closed]
                    pool = _POOLS[loop] = httpx.AsyncHTTPTransport(
                        verify=tls(), trust_env=False,
                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=KEPT_ALIVE))
                return await pool.handle_async_request(request)

            async def aclose(self) -> None:
                """A client closing: the pool stays, for the other engines' clients."""

        _SHARED.append(Shared())
    return _SHARED[0]


_TLS: list[ssl.SSLContext] = []


def tls() -> ssl.SSLContext:
    """The verifying TLS context every engine client shares. httpx builds one per client by default, loading the
    system's certificates each time: 0.7 MB and milliseconds per engine client and per canary, even for http://."""
    if not _TLS:
        import certifi  # the certificates httpx itself verifies against (one of its dependencies)

        _TLS.append(ssl.create_default_context(cafile=certifi.where()))
    return _TLS[0]


async def fetch(http: httpx.AsyncClient, url: str, max_bytes: int, what: str = "") -> bytearray:
    """The body of a GET, at most `max_bytes`; every failure is a ScrapeError whose reason says which.
    `what` names the endpoint in the message."""
    import httpx

    try:
        async with http.stream("GET", url) as response:
            if response.status_code != 200:
                raise ScrapeError("http", f"{what}HTTP {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > max_bytes:
                    raise ScrapeError("too_large", f"{what}body larger than {max_bytes} bytes")
            return body
    except httpx.TimeoutException as exc:
        raise ScrapeError("timeout", f"{what}{type(exc).__name__}") from None
    except httpx.ConnectError as exc:
        raise ScrapeError("refused", str(exc) or "connection refused") from None
    except httpx.HTTPError as exc:
        raise ScrapeError("http", f"{what}{type(exc).__name__}: {exc}") from None


def _parse(body: bytes, profile: str) -> EngineSample:
    """Only the profile's lines reach the parser, and at most MAX_SERIES of them."""
    text = body.decode("utf-8", "replace")
    try:
        kind = chosen(text, profile)
    except UnparsableMetrics as exc:
        raise ScrapeError("unparsable", str(exc)) from None
    starts = tuple(kind.metrics.names())
    lines = [line for line in text.splitlines() if line.startswith(starts)]
    if len(lines) > MAX_SERIES:
        raise ScrapeError("too_large", f"{len(lines)} series of {kind.name}'s metrics (at most {MAX_SERIES})")
    try:
        return parse("\n".join(lines) + "\n", kind.name)
    except UnparsableMetrics as exc:
        raise ScrapeError("unparsable", str(exc)) from None
