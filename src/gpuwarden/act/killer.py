"""Kill a resolved set of processes as systemd stops a unit: SIGTERM then SIGCONT to every process (a stopped
process acts on SIGTERM only once continued), a grace period for those that can act on it, SIGKILL for what
is left, then confirm. A zombie or a vanished process counts as gone.

The grace is cut short when waiting cannot help (`waiting_cannot_help`): when every process left is stopped (a
thread held in a ptrace stop: SIGCONT cannot wake it), or when the whole tree has used no CPU for half a second
and none is in an uninterruptible wait — nothing is shutting down, so something waits for what the stuck engine
will never give (a real vLLM's API server waits after SIGTERM for its open requests, which a stalled engine never
ends).

Synchronous (psutil waits): run it off the event loop. Only processes that `is_killable` accepts are touched.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass

import psutil

from gpuwarden.core.counts import plural
from gpuwarden.engine.processes import is_killable, is_running


@dataclass(frozen=True, eq=False, repr=False)
class KillReport:
    """What a kill did to each process of the tree."""

    terminated: list[str]  # "pid name" that exited after SIGTERM
    killed: list[str]  # needed SIGKILL
    survivors: list[str]  # still alive after SIGKILL (D state?)
    dry_run: bool

    @property
    def count(self) -> int:
        return len(self.terminated) + len(self.killed)

    def summary(self, engine: str) -> str:
        if self.dry_run:
            return (f"dry run: would kill {engine}: {plural(len(self.terminated), 'process')} "
                    f"({', '.join(self.terminated)})")
        text = f"killed {engine}: {plural(self.count, 'process')}"
        if self.killed:
            text += f" ({len(self.killed)} needed SIGKILL)"
        if self.survivors:
            text += f"; {len(self.survivors)} survived SIGKILL: {', '.join(self.survivors)}"
        return text


def describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {proc.name()}"
    except psutil.Error:
        return str(proc.pid)


def kill(procs: list[psutil.Process], grace: float, dry_run: bool = False) -> KillReport:
    procs = [p for p in procs if is_killable(p)]
    if dry_run:
        return KillReport([describe(p) for p in procs], [], [], True)
    names = {p.pid: describe(p) for p in procs}
    for sig in (signal.SIGTERM, signal.SIGCONT):
        for proc in procs:
            _signal(proc, sig)
    gone, alive = _wait(procs, grace, until_stuck=True)
    for proc in alive:
        _signal(proc, signal.SIGKILL)
    dead, survivors = _wait(alive, 5.0)
    return KillReport([names[p.pid] for p in gone], [names[p.pid] for p in dead],
                      [names[p.pid] for p in survivors], False)


def _wait(procs: list[psutil.Process], timeout: float,
          until_stuck: bool = False) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """(gone, alive) after at most `timeout`, or, when `until_stuck`, as soon as waiting cannot help the live
    ones (see the module's docstring). A zombie is gone: it waits only for its parent to reap it."""
    now = time.monotonic()
    deadline, quiet_since, cpu = now + timeout, now, _cpu(procs)
    alive = list(procs)
    while True:
        time.sleep(0.05)
        now = time.monotonic()
        alive = [p for p in alive if is_running(p)]
        if not alive or now >= deadline:
            break
        if until_stuck:
            states, spent = [_status(p) for p in alive], _cpu(alive)
            if _spun(cpu, spent) or psutil.STATUS_DISK_SLEEP in states:
                quiet_since = now
            cpu = spent
            if waiting_cannot_help(states, now - quiet_since):
                break
    return [p for p in procs if p not in alive], alive


# Seconds without CPU use after SIGTERM after which a tree is taken to wait for nothing. A process that acts on
# SIGTERM does so at once: a real vLLM tree's engine processes exit within 0.3 s and its API server uses its
# 20 ms in the first 0.1 s, then sleeps for good. A whole second of that wait was most of what a stall's kill
# took, past the second after threshold + one scrape that the stall clock promises.
QUIET = 0.5
_STOPPED = {psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP}


def waiting_cannot_help(states: list[str], quiet_for: float) -> bool:
    """`states`: each live process's (psutil's names); `quiet_for`: seconds since the tree last used CPU or had
    a process in an uninterruptible wait. True: every process left is stopped, or the tree went quiet."""
    return all(s in _STOPPED for s in states) or quiet_for >= QUIET


def _status(proc: psutil.Process) -> str:
    try:
        return proc.status()
    except psutil.Error:
        return psutil.STATUS_DEAD


def _cpu(procs: list[psutil.Process]) -> dict[int, float]:
    """Each process's CPU seconds so far, by pid (psutil's Process checks the pid is still the same process)."""
    spent = {}
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        spent[proc.pid] = times.user + times.system
    return spent


def _spun(before: dict[int, float], now: dict[int, float]) -> bool:
    """Did a process that was there at both looks use CPU between them? Compared per process: summed, a child
    that exits takes its seconds out of the total, and a server that still spins looked quiet."""
    return any(now[pid] > seconds for pid, seconds in before.items() if pid in now)


def _signal(proc: psutil.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)  # psutil checks the pid still names the same process (start time)
    except psutil.NoSuchProcess:
        pass

