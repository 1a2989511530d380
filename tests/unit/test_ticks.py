"""The periodic loops' shared grid (ticks.py)."""

import math
from collections import Counter

import pytest

from gpuwarden.runtime.ticks import next_regular, next_tick, phase_tick, spread


@pytest.mark.parametrize("period", [0.1, 0.5, 1.0, 0.7, 3.0])
def test_each_tick_is_one_period_after_the_last_never_the_same_nor_two(period):
    tick = next_tick(12345.678, period)
    for _ in range(2000):  # float products are not exact: a grid point must still give the next one
        following = next_tick(tick, period)
        assert following - tick == pytest.approx(period, abs=1e-6)
        tick = following


def test_loops_whose_periods_divide_each_other_are_due_together():
    """The loop-lag probe (0.5 s) and the GPU round (1 s): every second one of the probe's wake-ups is the round's."""
    for now in (100.2, 100.7, 101.0, 101.49):
        probe, gpu = next_tick(now, 0.5), next_tick(now, 1.0)
        assert probe == gpu or next_tick(probe, 0.5) == gpu
        assert 0 < probe - now <= 0.5


@pytest.mark.parametrize("period", [5.0, 2.0, 30.0])
def test_looks_spread_over_a_whole_seconds_period_are_on_the_one_second_grid(period):
    """Engines' looks (engine/watch.py): each at its own phase, in whole seconds, so each look wakes the loop
    with the GPU round and the lag probe; the phases of 32 engines spread over every second of the period."""
    phases = [spread(i, period) for i in range(32)]
    assert phases[0] == 0.0 and all(0 <= p < period and p == int(p) for p in phases)
    per_second = Counter(phases)  # even: a second holds at most one more than 32 / period, rounded up
    assert max(per_second.values()) <= math.ceil(32 / period) + 1 and len(per_second) >= min(period, 32) - 1
    for now in (100.2, 104.999999, 1e6 + 0.3):
        for phase in phases:
            tick = phase_tick(now, period, phase)
            assert 0 < tick - now <= period * (1 + 1e-6)  # a time a millionth of a period short of a point is on it
            assert tick == next_tick(tick - 1.0, 1.0)  # a grid second, exactly: due with the others
            assert (tick - phase) % period == 0


def test_a_period_not_of_whole_seconds_of_two_or_more_keeps_its_phase():
    """2.5 s: off the grid, as before; 1 s: whole seconds would put every engine at 0, all looking at once."""
    assert spread(1, 2.5) == pytest.approx(0.6180339887498949 * 2.5)
    assert phase_tick(10.0, 2.5, 1.0) == 11.0 and phase_tick(11.0, 2.5, 1.0) == 13.5
    assert len({spread(i, 1.0) for i in range(32)}) == 32


def test_the_next_regular_tick_is_one_period_on_and_a_late_one_comes_at_once_once():
    """A look done in time: the next grid point of its phase. A scrape that waited its whole timeout (5 s, as
    long as its interval): the next at once, so a hung engine is looked at every 5 s, not every 10 s. A loop
    blocked for two periods: one look at once, then the grid again, not a burst of the missed ones."""
    assert next_regular(100.0, 100.05, 5.0, 3.0) == 103.0
    assert next_regular(103.0, 103.2, 5.0, 3.0) == 108.0
    due, now = 100.0, 105.001  # the scrape waited its timeout
    for _ in range(4):
        following = next_regular(due, now, 5.0, 0.0)
        assert following <= now  # at once
        due, now = following, now + 5.001
    assert next_regular(100.0, 112.0, 5.0, 0.0) == 110.0  # at once
    assert next_regular(110.0, 112.1, 5.0, 0.0) == 115.0  # then the grid
