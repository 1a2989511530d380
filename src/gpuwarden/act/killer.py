"""Kill a resolved set of processes as systemd stops a unit: SIGTERM then SIGCONT to every process (a stopped
process acts on SIGTERM only once continued), a grace period for those that can act on it, SIGKILL for what
is left, then confirm. A process that cannot act on SIGTERM (still stopped after SIGCONT, as one held in a
ptrace stop is) gets SIGKILL without waiting out the grace; a zombie or a vanished one counts as gone.

Synchronous (psutil waits): run it off the event loop. Only processes that `is_killable` accepts are touched.
"""

from __future__ import annotations

import signal
import time
from collections import deque
from dataclasses import dataclass

import psutil

from gpuwarden.engine.processes import is_killable, is_running


@dataclass(frozen=True)
class KillReport:
    terminated: list[str]  # "pid name" that exited after SIGTERM
    killed: list[str]  # needed SIGKILL
    survivors: list[str]  # still alive after SIGKILL (D state?)
    dry_run: bool

    @property
    def count(self) -> int:
        return len(self.terminated) + len(self.killed)

    def summary(self, engine: str) -> str:
        if self.dry_run:
            return f"dry run: would kill {engine}: {len(self.terminated)} processes ({', '.join(self.terminated)})"
        text = f"killed {engine}: {self.count} processes"
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
    """(gone, alive) after at most `timeout`, or as soon as every live one is stopped when `until_stuck`
    (waiting longer cannot help it). A zombie is gone: it waits only for its parent to reap it."""
    deadline = time.monotonic() + timeout
    alive = list(procs)
    while True:
        time.sleep(0.05)
        alive = [p for p in alive if is_running(p)]
        if not alive or time.monotonic() >= deadline or (until_stuck and all(_stopped(p) for p in alive)):
            return [p for p in procs if p not in alive], alive


_STOPPED = {psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP}


def _stopped(proc: psutil.Process) -> bool:
    try:
        return proc.status() in _STOPPED
    except psutil.Error:
        return False


def _signal(proc: psutil.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)  # psutil checks the pid still names the same process (start time)
    except psutil.NoSuchProcess:
        pass


class KillBudget:
    """At most `limit` kills per `window` seconds for one engine; beyond it gpuwarden alerts instead."""

    def __init__(self, limit: int = 3, window: float = 3600.0) -> None:
        self.limit, self.window = limit, window
        self._kills: deque[float] = deque()

    def allow(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        while self._kills and now - self._kills[0] > self.window:
            self._kills.popleft()
        return len(self._kills) < self.limit

    def spend(self, now: float | None = None) -> None:
        self._kills.append(time.monotonic() if now is None else now)
