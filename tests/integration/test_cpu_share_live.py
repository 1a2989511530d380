"""A spinning engine process on a busy box: two real spinners pinned to one core each get about half of it. The
share the engine watch judges "spinning" on counts the time a process waits on a run queue too, so a spin is a
spin whatever else the box runs (CI's test runs read 47-74 % for a spinning child on CPU time alone)."""

import os
import subprocess
import sys
import time

import psutil

from gpuwarden.engine.processes import CPU_WINDOW, Tracker, queued_seconds
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


# a process that only sleeps and wakes, at the kernel's lowest priority (SCHED_IDLE, inherited by its threads):
# beside a spinner on its core each wake waits its turn, up to seconds, and runs for microseconds
STARVED = """import os, threading, time
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
def wake():
    while True:
        time.sleep(0.005)
for _ in range(3):
    threading.Thread(target=wake, daemon=True).start()
wake()"""


def test_a_starved_process_that_barely_runs_is_not_read_as_spinning():
    """The kernel adds a thread's wait on a run queue to its schedstat when the wait ends, all at once: a real
    vLLM's EngineCore, starved behind its Worker during a prefill, read 54-98 % with 0-1 % of CPU. Its waits count
    at most QUEUED_PER_RUN times the CPU it got.

    Judged window by window, one look a window as the engine watch looks, over up to WINDOWS windows: every
    window reads under "spinning", and at least one of them had a wait credited that the old reading (run + wait)
    called spinning.
    A single window proved nothing when no wait ended inside it: a wait behind a busy core lasts up to seconds,
    and fc11 read 56 % waiting over one 1.5 s window."""
    core = {min(os.sched_getaffinity(0))}
    spinner = subprocess.Popen([sys.executable, "-c", SPIN])
    starved = subprocess.Popen([sys.executable, "-c", STARVED])
    try:
        for proc in (spinner, starved):
            os.sched_setaffinity(proc.pid, core)
        for task in os.listdir(f"/proc/{starved.pid}/task"):  # a thread started before the pinning
            os.sched_setaffinity(int(task), core)
        time.sleep(0.5)  # its start-up is past
        watched, tracker = psutil.Process(starved.pid), Tracker()

        def reading() -> tuple[float, float, float]:  # its CPU and wait so far, read just before each look
            return time.monotonic(), sum(watched.cpu_times()[:2]), queued_seconds(starved.pid)

        before = reading()
        tracker.cpu_percents([watched])
        old_readings = []
        for _ in range(WINDOWS):
            time.sleep(CPU_WINDOW + 0.05)  # one look a window: the look's window is this one
            now = reading()
            [share] = tracker.cpu_percents([watched]).values()
            elapsed = now[0] - before[0]
            cpu_share, queued_share = 100 * (now[1] - before[1]) / elapsed, 100 * (now[2] - before[2]) / elapsed
            before = now
            assert cpu_share < 10, f"not starved: {cpu_share:.0f} % on the CPU"
            assert share < SPINNING_PERCENT, \
                f"read {share:.0f} % ({cpu_share:.0f} % on the CPU, {queued_share:.0f} % waiting)"
            old_readings.append(cpu_share + queued_share)
            if old_readings[-1] >= SPINNING_PERCENT:
                break  # the old reading (run + wait) called this window spinning; the new one did not
        assert max(old_readings) >= SPINNING_PERCENT, \
            f"no wait credited in {len(old_readings)} windows: old readings {[round(r) for r in old_readings]} %"
    finally:
        for proc in (spinner, starved):
            proc.kill()
            proc.wait()


WINDOWS = 10  # of CPU_WINDOW: waits of a few seconds at most end within them
