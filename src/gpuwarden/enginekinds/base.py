"""What an engine kind is, as data: what its /metrics names mean, what its log lines say, how to ask it for one
real token, and how to recognise its server on this host. Each kind is one module of this package holding one
`EngineKind`; the registry (`__init__.py`) is the only list of them. Nothing here does I/O: the engine
component reads, scrapes and sends; a kind only says what to read and what it means.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from functools import cache

from gpuwarden.core.plain import plain


@plain
class Progress:
    """Counters whose sum is the engine's progress."""

    names: tuple[str, ...]  # counters summed: tokens (or steps) processed
    per_step: bool  # True: moves on every engine step; False: only when a request ends


@plain
class Timing:
    """A histogram's sum and count: the typical time per token or request."""

    sum: str  # seconds
    count: str  # tokens or requests


def histogram(family: str) -> Timing:
    return Timing(f"{family}_sum", f"{family}_count")


@plain
class Metrics:
    """What the engine's /metrics names mean. Gauges and counters list sample names: the first family present
    wins, and all its series (one per model, engine index or label set) are summed. Progress and timing list
    alternatives, newest engine versions first.

    Progress is any token processed (prompt or generated): a long prefill is progress too. Where no counter
    moves during a (chunked) prefill, `activity` names the gauge that does: the KV cache the engine fills step
    by step. Its changing is progress; its level means nothing. A counter that moves on every engine step
    (`per_step`) proves progress within a step's time; one that moves only when a request ends proves it only
    within a request's time, so the stall threshold follows the matching timing: seconds per token for a
    per-step counter (and the time to a first token, where an engine counts a prefill only once it is done),
    seconds per request otherwise."""

    prefix: str  # every metric of this engine starts with it: how `auto` recognises the engine
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    generated: tuple[str, ...]  # counter of generated tokens (shown and exported; not the stall signal)
    progress: tuple[Progress, ...]  # the first whose names are present is the stall signal
    token_timing: tuple[Timing, ...] = ()  # seconds per generated token
    first_token_timing: tuple[Timing, ...] = ()  # seconds to a first token: how long a prefill may take
    request_timing: tuple[Timing, ...] = ()  # seconds per finished request
    activity: tuple[str, ...] = ()  # a gauge that changes on every step that does work (first present wins)
    spec_accepted: tuple[str, ...] = ()
    spec_draft: tuple[str, ...] = ()

    def names(self) -> set[str]:
        timings = (*self.token_timing, *self.first_token_timing, *self.request_timing)
        return {*self.running, *self.waiting, *self.generated, *self.spec_accepted, *self.spec_draft, *self.activity,
                *(n for p in self.progress for n in p.names), *(t.sum for t in timings),
                *(t.count for t in timings)}


@plain
class LineRule:
    """One kind of log line and what it proves."""

    regex: str  # made by line(); compiled on first use (`pattern`): most daemons never read an engine's log
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

    @property
    def pattern(self) -> re.Pattern[str]:
        return _compiled(self.regex)


_compiled = cache(re.compile)  # each rule's expression once, on first use: not at import (3.7 ms for all kinds)


@plain
class LogProfile:
    """What the engine's own log lines say about progress. Each rule is anchored at the start of a line (`line`
    below): a rule searched anywhere matched a progress line forged inside a prompt the engine logs, and hid a
    stall. Lines no rule matches are ignored, never guessed at."""

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
NUM = r"[0-9]+(?:\.[0-9]+)?"
# Every gap in a rule must be bounded: a line may carry a client's text (a prompt, Ollama's request path), and an
# unbounded gap tried from each of its repeats is quadratic (a 500 KB line took 28 s of the event loop).


def line(prefix: str, message: str) -> str:
    """Framing, the engine's logger prefix, then its message: nothing else may come before the message."""
    return rf"(?:{_FRAME}){{0,4}}{prefix}{message}"


@plain
class Answer:
    """An engine's answer to a canary request."""

    status_code: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.body)


# send(method, path, json=None) -> the answer, its body bounded by the canary
Send = Callable[..., Awaitable[Answer]]


@plain
class CanaryApi:
    """How to ask the engine for one real token. `complete` sends what the API needs through `send` and returns
    the completion's answer, or None when there is nothing to ask (no model loaded). `late` says, from the
    answer's status and the seconds it took, that the engine's own deadline passed without a token (a timeout,
    not an error); None: it did not."""

    name: str  # what `canary = ...` in an [[engine]] calls it
    complete: Callable[[Send], Awaitable[Answer | None]]
    late: Callable[[int, float], str | None] = lambda status, seconds: None


@plain
class EngineKind:
    """One engine kind: its metrics, log, canary API and how discovery recognises it."""

    name: str  # the `profile` of an [[engine]], and the first word of a discovered engine's name
    title: str  # as people write it
    canary: CanaryApi
    metrics: Metrics | None = None  # None: it serves no /metrics
    log: LogProfile | None = None  # None: its log says nothing gpuwarden can read
    slots: bool = False  # it serves llama.cpp's /slots (source = "slots")
    commands: tuple[str, ...] = ()  # substrings of its server's command line, for discovery
    # the file names (regular expressions) its own server processes execute (/proc/<pid>/exe): a process that
    # merely carries the command's text (a shell, an editor, pgrep) is never the engine
    executables: tuple[str, ...] = ()
    answers_at: str | None = None  # a path only this kind's API answers: `probe`'s hint when /metrics does not
    more: str = ""  # what a user can switch on for per-step progress
    idle_canary: float = 0.0  # canary_interval of a discovered engine of this kind (0: none)
    # where it keeps compiled artefacts, per user ({home}, {user}): a crash loop's poisoned cache is looked for there
    caches: tuple[str, ...] = ()

    @property
    def sources(self) -> tuple[str, ...]:
        """The sources progress can be read from: its /metrics, its log, its /slots."""
        return tuple(s for s, offered in (("metrics", self.metrics), ("log", self.log), ("slots", self.slots))
                     if offered)


PYTHON = r"(python|pypy)[0-9.]*"  # an engine written in Python runs its interpreter
