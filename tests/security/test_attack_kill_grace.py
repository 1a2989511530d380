"""Issue 24, finding 8: with kill_grace = 5s, a child that exits on SIGTERM took its CPU seconds out of the
tree's sum, and the still-spinning server looked quiet for a second: SIGKILL came 1.0 s after SIGTERM. The quiet
rule now compares each process that was there at both looks, so the grace runs in full while one spins.
(No GPU needed: the tree is a spinning server that ignores SIGTERM and a spinning worker that obeys it.)"""

import subprocess
import sys
import time

import psutil

from gpuwarden.act.killer import kill

GRACE = 5.0
TREE = """
import signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
obey = lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)
child = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=obey)  # a worker, busy too
print(child.pid, flush=True)
while True:
    child.poll()  # reaps the child once it exits: it leaves the tree, its CPU with it
"""


def test_a_child_exiting_in_the_grace_does_not_cut_it_short_while_the_server_spins():
    server = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        child = int(server.stdout.readline())
        procs = [psutil.Process(server.pid), psutil.Process(child)]
        time.sleep(2.0)  # both have spun a while: the worker's seconds are what its exit takes out of a sum
        started = time.monotonic()
        report = kill(procs, GRACE)
        took = time.monotonic() - started
        assert [t.split()[0] for t in report.terminated] == [str(child)]
        assert [k.split()[0] for k in report.killed] == [str(server.pid)]
        assert took >= GRACE, f"SIGKILL after {took:.2f} s, grace {GRACE} s"  # a bound, not a speed
    finally:
        server.kill()
        server.wait()


def test_a_quiet_tree_is_still_cut_short():
    """The rule it fixes stays: a tree that ignores SIGTERM and uses no CPU gets SIGKILL before the grace ends."""
    quiet = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint(flush=True)\ntime.sleep(600)"],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        quiet.stdout.readline()
        started = time.monotonic()
        report = kill([psutil.Process(quiet.pid)], 30.0)
        assert report.killed and time.monotonic() - started < 30.0
    finally:
        quiet.kill()
        quiet.wait()
