"""Numbers, counts and times as a person writes them, the one voice of every page: a count is an integer
(`running: 2`, never `2.0`), a percent is rounded, `1 process` and `2 processes`, every clock time carries its
zone, a duration says when it began and ended."""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo

from gpuwarden.core.counts import plural as plural  # the pages count as the events do

# the evidence figures' names as words, and their unit (a figure not named here: its key, spaces for underscores)
_FIGURES = {
    "running": ("requests running", ""), "waiting": ("requests waiting", ""),
    "tokens_processed": ("tokens processed", ""), "generated_tokens": ("tokens generated", ""),
    "stalled_seconds": ("no progress for", "s"), "threshold_seconds": ("stall threshold", "s"),
    "typical_token_seconds": ("typical time per token", "s"),
    "typical_request_seconds": ("typical time per request", "s"),
    "cpu_percent": ("CPU of its busiest process", "%"), "canary_seconds": ("canary took", "s"),
    "silent_seconds": ("silent for", "s"), "failures": ("failed scrapes in a row", ""),
}


def number(value: object) -> str:
    """A figure as a person writes it: a whole number as an integer with thousands separators, a fraction to
    three significant digits (0.031, 12.4), anything else as it is."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if float(value).is_integer() or abs(value) >= 100:
        return f"{round(value):,}"
    return f"{value:.3g}"


def figure(key: str, value: object) -> str:
    """An evidence figure as a line: `requests running: 4`, `no progress for: 120 s`, `CPU ...: 13 %`."""
    name, unit = _FIGURES.get(key, (key.replace("_", " "), ""))
    if unit == "%" and isinstance(value, int | float):
        return f"{name}: {round(value)} %"
    if unit == "s" and isinstance(value, int | float):
        return f"{name}: {duration(value) if value >= 60 else number(value) + ' s'}"
    return f"{name}: {number(value)}"


def duration(seconds: float) -> str:
    """`41 s`, `2 min 5 s`, `1 h 30 min`."""
    s = round(seconds)
    if s <= 90:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min" + (f" {s % 60} s" if s % 60 else "")
    return f"{s // 3600} h" + (f" {s % 3600 // 60} min" if s % 3600 // 60 else "")


def local(stamp: float, tz: tzinfo | None) -> datetime:
    """The reader's local time (tz None: the machine's zone)."""
    return datetime.fromtimestamp(stamp, tz) if tz else datetime.fromtimestamp(stamp).astimezone()


def when(stamp: float, tz: tzinfo | None) -> str:
    """The date and time in the reader's zone, then in UTC once: `2026-12-04 03:12:07 CET (02:12:07 UTC)`; a
    reader in UTC reads it once."""
    t = local(stamp, tz)
    if not t.utcoffset():
        return f"{t:%Y-%m-%d %H:%M:%S} {t.tzname()}"
    return f"{t:%Y-%m-%d %H:%M:%S} {t.tzname()} ({datetime.fromtimestamp(stamp, UTC):%H:%M:%S} UTC)"


def clock(stamp: float | None, tz: tzinfo | None) -> str:
    """A time of day with its zone: `03:12:07 CET`."""
    if not stamp:
        return "an unknown time"
    t = local(stamp, tz)
    return f"{t:%H:%M:%S} {t.tzname()}"


def span(start: float, end: float, tz: tzinfo | None) -> str:
    """When something lasted: `from 03:10:07 to 03:12:07 CET (2 min)`."""
    a, b = local(start, tz), local(end, tz)
    first = f"{a:%H:%M:%S}" if a.tzname() == b.tzname() and a.date() == b.date() else \
        f"{a:%Y-%m-%d %H:%M:%S} {a.tzname()}"
    return f"from {first} to {b:%H:%M:%S} {b.tzname()} ({duration(end - start)})"
