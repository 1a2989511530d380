"""Stall detection, pure: samples and the time in, a verdict out.

A stall: requests running and the progress counter not increasing for longer than the threshold,
`clamp(stall_multiple x typical time, min_stall, max_stall)`. The typical time matches what the progress
counter proves: when it moves on every engine step, the longer of seconds per token and seconds to a first
token (a prefill may be counted only once done); when it moves only as requests end, seconds per request.
Each comes from the engine's own timing (histograms or sum/count counters) over its recent increments.
Without timing the floor applies. While an engine process spins at a full core with no progress
(the classic hang) the floor applies too, however long requests usually take.

Idle (nothing running) is never a stall. A counter that goes down (the engine restarted, or a broken
counter) is not progress: the count starts again from the lower value, and the time without progress runs on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from gpuwarden.engine.metrics import EngineSample

_RECENT = 20  # timing increments that make "recent"


@dataclass(frozen=True, slots=True)
class Verdict:
    stalled: bool
    new: bool  # True on the scrape where the stall was first seen (or where it ended)
    stalled_for: float  # seconds since the last progress while running
    threshold: float
    typical: float | None
    per_step: bool  # the typical time is per token (the progress counter moves every step)


class RecentMean:
    """The mean of a (sum, count) timing over its recent increments: what the engine does now, not since start."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None
        self._increments: deque[tuple[float, float]] = deque(maxlen=_RECENT)

    def learn(self, current: tuple[float, float] | None) -> None:
        if current is None:
            return
        last = self._last
        if last and current[1] > last[1] and current[0] >= last[0]:
            self._increments.append((current[0] - last[0], current[1] - last[1]))
        self._last = current

    @property
    def mean(self) -> float | None:
        count = sum(c for _, c in self._increments)
        return sum(s for s, _ in self._increments) / count if count else None


class StallDetector:
    @property
    def progress_at(self) -> float | None:
        """Monotonic time of the last progress (or of the look that found it idle or starting to run)."""
        return self._since

    def __init__(self, stall_multiple: float = 4.0, min_stall: float = 30.0, max_stall: float = 1800.0) -> None:
        self.stall_multiple, self.min_stall, self.max_stall = stall_multiple, min_stall, max_stall
        self._progress: float | None = None
        self._since: float | None = None  # last progress, or when running started
        self._timing, self._first_token = RecentMean(), RecentMean()
        self._per_step = False
        self.stalled = False

    @property
    def typical(self) -> float | None:
        means = [m for m in (self._timing.mean, self._first_token.mean) if m is not None]
        return max(means) if means else None

    def threshold(self, spinning: bool = False) -> float:
        typical = self.typical
        if spinning or typical is None:
            return self.min_stall
        return min(max(self.stall_multiple * typical, self.min_stall), self.max_stall)

    def observe(self, sample: EngineSample, now: float, spinning: bool = False) -> Verdict:
        self._learn_timing(sample)
        running, progress = sample.running, sample.progress
        if running is None or progress is None:
            return self._verdict(False, now, spinning)  # the engine does not say: no judgement
        if running <= 0 or self._progress is None or progress > self._progress:  # idle, first look, progress
            self._progress, self._since = progress, now
            return self._verdict(False, now, spinning)
        self._progress = progress  # unchanged, or went down: not progress
        return self._verdict(now - self._since > self.threshold(spinning), now, spinning)

    def _learn_timing(self, sample: EngineSample) -> None:
        if sample.per_step != self._per_step:  # the kind of timing changed: what was learnt does not apply
            self._per_step, self._timing, self._first_token = sample.per_step, RecentMean(), RecentMean()
        self._timing.learn(sample.timing)
        self._first_token.learn(sample.first_token)

    def _verdict(self, stalled: bool, now: float, spinning: bool) -> Verdict:
        new = stalled != self.stalled
        self.stalled = stalled
        stalled_for = now - self._since if self._since is not None and stalled else 0.0
        return Verdict(stalled, new, stalled_for, self.threshold(spinning), self.typical, self._per_step)
