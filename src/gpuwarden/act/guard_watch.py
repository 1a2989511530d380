"""The guard component: keep the recovery guard on every GPU while the daemon runs, and say when it was lost."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from gpuwarden.act.guard import Guard, GuardError, paths_for, status
from gpuwarden.config.settings import GuardConfig
from gpuwarden.core import families
from gpuwarden.core.counts import plural
from gpuwarden.core.model import Event, Severity, Sink
from gpuwarden.runtime.offloop import Busy, OffLoop

log = logging.getLogger(__name__)
_GUARD = OffLoop("guard", limit=2)  # sysfs reads and bind mounts: a hung sysfs holds these two only
_GUARD_DEADLINE = 30.0


class GuardWatch:
    name = "guard"

    def __init__(self, config: GuardConfig, sysfs_root: Path, devices: Callable[[], list[str]], sink: Sink) -> None:
        self.config, self.sysfs_root, self.devices, self.sink = config, sysfs_root, devices, sink
        self.recheck = asyncio.Event()

    async def run(self) -> None:
        try:
            guard = Guard.new(self.sysfs_root)
        except GuardError as exc:
            log.error("recovery guard not applied: %s", exc)
            return
        try:
            while True:
                paths = paths_for(self.devices(), self.sysfs_root)
                try:
                    await self._verify(guard, paths)
                except (Busy, TimeoutError):  # a hung sysfs: its thread still runs; the next round tries again
                    log.warning("verifying the recovery guard took longer than %.0f s", _GUARD_DEADLINE)
                self.recheck.clear()
                try:
                    await asyncio.wait_for(self.recheck.wait(), self.config.verify_interval)
                except TimeoutError:
                    pass
        finally:
            released = guard.release_all()
            log.info("recovery guard released from %d file(s)", len(released))

    async def _verify(self, guard: Guard, paths: list[Path]) -> None:
        lost = await _GUARD.run("ensure", _GUARD_DEADLINE, guard.ensure, paths)
        if lost:
            self.sink.record([Event(
                "guard_lost", Severity.WARNING,
                f"the recovery guard on {plural(len(lost), 'file')} was gone (driver reload, PCI rescan, or an "
                "umount) and is applied again", time.time(), evidence={"paths": [str(p) for p in lost]})])
        states = await _GUARD.run("status", _GUARD_DEADLINE, status, paths, self.sysfs_root)
        intact = sum(ok for _, ok in states)
        self.sink.metric(families.GUARD_PATHS, intact, "intact")
        self.sink.metric(families.GUARD_PATHS, len(paths) - intact, "missing")
