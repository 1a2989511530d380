"""What each engine's own log lines say about progress, as data (the log twin of profiles.py).

Each rule is a regular expression anchored at the start of a line: the engine's own logger prefix, then the
message. Only framing that something outside the engine adds may come first (a journal or syslog prefix, a
Docker or ISO timestamp, a Docker Compose service column, vLLM's `(APIServer pid=N)`): a rule searched
anywhere matched a progress line forged inside a prompt the engine logs, or an Ollama request path, and hid a
stall. What a match means is data too. Lines no rule matches are ignored, never guessed at. Each format was
read in the engine's source; the comment says where and since when. Real lines of each, with where they were
found, are in tests/corpus/logs/.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LineRule:
    pattern: re.Pattern[str]
    # what a match means; named groups carry the figures:
    #   running: requests running now (per `key` group when present: one engine of several, one slot)
    #   progress: the line proves tokens were processed when every `tokens` group is > 0 (or none is named)
    #   request_seconds / request_ms: one request ended and took this long (its timing)
    running: str | None = None  # "set": group `running` is the count; "busy"/"idle": the `key` slot is
    tokens: tuple[str, ...] = ()  # groups summed: progress when > 0
    moves: tuple[str, ...] = ()  # groups whose change since the last such line (per `key`) is progress
    progress: bool = False  # the line proves progress by itself
    request_ms: bool = False  # group `ms` is one finished request's time
    all_idle: bool = False  # nothing runs any more


@dataclass(frozen=True, slots=True)
class LogProfile:
    name: str
    rules: tuple[LineRule, ...]
    per_step: bool  # progress lines come while tokens flow (not only when a request ends)
    interval: float  # seconds between progress lines while busy, at most: the stall floor is twice this
    knows_running: bool  # the log says how many requests run (Ollama's does not: its canary watches it)


# What others put before an engine's line, each form from tests/corpus/logs: a journal or syslog line
# ("Jan 20 23:15:37 host ollama[1232]: "), an ISO or RFC 3339 time, a Compose column ("llama-cpp   | "), a
# process tag ("(APIServer pid=1) ", "[51429] "). None can hold a logged prompt: that comes after the prefix.
_FRAME = (r"(?:\S{1,8} {1,2}\d{1,2} \d\d:\d\d:\d\d(?: {1,2}[\w.-]{1,64})? {1,2}[\w.@/-]{1,64}:?\[\d+\]: "
          r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)? "
          r"|[\w.-]{1,64} {1,64}\| "
          r"|\(?\w{1,64} pid=\d+\) "
          r"|\[\d+\] )")


def _r(prefix: str, message: str) -> re.Pattern[str]:
    """Framing, the engine's logger prefix, then its message: nothing else may come before the message."""
    return re.compile(rf"(?:{_FRAME}){{0,4}}{prefix}{message}")


# vllm/logger.py's format, from the stats loggers' own files only: vLLM repeats the whole prefix on every line
# of a multi-line message, so a client's text split over lines carries it too, with another file's name
_VLLM = (r"(?:INFO|DEBUG) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})? \[?(?:[\w.-]{1,64}/){0,6}"
         r"(?:loggers|metrics|llm_engine)\.py:\d{1,5}\] ")
_SGLANG = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: [A-Z]{2}\d{1,5}){0,4}\] "  # "[date time TP0] ", "[... DP0 TP0] "
# common/log.cpp's optional timestamp and level, then server.cpp's "slot <func>: id N | task T | " or "srv <func>: "
_LLAMA = r"(?:\d{1,6}\.\d\d\.\d{3}\.\d{3} [DIWE] )?"
_SLOT = _LLAMA + r"slot +\w{1,12}: id +(?P<key>\d+) \| task -?\d+ \| "
_SRV = _LLAMA + r"srv +\w{1,12}: "


_NUM = r"[0-9]+(?:\.[0-9]+)?"
# Every gap in a rule is bounded: a line may carry a client's text (a prompt, Ollama's request path), and an
# unbounded gap tried from each of its repeats is quadratic (a 500 KB line took 28 s of the event loop).

LOG_PROFILES: tuple[LogProfile, ...] = (
    LogProfile(
        # vllm/v1/metrics/loggers.py LoggingStatLogger.log (0.32.0, and V0's engine/metrics.py since 0.2):
        # "[Engine 000: ]Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s,
        # Running: %d reqs, ...", every VLLM_LOG_STATS_INTERVAL (10 s; 5 s in V0). V1 logs it at DEBUG once
        # this and the last interval both read 0 tokens/s: a stall shows as one 0.0 line, then silence.
        "vllm",
        # The "KV cache usage" that follows grows chunk by chunk through a prefill whose tokens count only once it
        # is done: its change is progress while both throughputs read 0.0.
        (LineRule(_r(_VLLM, rf"(?:Engine (?P<key>\d+): )?Avg prompt throughput: (?P<prompt>{_NUM}) tokens/s, "
                     rf"Avg generation throughput: (?P<gen>{_NUM}) tokens/s, Running: (?P<running>\d+) reqs"
                     rf"(?:.{{0,256}}? KV cache usage: (?P<kv>{_NUM})%)?"),
                  running="set", tokens=("prompt", "gen"), moves=("kv",)),),
        per_step=True, interval=10.0, knows_running=True),
    LogProfile(
        # sglang/srt/managers/scheduler_metrics_mixin.py (and scheduler.py before it): "Decode batch[ [n]],
        # #running-req: N, ... gen throughput (token/s): X" every decode_log_interval (40) decode steps
        # ("Decode batch. #running-req" before 2025), and "Prefill batch[...], #new-seq: N, #new-token: T, ...
        # #running-req: R" for every prefill batch.
        "sglang",
        (LineRule(_r(_SGLANG, rf"Decode batch(?: \[\d+\])?[.,] #running-req: (?P<running>\d+),.{{0,512}}?"
                     rf"gen throughput \(token/s\): (?P<gen>{_NUM})"), running="set", tokens=("gen",)),
         LineRule(_r(_SGLANG, r"Prefill batch(?: \[\d+\])?(?:\(mixed #running-req: \d+\))?[.,] #new-seq: (?P<new>\d+), "
                     r"#new-token: (?P<tokens>\d+),.{0,512}?#running-req: (?P<running>\d+)"),
                  running="set", tokens=("tokens",))),
        per_step=True, interval=0.0, knows_running=True),
    LogProfile(
        # tools/server/server-context.cpp (build b11434; the "slot <func>: id N | task T | " prefix since the
        # 2024 server rewrite): "processing task" when a slot takes a request, "stop processing" when it
        # releases it, "total time = X ms" when it ends, "all slots are idle"; while running, "prompt
        # processing, n_tokens" (prompts over 3 s) and "n_gen = N, tg = " (every 3 s past 100 tokens, newer
        # builds). Older builds log only the per-request lines: progress then proves itself per request.
        "llamacpp",
        (LineRule(_r(_SLOT.replace(r"\w{1,12}", "launch_slot_"), "processing task"), running="busy",
                  progress=True),
         LineRule(_r(_SLOT.replace(r"\w{1,12}", "release"), "stop processing"), running="idle", progress=True),
         # print_timing's last line: its own, or (older builds) the bare third line of one multi-line message
         LineRule(_r(rf"(?:{_SLOT.replace('?P<key>', '')})?", rf" *total time = +(?P<ms>{_NUM}) ms /"),
                  request_ms=True),
         LineRule(_r(_SLOT, r" *(?:n_gen = +\d+, tg = |prompt processing, n_tokens = |prompt done, n_tokens = )"),
                  progress=True),
         LineRule(_r(_SRV.replace(r"\w{1,12}", "update_slots"), "all slots are idle"), all_idle=True)),
        per_step=False, interval=0.0, knows_running=True),
    LogProfile(
        # server/routes.go through gin's LoggerWithWriter (every Ollama release): one line per finished HTTP
        # request, "[GIN] date | status | latency | client | METHOD "path"". No line says what is running,
        # so the log only shows completions; the canary and /api/ps do the rest.
        "ollama",
        # gin's fields are its own (date, status, latency, a parsed IP) and the path is quoted (%#v): the line
        # must end at the path's closing quote, so no path can carry a second line's fields
        (LineRule(_r(r"\[GIN\] \d{4}/\d\d/\d\d - \d\d:\d\d:\d\d \| ",
                     r'200 \| {0,16}[\d.µunmhs]{1,32} \| {0,40}[\da-fA-F.:]{1,45} \| POST +'
                     r'"/(?:api/generate|api/chat|v1/chat/completions|v1/completions)"\s*$'), progress=True),),
        per_step=False, interval=0.0, knows_running=False),
)

LOG_BY_NAME = {p.name: p for p in LOG_PROFILES}
