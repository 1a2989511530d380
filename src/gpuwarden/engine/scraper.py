"""Scrape an engine's /metrics over HTTP: bounded in time and size, one kept-alive client per engine."""

from __future__ import annotations

import httpx

from gpuwarden.engine.metrics import EngineSample, UnparsableMetrics, parse


class ScrapeError(Exception):
    """Why a scrape failed: `reason` is one of timeout, refused, http, too_large, unparsable."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class Scraper:
    def __init__(self, url: str, profile: str = "auto", timeout: float = 5.0, max_bytes: int = 8 << 20) -> None:
        self.url, self.profile, self.max_bytes = url, profile, max_bytes
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=min(timeout, 2.0)),
                                         limits=httpx.Limits(max_keepalive_connections=1), trust_env=False)

    async def scrape(self) -> EngineSample:
        try:
            async with self._client.stream("GET", self.url) as response:
                if response.status_code != 200:
                    raise ScrapeError("http", f"HTTP {response.status_code}")
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > self.max_bytes:
                        raise ScrapeError("too_large", f"body larger than {self.max_bytes} bytes")
        except httpx.TimeoutException as exc:
            raise ScrapeError("timeout", type(exc).__name__) from None
        except httpx.ConnectError as exc:
            raise ScrapeError("refused", str(exc) or "connection refused") from None
        except httpx.HTTPError as exc:
            raise ScrapeError("http", f"{type(exc).__name__}: {exc}") from None
        try:
            return parse(body.decode("utf-8", "replace"), self.profile)
        except UnparsableMetrics as exc:
            raise ScrapeError("unparsable", str(exc)) from None

    async def close(self) -> None:
        await self._client.aclose()
