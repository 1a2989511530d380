"""`engine_not_answering`: a configured engine that has not answered for `restart_timeout` since gpuwarden began
to watch it, or since its last answer, is a page, once per silence. Without it an engine that is not running, or
whose metrics_url names the wrong port, was one log warning and `engine_up 0`: nobody heard of it.

A silence that the lifecycle already times is left to it: an instance starting (its start has a deadline:
engine_restart_failed) and one that failed to come back (paged as such)."""

from __future__ import annotations

import enum
from urllib.parse import urlsplit


class Said(enum.Enum):
    NOT_ANSWERING = "not answering"  # silent past the bound: page it
    ANSWERS = "answers again"  # after a page: its down condition ends


class Answering:
    """Whether an engine answers, for one engine: when its silence began and whether it was paged."""

    __slots__ = ("began", "bound", "paged", "silent_since")

    def __init__(self, bound: float, silent_since: float | None = None) -> None:
        self.bound = bound  # seconds of silence before the page (its restart_timeout: what a start may take)
        self.silent_since = silent_since  # monotonic; None while it answers
        self.began = "gpuwarden began to watch it"  # what its silence counts from, in words
        self.paged = False

    def observe(self, answered: bool, now: float, timed_elsewhere: bool) -> Said | None:
        """One look at `now` (monotonic); `timed_elsewhere`: the lifecycle times this silence (a start)."""
        if answered:
            said = Said.ANSWERS if self.paged else None
            self.silent_since, self.paged, self.began = None, False, "its last answer"
            return said
        if self.silent_since is None:
            self.silent_since = now
        if timed_elsewhere:
            self.silent_since = now  # the lifecycle's deadline pages; this bound counts again after it
            return None
        if not self.paged and now - self.silent_since >= self.bound:
            self.paged = True
            return Said.NOT_ANSWERING
        return None

    def silent_for(self, now: float) -> float:
        return 0.0 if self.silent_since is None else now - self.silent_since


def where(url: str) -> str:
    """The address it is read at, without what a URL may hold of secrets (user, password, query)."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{f':{parts.port}' if parts.port else ''}{parts.path}"
