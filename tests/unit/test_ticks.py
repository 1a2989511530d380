"""The periodic loops' shared grid (ticks.py)."""

import pytest

from gpuwarden.runtime.ticks import next_tick


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
