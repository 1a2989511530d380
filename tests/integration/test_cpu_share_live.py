"""A spinning engine process on a busy box: two real spinners pinned to one core each get about half of it. The
share the engine watch judges "spinning" on counts the time a process waits on a run queue too, so a spin is a
spin whatever else the box runs (CI's test runs read 47-74 % for a spinning child on CPU time alone)."""

import os
import subprocess
import sys
import time

import psutil

from gpuwarden.engine.processes import Tracker
from gpuwarden.engine.watch import SPINNING_PERCENT

SPIN = "while True: pass"


def test_a_spinner_sharing_its_core_is_still_read_as_spinning():
    core = {min(os.sched_getaffinity(0))}
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(2)]
    try:
        for spinner in spinners:
            os.sched_setaffinity(spinner.pid, core)
        watched, tracker = psutil.Process(spinners[0].pid), Tracker()
        tracker.cpu_percents([watched])
        cpu_before = sum(watched.cpu_times()[:2])
        started = time.monotonic()
        time.sleep(1.5)
        [share] = tracker.cpu_percents([watched]).values()
        cpu_share = 100 * (sum(watched.cpu_times()[:2]) - cpu_before) / (time.monotonic() - started)
        assert cpu_share < SPINNING_PERCENT, f"it had the core to itself ({cpu_share:.0f} %): no contention made"
        assert share >= SPINNING_PERCENT, f"read {share:.0f} % ({cpu_share:.0f} % of it on the CPU)"
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def test_a_sleeping_process_is_not_read_as_busy():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watched, tracker = psutil.Process(sleeper.pid), Tracker()
        time.sleep(0.3)  # its start-up is past
        tracker.cpu_percents([watched])
        time.sleep(1.2)
        [share] = tracker.cpu_percents([watched]).values()
        assert share < 5
    finally:
        sleeper.kill()
        sleeper.wait()
