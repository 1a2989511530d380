"""The canary: one real one-token completion with a deadline, through the API the engine speaks. /health or
/v1/models answering proves nothing; a token coming back does.

- openai (vLLM, SGLang, TGI): the model from /v1/models, then /v1/completions with `max_tokens` 1. The prompt
  is one token id (token-id prompts are part of the OpenAI completions API), so no tokenizer or chat template
  is needed.
- llamacpp: /completion with `n_predict` 1.
- ollama: /api/generate with `num_predict` 1, for a model already loaded (/api/ps): a canary must never make
  Ollama load a model, which can take minutes.
- sglang: GET /health_generate, SGLang's own one-token generation (sglang/srt/entrypoints/http_server.py,
  checked at sgl-project/sglang@0025436e). It answers 200 as soon as the scheduler sends anything back (a busy
  engine's running batch counts, so it adds no load), and 503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) without
  a response; it also answers 503 at once while the server starts or shuts down. Older releases run the same
  generation with no deadline of their own, which our deadline bounds. `/health` is not used: newer releases
  let SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false turn it into a plain liveness check, older ones always were.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

API_OF_PROFILE = {"llamacpp": "llamacpp", "ollama": "ollama", "sglang": "sglang"}  # others speak OpenAI
# A 503 from /health_generate that came this late is its own deadline passing (SGLANG_HEALTH_CHECK_TIMEOUT, 20 s
# unless set), not a server starting or stopping: those answer at once, and even a machine too busy to answer a
# 503 in well under 5 s must not pass a starting engine for a stuck one.
SGLANG_WAITED = 5.0
# A one-token completion, a model list or /api/ps is a few KB: a longer answer is not a canary's, and is not read
# on (the engine's user must not make root's daemon hold what it sends, as a scrape's body is capped too).
MAX_ANSWER = 1 << 20


class TooLarge(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Answer:
    status_code: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.body)


@dataclass(frozen=True, slots=True)
class CanaryResult:
    outcome: str  # ok | timeout | error | skipped
    seconds: float
    detail: str = ""


def api_for(api: str, profile: str) -> str:
    return API_OF_PROFILE.get(profile, "openai") if api == "auto" else api


async def canary(base_url: str, api: str, timeout: float) -> CanaryResult:
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
                        response = await _complete(client, base_url.rstrip("/"), api)
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
    if api == "sglang" and response.status_code == 503 and seconds >= SGLANG_WAITED:
        return CanaryResult("timeout", seconds, f"SGLang's own one-token generation (/health_generate) got no "
                            f"token back: HTTP 503 after {seconds:.0f} s")
    if response.status_code != 200:
        return CanaryResult("error", seconds, f"HTTP {response.status_code}: {response.text[:200]}")
    return CanaryResult("ok", seconds, f"one token in {seconds:.2f} s")


async def _complete(client: httpx.AsyncClient, base: str, api: str) -> Answer | None:
    if api == "sglang":
        return await _send(client, "GET", f"{base}/health_generate")
    if api == "llamacpp":
        return await _send(client, "POST", f"{base}/completion",
                           json={"prompt": [1], "n_predict": 1, "cache_prompt": False})
    if api == "ollama":
        models = (await _send(client, "GET", f"{base}/api/ps")).json().get("models") or []
        if not models:
            return None
        return await _send(client, "POST", f"{base}/api/generate", json={
            "model": models[0]["name"], "prompt": "1", "stream": False, "options": {"num_predict": 1}})
    model = (await _send(client, "GET", f"{base}/v1/models")).json()["data"][0]["id"]
    return await _send(client, "POST", f"{base}/v1/completions", json={"model": model, "prompt": [1], "max_tokens": 1})


async def _send(client: httpx.AsyncClient, method: str, url: str, **kw) -> Answer:
    """The status and body, at most MAX_ANSWER bytes of it (TooLarge past that)."""
    async with client.stream(method, url, **kw) as response:
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_ANSWER:
                raise TooLarge(f"{url.rsplit('/', 1)[-1]} answered more than {MAX_ANSWER} bytes")
        return Answer(response.status_code, bytes(body))
