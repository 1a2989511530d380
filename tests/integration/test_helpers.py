"""The integration tests' own parts (helpers.py), where a mistake would make other tests pass or fail wrongly."""

import sys


def test_a_restarted_daemon_is_waited_for_on_its_own_lines_not_the_last_runs(daemon_factory):
    """A restart appends to the same log: the first run's "gpuwarden running" must not answer for the second
    (it did, and the test stopped a daemon that had no SIGTERM handler yet: rc -15). The second run here is a
    process that exits without writing it: the wait says so instead of returning."""
    d = daemon_factory().start()
    d.wait_serving()
    assert d.stop() == 0
    assert "gpuwarden running" in d.log()

    d.start(sys.executable, "-c", "import sys; print('not a daemon', file=sys.stderr)")  # runs instead of it
    try:
        d.wait_log("gpuwarden running")
    except AssertionError as exc:
        assert "the daemon exited 0 without writing 'gpuwarden running'" in str(exc)
    else:
        raise AssertionError("the first run's line answered for the second")
    assert d.stop() == 0 and d.log().endswith("not a daemon\n")
