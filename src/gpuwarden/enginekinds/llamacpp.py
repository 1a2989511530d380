"""llama.cpp's server (llama-server). Each choice below was checked against the engine's source; the comment says
where. Its /slots (source = "slots") is read by engine/slots.py."""

from __future__ import annotations

from gpuwarden.enginekinds.base import (
    NUM,
    Answer,
    CanaryApi,
    EngineKind,
    LineRule,
    LogProfile,
    Metrics,
    Progress,
    Send,
    Timing,
    line,
)

# common/log.cpp's optional timestamp and level, then server.cpp's "slot <func>: id N | task T | " or "srv <func>: "
_LLAMA = r"(?:\d{1,6}\.\d\d\.\d{3}\.\d{3} [DIWE] )?"
_SLOT = _LLAMA + r"slot +\w{1,12}: id +(?P<key>\d+) \| task -?\d+ \| "
_SRV = _LLAMA + r"srv +\w{1,12}: "


async def _complete(send: Send) -> Answer:
    """/completion with `n_predict` 1, a one-token-id prompt."""
    return await send("POST", "/completion", json={"prompt": [1], "n_predict": 1, "cache_prompt": False})


KIND = EngineKind(
    "llamacpp", "llama.cpp",
    canary=CanaryApi("llamacpp", _complete),
    metrics=Metrics(
        "llamacpp:",
        running=("llamacpp:requests_processing",),
        waiting=("llamacpp:requests_deferred",),
        generated=("llamacpp:tokens_predicted_total",),
        # tools/server: n_decode_total counts llama_decode calls (prompt batches and generation steps: measured
        # on b11434, a 3000-token prompt at --batch-size 64 moved it every 2 s while prompt_tokens_total stayed
        # 0); tokens_predicted_total and its seconds are added when a slot is released (a request ends).
        progress=(Progress(("llamacpp:n_decode_total",), per_step=True),
                  Progress(("llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_total"), per_step=False)),
        token_timing=(Timing("llamacpp:tokens_predicted_seconds_total", "llamacpp:tokens_predicted_total"),),
    ),
    # tools/server/server-context.cpp (build b11434; the "slot <func>: id N | task T | " prefix since the
    # 2024 server rewrite): "processing task" when a slot takes a request, "stop processing" when it
    # releases it, "total time = X ms" when it ends, "all slots are idle"; while running, "prompt
    # processing, n_tokens" (prompts over 3 s) and "n_gen = N, tg = " (every 3 s past 100 tokens, newer
    # builds). Older builds log only the per-request lines: progress then proves itself per request.
    log=LogProfile(
        (LineRule(line(_SLOT.replace(r"\w{1,12}", "launch_slot_"), "processing task"), running="busy",
                  progress=True),
         LineRule(line(_SLOT.replace(r"\w{1,12}", "release"), "stop processing"), running="idle", progress=True),
         # print_timing's last line: its own, or (older builds) the bare third line of one multi-line message
         LineRule(line(rf"(?:{_SLOT.replace('?P<key>', '')})?", rf" *total time = +(?P<ms>{NUM}) ms /"),
                  request_ms=True),
         LineRule(line(_SLOT, r" *(?:n_gen = +\d+, tg = |prompt processing, n_tokens = |prompt done, n_tokens = )"),
                  progress=True),
         LineRule(line(_SRV.replace(r"\w{1,12}", "update_slots"), "all slots are idle"), all_idle=True)),
        per_step=False, interval=0.0, knows_running=True),
    slots=True,
    commands=("llama-server", "llama.cpp/server"),
    executables=("llama-server", "llama-cpp-server"),
    answers_at="/slots",
    more="start it with --metrics (without it: /slots, on unless --no-slots, or its log)",
)
