"""The canary: one real one-token completion with a deadline, through the API the engine speaks. /health or
/v1/models answering proves nothing; a token coming back does. What to send is the engine kind's (its
`CanaryApi`, gpuwarden/enginekinds); here is only the sending: one deadline for the whole exchange, bounded
answers, and what a client of that engine sends besides (`Client`: its API key, extra headers, the model name,
the route).

An answer 401 or 403 (the engine wants a key the canary lacks, or refuses the one it sent) or 404 (no such
route or model) at any step is `misconfigured`: the canary could not ask, which says nothing of the engine's
health, and names what to set.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from gpuwarden.core.plain import plain

if TYPE_CHECKING:
    import httpx

    from gpuwarden.config.schema import Secret

from gpuwarden import enginekinds
from gpuwarden.enginekinds.base import Answer, CanaryApi
from gpuwarden.enginekinds.openai import OPENAI

# A one-token completion, a model list or /api/ps is a few KB: a longer answer is not a canary's, and is not read
# on (the engine's user must not make root's daemon hold what it sends, as a scrape's body is capped too).
MAX_ANSWER = 1 << 20


class TooLarge(ValueError):
    pass


class Refused(Exception):
    """An answer that says the canary could not ask: 401, 403 or 404."""

    def __init__(self, status: int, path: str) -> None:
        super().__init__(f"HTTP {status} at {path}")
        self.status, self.path = status, path


REFUSALS = frozenset({401, 403, 404})


@plain
class Client:
    """What a client of the engine sends besides the request: `key` (Authorization: Bearer; from a root-only
    file or the engine's own command line, never printed), extra headers, and, to ask through an
    OpenAI-compatible route with a model it names, `model` and `route`. `key_from` says for people where the
    key came from (never the key)."""

    key: Secret | None = None
    headers: tuple[tuple[str, str], ...] = ()
    model: str | None = None
    route: str | None = None
    key_from: str = ""

    def api(self, api: CanaryApi) -> CanaryApi:
        """`api`, or the OpenAI completion at `route` with `model` where either is set."""
        return openai_at(self.route or "/v1/completions", self.model) if self.route or self.model else api

    def sent(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.key is not None:
            headers["Authorization"] = f"Bearer {self.key.get_secret_value()}"
        return headers


def openai_at(route: str, model: str | None) -> CanaryApi:
    """The OpenAI completion at `route` (a chat route, `.../chat/completions`, is sent one message), with
    `model`, else the first its model list (beside the route: `.../v1/models`) names."""
    chat = route.rstrip("/").endswith("chat/completions")
    models = route.rstrip("/").removesuffix("completions").removesuffix("chat/") + "models"

    async def complete(send) -> Answer:
        name = model or (await send("GET", models)).json()["data"][0]["id"]
        prompt = {"messages": [{"role": "user", "content": "1"}]} if chat else {"prompt": [1]}
        return await send("POST", route, json={"model": name, **prompt, "max_tokens": 1})
    return CanaryApi("openai", complete)


def key_in(argv: list[str]) -> str | None:
    """The value of `--api-key` on an engine's command line (vLLM, SGLang and llama-server take it so), else
    None. The caller never prints it."""
    for i, word in enumerate(argv):
        if word == "--api-key" and i + 1 < len(argv):
            return argv[i + 1] or None
        if word.startswith("--api-key="):
            return word.split("=", 1)[1] or None
    return None


def what_to_set(status: int, path: str, client: Client) -> str:
    """For people: why the canary could not ask, and which setting fixes it."""
    if status == 404:
        return (f"HTTP 404 at {path}: the engine has no such route or model; set canary_model (the model it "
                "serves) or canary_route (its completion route)")
    if client.key is not None:
        return (f"HTTP {status} at {path}: the engine refused the API key {client.key_from}; check it (or set "
                "canary_api_key_file to the right one)")
    return (f"HTTP {status} at {path}: the engine wants an API key; set canary_api_key_file to a file readable "
            "only by root that holds it (or canary_headers for what else it needs)")


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


async def canary(base_url: str, api: CanaryApi, timeout: float, client: Client | None = None) -> CanaryResult:
    """One completion of one token; the whole exchange (model look-up included) within `timeout`. A refused or
    dropped connection is tried again until then: an engine whose HTTP workers are all held by stuck requests
    drops new connections, and that too is a completion that does not return."""
    import httpx  # on first use: 90 ms of import that a start without engines never needs

    from gpuwarden.engine.scraper import shared_transport

    client = client or Client()
    api, started, last = client.api(api), time.monotonic(), ""
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), trust_env=False, headers=client.sent(),
                                 transport=shared_transport()) as http:  # the engine clients' pool, not one per canary
        try:
            async with asyncio.timeout(timeout):
                while True:
                    try:
                        response = await api.complete(_sender(http, base_url.rstrip("/")))
                        break
                    except (httpx.NetworkError, httpx.ProtocolError) as exc:
                        last = f"; last try: {type(exc).__name__}"
                        await asyncio.sleep(0.5)
        except (TimeoutError, httpx.TimeoutException):
            return CanaryResult("timeout", time.monotonic() - started,
                                f"a real completion did not return in {timeout:.0f} s{last}")
        except Refused as exc:
            return CanaryResult("misconfigured", time.monotonic() - started,
                                what_to_set(exc.status, exc.path, client))
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
        answer = await _send(client, method, f"{base}{path}", **kw)
        if answer.status_code in REFUSALS:  # before any step reads the body: a refusal is no model list
            raise Refused(answer.status_code, path)
        return answer
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
