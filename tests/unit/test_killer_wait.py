"""When the kill stops waiting out its grace (pure: the live processes' states and how long the tree was quiet).
The kill itself, on real processes, is tests/integration/test_killer.py."""

import psutil

from gpuwarden.act.killer import waiting_cannot_help

SLEEPING, RUNNING = psutil.STATUS_SLEEPING, psutil.STATUS_RUNNING


def test_a_tree_quiet_for_half_a_second_after_sigterm_waits_no_longer():
    """A real vLLM API server uses its 20 ms of SIGTERM in the first 0.1 s and then sleeps for good: a second's
    wait for it was most of a stall's kill, past the second after threshold + one scrape the watch promises."""
    assert waiting_cannot_help([SLEEPING, SLEEPING], 0.5)


def test_a_tree_that_used_cpu_just_now_is_waited_for():
    assert not waiting_cannot_help([SLEEPING], 0.45)
    assert not waiting_cannot_help([RUNNING, psutil.STATUS_STOPPED], 0.0)


def test_every_process_stopped_waits_no_longer_at_once():
    """A ptrace stop: SIGCONT cannot wake it, so no grace can help."""
    assert waiting_cannot_help([psutil.STATUS_TRACING_STOP, psutil.STATUS_STOPPED], 0.0)
