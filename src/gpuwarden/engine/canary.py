"""The canary: one real one-token completion with a deadline, through the API the engine speaks. /health or
/v1/models answering proves nothing; a token coming back does. What to send is the engine kind's (its
`CanaryApi`, gpuwarden/enginekinds); here is only the sending: one deadline for the whole exchange, bounded
answers.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from gpuwarden.plain import plain

if TYPE_CHECKING:
    import httpx

from gpuwarden import enginekinds
from gpuwarden.enginekinds.base import Answer, CanaryApi
from gpuwarden.enginekinds.openai import OPENAI

# A one-token completion, a model list or /api/ps is a few KB: a longer answer is not a canary's, and is not read
# on (the engine's user must not make root's daemon hold what it sends, as a scrape's body is capped too).
MAX_ANSWER = 1 << 20


class TooLarge(ValueError):
    pass


@plain
class CanaryResult:
    """How one canary completion went."""

    outcome: str  # ok | timeout | error | skipped
    seconds: float
    detail: str = ""


def api_for(api: str, profile: str) -> CanaryApi:
    """The API named by `canary`, or (auto) the one the engine's kind speaks; OpenAI's for an engine of no
    known kind yet."""
    if api != "auto":
        return enginekinds.canary_apis()[api]
    kind = enginekinds.named(profile)
    return kind.canary if kind else OPENAI


async def canary(base_url: str, api: CanaryApi, timeout: float) -> CanaryResult:
    """One completion of one token; the whole exchange (model look-up included) within `timeout`. A refused or
    dropped connection is tried again until then: an engine whose HTTP workers are all held by stuck requests
    drops new connections, and that too is a completion that does not return."""
    import httpx  # on first use: 90 ms of import that a start without engines never needs

    started, last = time.monotonic(), ""
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), trust_env=False) as client:
        try:
            async with asyncio.timeout(timeout):
                while True:
                    try:
                        response = await api.complete(_sender(client, base_url.rstrip("/")))
                        break
                    except (httpx.NetworkError, httpx.ProtocolError) as exc:
                        last = f"; last try: {type(exc).__name__}"
                        await asyncio.sleep(0.5)
        except (TimeoutError, httpx.TimeoutException):
            return CanaryResult("timeout", time.monotonic() - started,
                                f"a real completion did not return in {timeout:.0f} s{last}")
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            return CanaryResult("error", time.monotonic() - started, f"{type(exc).__name__}: {exc}")
    seconds = time.monotonic() - started
    if response is None:
        return CanaryResult("skipped", seconds, "no model is loaded")
    if late := api.late(response.status_code, seconds):
        return CanaryResult("timeout", seconds, late)
    if response.status_code != 200:
        return CanaryResult("error", seconds, f"HTTP {response.status_code}: {response.text[:200]}")
    return CanaryResult("ok", seconds, f"one token in {seconds:.2f} s")


def _sender(client: httpx.AsyncClient, base: str):
    async def send(method: str, path: str, **kw) -> Answer:
        return await _send(client, method, f"{base}{path}", **kw)
    return send


async def _send(client: httpx.AsyncClient, method: str, url: str, **kw) -> Answer:
    """The status and body, at most MAX_ANSWER bytes of it (TooLarge past that)."""
    async with client.stream(method, url, **kw) as response:
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_ANSWER:
                raise TooLarge(f"{url.rsplit('/', 1)[-1]} answered more than {MAX_ANSWER} bytes")
        return Answer(response.status_code, bytes(body))
