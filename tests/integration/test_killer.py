"""The kill sequence on real processes: SIGTERM then SIGCONT, the grace only for those that can act on it."""

import signal
import subprocess
import sys
import time

import psutil
import pytest
from helpers import wait_for

from gpuwarden.act.killer import kill
from peers.freezer import Freezer, thread_state

GRACE = 60.0  # far longer than any of these kills may take: returning well before it proves no wait

# A process that, like an engine, shuts down on SIGTERM after a short clean-up.
GRACEFUL = [sys.executable, "-c", "import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.2), sys.exit(0)))\n"
            "print('ready', flush=True)\n"
            "while True: time.sleep(1)"]


@pytest.fixture
def graceful():
    made = []

    def start():
        proc = subprocess.Popen(GRACEFUL, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "ready\n"
        made.append(proc)
        return proc
    yield start
    for proc in made:
        proc.kill()
        proc.wait()


def _timed_kill(procs):
    start = time.monotonic()
    report = kill([psutil.Process(p.pid) for p in procs], GRACE)
    return report, time.monotonic() - start


def test_a_stopped_process_is_continued_and_acts_on_sigterm(graceful):
    """SIGTERM alone waits in a stopped process's queue forever: the kill sat out its whole grace."""
    proc = graceful()
    proc.send_signal(signal.SIGSTOP)
    wait_for(lambda: thread_state(proc.pid) == "T", 5, what="the process to stop")
    report, took = _timed_kill([proc])
    assert len(report.terminated) == 1 and not report.killed  # its own SIGTERM handler ran: a clean stop
    assert took < GRACE / 2
    assert proc.wait(5) == 0


@pytest.mark.root
def test_a_process_held_in_a_ptrace_stop_gets_sigkill_without_waiting_the_grace(graceful):
    """SIGCONT cannot wake a ptrace stop (a frozen inference thread): waiting the grace cannot help."""
    frozen, healthy = graceful(), graceful()
    with Freezer(frozen.pid):
        assert thread_state(frozen.pid) == "t"
        report, took = _timed_kill([frozen, healthy])
    assert [e.split()[0] for e in report.killed] == [str(frozen.pid)]
    assert [e.split()[0] for e in report.terminated] == [str(healthy.pid)]
    assert took < GRACE / 2
    frozen.wait(5)  # the freezer (this process) is its tracer and reaps it first: only "gone" can be checked
    assert not psutil.pid_exists(frozen.pid) and healthy.wait(5) == 0


def _ignoring_sigterm(then: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n" + then],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_a_busy_process_that_ignores_sigterm_gets_the_whole_grace_then_sigkill():
    """It uses the CPU: it may be shutting down, so it gets all of its grace."""
    busy = _ignoring_sigterm("while True: pass")
    try:
        start = time.monotonic()
        report = kill([psutil.Process(busy.pid)], grace=3.0)
        assert time.monotonic() - start >= 3.0
        assert len(report.killed) == 1 and not report.survivors
    finally:
        busy.kill()
        busy.wait()


def test_a_tree_that_goes_quiet_after_sigterm_is_killed_without_waiting_the_grace():
    """A real vLLM API server, after SIGTERM, waits for its open requests, which a stalled engine never ends:
    it sleeps and uses no CPU. Nothing is shutting down, so waiting the grace cannot help."""
    waiting = _ignoring_sigterm("time.sleep(600)")
    try:
        report, took = _timed_kill([waiting])
        assert len(report.killed) == 1 and took < GRACE / 2
    finally:
        waiting.kill()
        waiting.wait()

