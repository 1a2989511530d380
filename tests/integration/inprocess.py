"""A real gpuwarden Daemon run in this process, on this test's event loop: for tests that look at its parts
while it runs (its health loops, its object graph). The exporter is off unless a port is given for it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from helpers import quiet_discovery

from gpuwarden.config.settings import parse
from gpuwarden.daemon import Daemon
from gpuwarden.runtime.sdnotify import Notifier


def daemon_in(tmp_path, extra: str = "", exporter_port: int | None = None) -> Daemon:
    exporter = f'listen = "127.0.0.1"\nport = {exporter_port}' if exporter_port else "enabled = false"
    config = parse(f'[daemon]\nstate_dir = "{tmp_path}"\n{extra}\n[exporter]\n{exporter}\n{quiet_discovery(extra)}')
    return Daemon(config, None, Notifier({}))


@contextlib.asynccontextmanager
async def running(daemon: Daemon) -> AsyncIterator[Daemon]:
    """The daemon started (its components' tasks began), then stopped in order: the store closed."""
    task = asyncio.create_task(daemon.run())
    for _ in range(1000):  # its start awaits discovery off the loop; bounded, not timed
        await asyncio.sleep(0.01)
        if "hub" in daemon.supervisor._tasks or task.done():
            break
    assert not task.done(), task.exception()
    try:
        yield daemon
    finally:
        daemon.stop()
        await task
