"""Stall detection, pure: samples and the time in, a verdict out.

A stall: requests running and the progress counter not increasing for longer than
`clamp(stall_multiple x typical request time, min_stall, max_stall)`. The typical request time is the mean
of the engine's latency histogram over its recent increments; without a histogram, the mean length of the
recent busy periods seen here; with neither, the floor applies. Idle (nothing running) is never a stall, and
a counter that goes down (the engine restarted) is neither progress nor a stall.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from gpuwarden.engine.metrics import EngineSample

_RECENT = 20  # histogram increments / busy periods that make "recent"


@dataclass(frozen=True, slots=True)
class Verdict:
    stalled: bool
    new: bool  # True on the scrape where the stall was first seen (or where it ended)
    stalled_for: float  # seconds since the last progress while running
    threshold: float
    typical: float | None


class StallDetector:
    def __init__(self, stall_multiple: float = 4.0, min_stall: float = 30.0, max_stall: float = 1800.0) -> None:
        self.stall_multiple, self.min_stall, self.max_stall = stall_multiple, min_stall, max_stall
        self._progress: float | None = None
        self._since: float | None = None  # last progress, or when running started
        self._hist: tuple[float, float] | None = None
        self._increments: deque[tuple[float, float]] = deque(maxlen=_RECENT)
        self._busy_since: float | None = None
        self._busy_periods: deque[float] = deque(maxlen=_RECENT)
        self.stalled = False

    @property
    def typical(self) -> float | None:
        if self._increments:
            count = sum(c for _, c in self._increments)
            return sum(s for s, _ in self._increments) / count
        if self._busy_periods:
            return sum(self._busy_periods) / len(self._busy_periods)
        return None

    @property
    def threshold(self) -> float:
        typical = self.typical
        wanted = self.stall_multiple * typical if typical is not None else self.min_stall
        return min(max(wanted, self.min_stall), self.max_stall)

    def observe(self, sample: EngineSample, now: float) -> Verdict:
        self._learn_latency(sample)
        running, progress = sample.running, sample.progress
        if running is None or progress is None:
            return self._verdict(False, now)  # the engine does not say: no judgement
        if running <= 0:
            if self._busy_since is not None:
                self._busy_periods.append(now - self._busy_since)
            self._busy_since = None
            self._progress, self._since = progress, now
            return self._verdict(False, now)
        if self._busy_since is None:
            self._busy_since = now
        if self._progress is None or progress != self._progress:  # progress, a first look, or a reset
            self._progress, self._since = progress, now
            return self._verdict(False, now)
        return self._verdict(now - self._since > self.threshold, now)

    def _learn_latency(self, sample: EngineSample) -> None:
        if sample.latency_sum is None or sample.latency_count is None:
            return
        current = (sample.latency_sum, sample.latency_count)
        if self._hist and current[1] > self._hist[1] and current[0] >= self._hist[0]:
            self._increments.append((current[0] - self._hist[0], current[1] - self._hist[1]))
        self._hist = current

    def _verdict(self, stalled: bool, now: float) -> Verdict:
        new = stalled != self.stalled
        self.stalled = stalled
        stalled_for = now - self._since if self._since is not None and stalled else 0.0
        return Verdict(stalled, new, stalled_for, self.threshold, self.typical)
