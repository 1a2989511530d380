"""Scrape an engine's /metrics over HTTP: bounded in time and size, one client per engine. An http:// endpoint is
read by Plain (asyncio's streams, one kept-alive connection); https:// by httpx, whose clients share one pool of
kept-alive connections and one TLS context.

`timeout` bounds the whole scrape (connect, every byte of the body, the parse), not each read: a server that
sends one byte a second fails at the deadline. A large body is parsed off the loop, and only the lines of the
profile's metrics are parsed, at most MAX_SERIES of them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import ssl
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote, urlsplit

from gpuwarden.engine.metrics import EngineSample, UnparsableMetrics, chosen, parse
from gpuwarden.runtime.offloop import Busy, OffLoop

OFF_LOOP_BYTES = 256 << 10  # a body above this is parsed in a thread (a 7.7 MB body takes seconds)
MAX_SERIES = 10_000  # lines of the profile's metrics; an engine reports a few hundred
if TYPE_CHECKING:
    import httpx

    from gpuwarden.enginekinds.base import EngineKind

REDETECT = 12  # bodies an auto scraper reads as the kind it detected before detecting again (a minute at 5 s)
PARSES = OffLoop("metrics parse", limit=32)  # one parse in flight per endpoint (/metrics, /slots)


class ScrapeError(Exception):
    """Why a scrape failed: `reason` is one of timeout, refused, http, too_large, unparsable."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class HttpScraper:
    """An endpoint read over HTTP (/metrics, /slots): the whole answer and its parse (`_sample`, the endpoint's
    own) within `timeout`, a large body parsed off the loop; a reconnect only where the owner check allows it.
    `what` names the endpoint in its errors."""

    what = ""

    def __init__(self, url: str, timeout: float, max_bytes: int) -> None:
        self.url, self.timeout, self.max_bytes = url, timeout, max_bytes
        self._client = client_for(url, timeout)

    async def scrape(self) -> EngineSample:
        try:
            async with asyncio.timeout(self.timeout):
                body = await fetch(self._client, self.url, self.max_bytes, self.what)
                if len(body) <= OFF_LOOP_BYTES:
                    return self._sample(body)
                return await PARSES.run(self.url, self.timeout, self._sample, body)
        except TimeoutError:
            raise ScrapeError("timeout", f"{self.what}no whole answer within {self.timeout:g} s") from None
        except Busy as exc:
            raise ScrapeError("timeout", f"{self.what}{exc}") from None

    def _sample(self, body: bytes) -> EngineSample:
        raise NotImplementedError

    def reconnect_only_if(self, check: Callable[[], bool]) -> None:
        """See Plain.may_reconnect (https:// is verified by its certificate instead)."""
        if isinstance(self._client, Plain):
            self._client.may_reconnect = check

    async def close(self) -> None:
        await self._client.aclose()


class Scraper(HttpScraper):
    """An engine's /metrics, read as its kind's (`profile`, or detected)."""

    def __init__(self, url: str, profile: str = "auto", timeout: float = 5.0, max_bytes: int = 8 << 20) -> None:
        super().__init__(url, timeout, max_bytes)
        self.profile = profile
        self._detected: str | None = None  # the kind the last body was (auto)
        self._read_as = 0  # bodies read as it since it was detected

    async def scrape(self) -> EngineSample:
        try:
            return await super().scrape()
        except ScrapeError:
            self._detected = None  # what answers next (another engine, where this one was) is detected afresh
            raise

    def _sample(self, body: bytes) -> EngineSample:
        """With `auto`, the body is read as the kind the last one was (detecting counts every kind's lines in the
        whole body: more than half of a parse) while it holds that kind's metrics, for REDETECT bodies at most (a
        body may hold two kinds' lines, and another engine may have taken the port with no scrape failing); it is
        detected again after a failed scrape."""
        if self.profile != "auto":
            return _parse(body, self.profile)
        if self._detected is not None and self._read_as < REDETECT:
            try:
                sample = _parse(body, self._detected)
                self._read_as += 1
                return sample
            except ScrapeError as exc:
                if exc.reason != "unparsable":
                    raise
        sample = _parse(body, "auto")
        self._detected, self._read_as = sample.profile, 1
        return sample


def client_for(url: str, timeout: float) -> Plain | httpx.AsyncClient:
    """An endpoint's client: Plain for http:// (no httpx, no TLS context), httpx for https://."""
    return Plain(url, timeout) if urlsplit(url).scheme == "http" else client(timeout)


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


async def fetch(http: Plain | httpx.AsyncClient, url: str, max_bytes: int, what: str = "") -> bytearray:
    """The body of a GET, at most `max_bytes`; every failure is a ScrapeError whose reason says which.
    `what` names the endpoint in the message. A Plain client asks its own URL."""
    if isinstance(http, Plain):
        return await http.get(max_bytes, what)
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


HEAD_BYTES = 16 << 10  # the status line and headers of an answer, as h11 (httpx) bounds them; also trailers
CONNECT_S = 2.0  # at most, for the connection (as httpx's connect timeout was)
_HEX = b"0123456789abcdefABCDEF"
_LENGTH = re.compile(r"[0-9]{1,19}")
_STATUS = re.compile(r"[0-9]{3}")
MAX_CHUNKS = 4096  # chunks of one body: a server sends a few large ones; a million of a byte each is CPU for nothing
_PCHARS = "%:@!$&'()*+,;=-._~"  # kept as they are in a path or query (RFC 3986); other bytes %-encoded, as by httpx


class Plain:
    """GET of one http:// URL over HTTP/1.1 with asyncio's streams, keeping the connection where the server allows.
    httpx was 70-80 % of a scrape's time on the loop (its pool, anyio, h11, an SSL context built for http:// too).

    Its bounds, each a ScrapeError whose reason says which:
    - the whole exchange within `timeout` (a server dripping its head or body fails at the deadline, not per read),
      the connection within CONNECT_S;
    - the status line and headers at most HEAD_BYTES (too_large), the body at most max_bytes (too_large), whether
      framed by its Content-Length, by chunks, or by the connection's close;
    - a body shorter than its Content-Length, a bad chunk, a server that closes before answering: errors (http),
      never a short body taken;
    - any status but 200 is an error (http), a redirect too: not followed, as httpx (follow_redirects off) did not.
    A kept connection the server closed while idle (its keep-alive timeout) is replaced once by a new one, if
    `may_reconnect` allows: the caller proved the address the engine's before the get, not before a connection
    made within it (the engine killed while a scrape waited on it, a squatter on its port by the reconnect).
    Whatever the answer's bytes, a failure is a ScrapeError: no other exception reaches the caller.
    """

    def __init__(self, url: str, timeout: float) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.timeout = parts.hostname or "", parts.port or 80, timeout
        host = f"[{self.host}]" if ":" in self.host else self.host
        target = quote(parts.path or "/", safe=_PCHARS + "/") + (f"?{quote(parts.query, safe=_PCHARS + '/?[]')}"
                                                                   if parts.query else "")
        lines = [f"GET {target} HTTP/1.1",
                 f"Host: {host}{f':{parts.port}' if parts.port else ''}", "Accept: */*",
                 "Accept-Encoding: identity", "User-Agent: gpuwarden"]
        if parts.username is not None:  # the URL's user and password, as httpx sent them
            secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            lines.append(f"Authorization: Basic {base64.b64encode(secret).decode()}")
        self._request = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8")
        self._kept: tuple[asyncio.AbstractEventLoop, asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.may_reconnect: Callable[[], bool] = lambda: True

    async def get(self, max_bytes: int, what: str = "") -> bytearray:
        try:
            async with asyncio.timeout(self.timeout):
                reader, writer, head = await self._answer(what)
                try:
                    body, keep = await _body(reader, head, max_bytes, what)
                except BaseException:
                    writer.transport.abort()
                    raise
        except TimeoutError:
            raise ScrapeError("timeout", f"{what}no whole answer within {self.timeout:g} s") from None
        except (ValueError, asyncio.LimitOverrunError, OSError) as exc:  # what a hostile answer could still raise
            raise ScrapeError("http", f"{what}{type(exc).__name__}: {str(exc)[:200]}") from None
        if keep:  # one kept connection (two gets at once each took their own: the other one is closed)
            kept, self._kept = self._kept, (asyncio.get_running_loop(), reader, writer)
            writer = kept[2] if kept else None
        if writer is not None:
            writer.transport.abort()
        return body

    async def status(self) -> int:
        """The answer's status alone (its body unread), the whole within the timeout; the connection not kept."""
        async with asyncio.timeout(self.timeout):
            _, writer, head = await self._answer("")
        writer.transport.abort()
        return int(head[":status"])

    async def _answer(self, what: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, dict[str, str]]:
        kept, self._kept = self._kept, None
        if kept and kept[0] is asyncio.get_running_loop() and not kept[1].at_eof():
            try:
                return kept[1], kept[2], await self._ask(kept[1], kept[2], what)
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                kept[2].transport.abort()
                if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                    raise _closed(what, exc) from None
                # closed while idle, before a byte of the answer: a new connection below, if still the engine's
                if not self.may_reconnect():
                    raise ScrapeError("refused", f"{what}the kept connection closed, and the address is no longer "
                                                 "proven the engine's: not connected again") from None
            except BaseException:
                kept[2].transport.abort()
                raise
        elif kept:
            with contextlib.suppress(RuntimeError):  # a connection of a loop closed since
                kept[2].transport.abort()
        try:
            async with asyncio.timeout(min(self.timeout, CONNECT_S)):
                reader, writer = await asyncio.open_connection(self.host, self.port, limit=HEAD_BYTES)
        except TimeoutError:
            raise ScrapeError("timeout", f"{what}no connection within {min(self.timeout, CONNECT_S):g} s") from None
        except OSError as exc:
            raise ScrapeError("refused", str(exc) or "connection refused") from None
        try:
            return reader, writer, await self._ask(reader, writer, what)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            writer.transport.abort()
            raise _closed(what, exc) from None
        except BaseException:
            writer.transport.abort()
            raise

    async def _ask(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, what: str) -> dict[str, str]:
        """Sends the request; the answer's head: its headers, lower-cased, and ":status"."""
        writer.write(self._request)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise ScrapeError("too_large", f"{what}status line and headers larger than {HEAD_BYTES} bytes") from None
        status, *lines = head[:-4].decode("latin-1").split("\r\n")
        version, _, rest = status.partition(" ")
        if not version.startswith("HTTP/1.") or _STATUS.fullmatch(rest[:3]) is None:
            raise ScrapeError("http", f"{what}not an HTTP/1 answer: {status[:80]!r}")
        headers = {":status": rest[:3], ":version": version}
        for line in lines:
            name, colon, value = line.partition(":")
            if not colon:
                raise ScrapeError("http", f"{what}a malformed header line: {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        return headers

    async def aclose(self) -> None:
        kept, self._kept = self._kept, None
        if kept:
            with contextlib.suppress(RuntimeError):
                kept[2].transport.abort()


async def _body(reader: asyncio.StreamReader, head: dict[str, str], max_bytes: int,
                what: str) -> tuple[bytearray, bool]:
    """The answer's body and whether its connection can serve the next request."""
    if head[":status"] != "200":
        raise ScrapeError("http", f"{what}HTTP {head[':status']}")
    if head.get("content-encoding", "identity").lower() != "identity":
        raise ScrapeError("http", f"{what}a body in {head['content-encoding']!r} encoding, which was not asked for")
    keep = head[":version"] == "HTTP/1.1" and "close" not in head.get("connection", "").lower()
    try:
        if "chunked" in head.get("transfer-encoding", "").lower():
            return await _chunks(reader, max_bytes, what), keep
        if (length := head.get("content-length")) is not None:
            if _LENGTH.fullmatch(length) is None:  # ASCII digits only: '²' is a digit to isdigit(), not to int()
                raise ScrapeError("http", f"{what}a Content-Length of {length[:40]!r}")
            if int(length) > max_bytes:
                raise ScrapeError("too_large", f"{what}body larger than {max_bytes} bytes")
            return bytearray(await reader.readexactly(int(length))), keep
        body = bytearray()  # no framing: the body ends with the connection
        while chunk := await reader.read(1 << 16):
            body += chunk
            if len(body) > max_bytes:
                raise ScrapeError("too_large", f"{what}body larger than {max_bytes} bytes")
        return body, False
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        raise _closed(what, exc, head.get("content-length")) from None


async def _chunks(reader: asyncio.StreamReader, max_bytes: int, what: str) -> bytearray:
    body = bytearray()
    for _ in range(MAX_CHUNKS + 1):
        try:
            line = await reader.readuntil(b"\r\n")
        except asyncio.LimitOverrunError:
            raise ScrapeError("http", f"{what}a chunk's size line longer than {HEAD_BYTES} bytes") from None
        size = line.split(b";", 1)[0].strip()
        if not size or size.strip(_HEX):
            raise ScrapeError("http", f"{what}a chunk size of {size[:40]!r}")
        if (n := int(size, 16)) == 0:
            break
        if len(body) + n > max_bytes:
            raise ScrapeError("too_large", f"{what}body larger than {max_bytes} bytes")
        body += await reader.readexactly(n)
        if await reader.readexactly(2) != b"\r\n":
            raise ScrapeError("http", f"{what}a chunk longer than its size")
    else:
        raise ScrapeError("too_large", f"{what}a body in more than {MAX_CHUNKS} chunks")
    trailers = 0
    try:
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            if (trailers := trailers + len(line)) > HEAD_BYTES:
                raise ScrapeError("too_large", f"{what}trailers larger than {HEAD_BYTES} bytes")
    except asyncio.LimitOverrunError:
        raise ScrapeError("too_large", f"{what}trailers larger than {HEAD_BYTES} bytes") from None
    return body


def _closed(what: str, exc: Exception, length: str | None = None) -> ScrapeError:
    """A connection the server closed or reset before the whole answer."""
    if not isinstance(exc, asyncio.IncompleteReadError):
        return ScrapeError("http", f"{what}the server dropped the connection ({type(exc).__name__})")
    if length is not None:
        return ScrapeError("http", f"{what}the server closed the connection after {len(exc.partial)} of the "
                                   f"body's {length} bytes")
    return ScrapeError("http", f"{what}the server closed the connection before the whole answer")


_LINES: dict[str, re.Pattern[str]] = {}


def _lines_of(kind: EngineKind) -> re.Pattern[str]:
    """The lines of the kind's metrics, found in one C pass: the names' common prefix after a newline is a literal
    the regex engine searches for (a split into lines and a startswith of each took 3x as long: 107 µs of a
    300-line vLLM body)."""
    if (lines := _LINES.get(kind.name)) is None:
        names = sorted(kind.metrics.names())
        common = os.path.commonprefix(names)  # noqa: RUF071 (character by character: meant)
        rest = "|".join(re.escape(name[len(common):]) for name in names)
        lines = _LINES[kind.name] = re.compile(f"\\n({re.escape(common)}(?:{rest})[^\\r\\n]*)")
    return lines


def _parse(body: bytes, profile: str) -> EngineSample:
    """Only the profile's lines reach the parser, and at most MAX_SERIES of them."""
    text = body.decode("utf-8", "replace")
    try:
        kind = chosen(text, profile)
    except UnparsableMetrics as exc:
        raise ScrapeError("unparsable", str(exc)) from None
    lines = _lines_of(kind).findall("\n" + text)
    if len(lines) > MAX_SERIES:
        raise ScrapeError("too_large", f"{len(lines)} series of {kind.name}'s metrics (at most {MAX_SERIES})")
    try:
        return parse("\n".join(lines) + "\n", kind.name)
    except UnparsableMetrics as exc:
        raise ScrapeError("unparsable", str(exc)) from None
