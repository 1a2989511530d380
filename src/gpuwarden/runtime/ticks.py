"""One grid for the periodic loops: each wakes at the next multiple of its period on the monotonic clock (the
event loop's), so loops whose periods divide one another (the GPU round and the loop-lag probe each
second, a kernel source's tick) are due together and the loop wakes once for all of them, not once per loop at
its own phase. A period keeps its length; only its phase is shared. Loops spread over their period (one engine's
looks each) keep a phase of their own, in whole seconds where the period is whole seconds: each wakes with the
one-second grid's loops."""

from __future__ import annotations

import math
import time

_EPSILON = 1e-6  # of a period: a time this close below a grid point is on it (float products are not exact)


def next_tick(now: float, period: float) -> float:
    """The first grid point of `period` after `now` (a grid point itself gives the one after it)."""
    return (math.floor(now / period + _EPSILON) + 1) * period


def phase_tick(now: float, period: float, phase: float) -> float:
    """The first time after `now` that lies `phase` (0 <= phase < period) past a grid point of `period`."""
    return next_tick(now - phase, period) + phase


def next_regular(due: float, now: float, period: float, phase: float) -> float:
    """The regular tick after the one `due`, its work done at `now`: one period on, on the grid. Work that outlasted
    its period (a scrape that waited its whole timeout) is followed at once, once: never by a burst of the ticks it
    missed, nor by a wait for the next grid point (a hung engine's looks would come half as often)."""
    return phase_tick(max(due, now - period), period, phase)


def spread(index: int, period: float) -> float:
    """The phase of the `index`-th of many loops of one `period`, spread evenly over it for any count (the golden
    ratio's steps; the first at 0), rounded down to whole seconds where the period is whole seconds, two or more (a
    one-second period would put them all at 0, at once)."""
    phase = (index * 0.6180339887498949) % 1.0 * period
    return float(math.floor(phase)) if period >= 2.0 and period == round(period) else phase


def until_tick(period: float) -> float:
    """Seconds from now to the next grid point of `period`."""
    now = time.monotonic()
    return next_tick(now, period) - now
