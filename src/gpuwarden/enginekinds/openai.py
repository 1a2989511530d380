"""The OpenAI completions API, which vLLM and TGI speak (and any new kind may): the model from /v1/models,
then /v1/completions with `max_tokens` 1. The prompt is one token id (token-id prompts are part of the OpenAI
completions API), so no tokenizer or chat template is needed."""

from __future__ import annotations

from gpuwarden.enginekinds.base import Answer, CanaryApi, Send


async def _complete(send: Send) -> Answer:
    model = (await send("GET", "/v1/models")).json()["data"][0]["id"]
    return await send("POST", "/v1/completions", json={"model": model, "prompt": [1], "max_tokens": 1})


OPENAI = CanaryApi("openai", _complete)
