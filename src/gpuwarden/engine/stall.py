"""Stall detection, pure: samples and the time in, a verdict out.

Progress is any work the engine shows: its progress counter increasing, or its per-step activity gauge
changing (vLLM's KV-cache usage grows chunk by chunk through a long prefill while no token counter moves). A
stall: requests running and nothing moving for longer than the threshold,
`clamp(stall_multiple x typical time, floor, max_stall)`. The typical time matches what the progress counter
proves: when it moves on every engine step, the longer of seconds per token and seconds to a first token (a
prefill may be counted only once done; not where an activity gauge shows the prefill's work); when it moves
only as requests end, seconds per request. Each comes from the engine's own timing (histograms or sum/count
counters) over its recent increments.

The floor is `min_stall`, or `stall_multiple` x the longest recent step the engine was seen to take (a gap
between two movements with a quiet scrape between them): an engine whose every chunk takes 40 s shows it
before it is judged on it. Without timing the floor applies. While an engine process spins at a full core
(the classic hang; a GPU's waiter spins too) the floor applies, however long requests usually take: since
any movement restarts the clock, the spin rule shortens only a wait in which nothing at all moves. Under
suspicion (a fault with no owner on its GPU) the floor applies too, where the progress counter moves every
step; a per-request counter proves nothing within a request's time, and the canary watches that engine.

Idle (nothing running) is never a stall. A counter that goes down (the engine restarted, or a broken
counter) is not progress: the count starts again from the lower value, and the time without progress runs on.

When to look: the clock starts at the scrape that last saw progress, never earlier (the last movement may have
come just before it; an earlier guess would judge a healthy engine, a long prefill included, on time it did not
take). So a regular scrape would see the stall up to a whole scrape after the threshold ran out; `due` says when
it runs out, and `next_look` puts a look there: a stall is seen within threshold + one scrape of its onset.
"""

from __future__ import annotations

from collections import deque

from gpuwarden.core.plain import plain
from gpuwarden.engine.metrics import EngineSample

_RECENT = 20  # timing increments that make "recent"
_STEPS = 8  # step gaps that make "recent"
_PAST = 0.01  # a look this long after the threshold runs out: the judgement is "longer than", not "as long as"
_GAP = 0.25  # nor sooner after the last look: its CPU reading (spinning or not) needs a window to mean anything


@plain
class Verdict:
    """The stall detector's judgement of one sample."""

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
        self._activity: float | None = None
        self._since: float | None = None  # last progress, or when running started
        self._moved: float | None = None  # last movement while running (None: none since it was idle)
        self._quiet = False  # a look since that movement saw nothing move
        self._steps: deque[float] = deque(maxlen=_STEPS)  # recent gaps between movements, quiet looks between
        self._timing, self._first_token = RecentMean(), RecentMean()
        self._per_step = False
        self._due: float | None = None
        self.stalled = False

    @property
    def due(self) -> float | None:
        """Monotonic time at which the last look's threshold runs out if nothing moves meanwhile; None where no
        stall is coming (idle, no judgement, or already stalled)."""
        return self._due

    @property
    def typical(self) -> float | None:
        """Seconds per token (or request); with the time to a first token only where a prefill's work is not
        seen as it goes (no activity gauge): where it is, a prefill is judged chunk by chunk like any step."""
        waits = (self._timing.mean,) if self._activity is not None else (self._timing.mean, self._first_token.mean)
        means = [m for m in waits if m is not None]
        return max(means) if means else None

    @property
    def floor(self) -> float:
        step = max(self._steps, default=0.0)
        return min(max(self.stall_multiple * step, self.min_stall), self.max_stall)

    def threshold(self, spinning: bool = False, suspect: bool = False) -> float:
        typical = self.typical
        if spinning or typical is None or (suspect and self._per_step):
            return self.floor
        return min(max(self.stall_multiple * typical, self.floor), self.max_stall)

    def observe(self, sample: EngineSample, now: float, spinning: bool = False, suspect: bool = False) -> Verdict:
        self._learn_timing(sample)
        running, progress = sample.running, sample.progress
        if running is None or progress is None:
            return self._verdict(False, now, spinning, suspect)  # the engine does not say: no judgement
        activity, self._activity = self._activity, sample.activity
        moved = self._progress is not None and (progress > self._progress or (
            sample.activity is not None and activity is not None and sample.activity != activity))
        if running <= 0 or self._progress is None or moved:  # idle, first look, progress
            self._learn_step(now, moved and running > 0)
            self._progress, self._since = progress, now
            return self._verdict(False, now, spinning, suspect, running > 0)
        self._progress, self._quiet = progress, True  # unchanged, or went down: not progress
        return self._verdict(now - self._since > self.threshold(spinning, suspect), now, spinning, suspect, True)

    def _learn_step(self, now: float, moved: bool) -> None:
        """A movement after a quiet look ends one step the engine took (how long its steps take now); one that
        ends a stall does not (that wait was the stall, not a step)."""
        if moved and self._moved is not None and self._quiet and not self.stalled:
            self._steps.append(now - self._moved)
        self._moved, self._quiet = (now if moved else None), False

    def _learn_timing(self, sample: EngineSample) -> None:
        if sample.per_step != self._per_step:  # the kind of timing changed: what was learnt does not apply
            self._per_step, self._timing, self._first_token = sample.per_step, RecentMean(), RecentMean()
        self._timing.learn(sample.timing)
        self._first_token.learn(sample.first_token)

    def _verdict(self, stalled: bool, now: float, spinning: bool, suspect: bool, running: bool = False) -> Verdict:
        new = stalled != self.stalled
        self.stalled = stalled
        stalled_for = now - self._since if self._since is not None and stalled else 0.0
        threshold = self.threshold(spinning, suspect)
        self._due = self._since + threshold if running and not stalled and self._since is not None else None
        return Verdict(stalled, new, stalled_for, threshold, self.typical, self._per_step)


def next_look(tick: float, due: float | None, last: float, now: float) -> float:
    """When the watch scrapes next: at its regular tick, or just after a stall threshold runs out if that comes
    first (`last`: the time the last look is dated, its scrape's answer; `now`: when it ended). At most one early
    look per threshold (one the last look already reached, e.g. its scrape failed after it, waits for the tick),
    and only while requests run and nothing moves.

    A threshold that is a multiple of the scrape interval (10 s and 2 s; 30 s and 5 s) runs out a scrape's
    duration after a regular tick. So a look at that tick came just before it: one whose scrape answered before
    the threshold ran out but that ended after it was taken for one past it (no early look: judged a whole scrape
    late), and one that ended before it put off the early look by the CPU reading's window (judged 0.3 s late, on
    a real vLLM). A tick that close before the early look is moved to it: one look, just after the threshold."""
    if due is None or due + _PAST <= last:
        return tick
    early = max(due + _PAST, now + _GAP)
    return early if early < tick + _GAP else tick
