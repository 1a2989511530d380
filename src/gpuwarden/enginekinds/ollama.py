"""Ollama. It serves no /metrics: its log shows completions, and its canary (every minute when discovered) does
the rest."""

from __future__ import annotations

from gpuwarden.enginekinds.base import Answer, CanaryApi, EngineKind, LineRule, LogProfile, Send, line


async def _complete(send: Send) -> Answer | None:
    """/api/generate with `num_predict` 1, for a model already loaded (/api/ps): a canary must never make Ollama
    load a model, which can take minutes."""
    models = (await send("GET", "/api/ps")).json().get("models") or []
    if not models:
        return None
    return await send("POST", "/api/generate", json={
        "model": models[0]["name"], "prompt": "1", "stream": False, "options": {"num_predict": 1}})


KIND = EngineKind(
    "ollama", "Ollama",
    canary=CanaryApi("ollama", _complete),
    # server/routes.go through gin's LoggerWithWriter (every Ollama release): one line per finished HTTP
    # request, "[GIN] date | status | latency | client | METHOD "path"". No line says what is running,
    # so the log only shows completions; the canary and /api/ps do the rest. gin's fields are its own (date,
    # status, latency, a parsed IP) and the path is quoted (%#v): the line must end at the path's closing
    # quote, so no path can carry a second line's fields
    log=LogProfile(
        (LineRule(line(r"\[GIN\] \d{4}/\d\d/\d\d - \d\d:\d\d:\d\d \| ",
                       r'200 \| {0,16}[\d.µunmhs]{1,32} \| {0,40}[\da-fA-F.:]{1,45} \| POST +'
                       r'"/(?:api/generate|api/chat|v1/chat/completions|v1/completions)"\s*$'), progress=True),),
        per_step=False, interval=0.0, knows_running=False),
    commands=("ollama serve",),
    executables=("ollama",),
    answers_at="/api/ps",
    more="Ollama has no /metrics: run it as a systemd unit (its journal) with a canary_interval",
    idle_canary=60.0,
)
