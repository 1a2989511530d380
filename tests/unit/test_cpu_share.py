"""An engine process's share of a core is read over a window of a second at least, not since the last look.

The processes are stand-ins with the two things the reading uses (identity and CPU times): the point is which
looks the share is computed between, which needs times chosen by the test.
"""

from types import SimpleNamespace

from gpuwarden.engine.processes import CPU_WINDOW, Tracker


class Proc:
    def __init__(self, pid: int) -> None:
        self.pid, self.used = pid, 0.0

    def create_time(self) -> float:
        return 1000.0

    def cpu_times(self):
        return SimpleNamespace(user=self.used, system=0.0)


def test_a_short_dip_between_two_close_looks_does_not_end_a_spin():
    tracker, proc = Tracker(), Proc(4242)
    assert tracker.cpu_percents([proc], now=0.0) == {4242: 0.0}  # one look says nothing yet
    proc.used = 1.0
    assert tracker.cpu_percents([proc], now=1.0) == {4242: 100.0}
    proc.used = 1.1  # 0.1 s of CPU in the next quarter second: 40 % read alone
    [share] = tracker.cpu_percents([proc], now=1.25).values()
    assert share == 100.0 * 1.1 / 1.25  # read from the look at 0.0, the newest one a window old


def test_older_looks_fall_out_of_the_window_and_a_gone_process_is_forgotten():
    tracker, proc, other = Tracker(), Proc(4242), Proc(4343)
    for now in (0.0, 1.0, 2.0):
        proc.used = now  # a full core
        tracker.cpu_percents([proc, other], now=now)
    proc.used = 2.0  # then stopped
    [share, _] = tracker.cpu_percents([proc, other], now=2.0 + CPU_WINDOW).values()
    assert share == 0.0  # read from the look at 2.0: the spin before it no longer counts
    tracker.cpu_percents([proc], now=4.0)
    assert list(tracker.cpu_seen) == [(4242, 1000.0)]
