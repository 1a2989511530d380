"""The daemon's health component, wired to its hub and a real store, with a running event loop, in this process."""

import asyncio
import time

from gpuwarden.config import parse
from gpuwarden.daemon import Daemon
from gpuwarden.sdnotify import Notifier
from gpuwarden.store import Store


def test_loop_lag_monitor_reports_a_blocked_loop(tmp_path):
    config = parse(f'[daemon]\nstate_dir = "{tmp_path}"\nloop_lag_warn = "100ms"\n')
    daemon = Daemon(config, None, Notifier({}))
    daemon.hub.store = Store(tmp_path / "gpuwarden.db")

    async def scenario():
        watcher = asyncio.create_task(daemon.health.watch_loop_lag())
        await asyncio.sleep(0.3)
        time.sleep(0.8)  # a blocking call on the loop, as a hung sysfs read would be
        await asyncio.sleep(0.6)
        watcher.cancel()

    asyncio.run(scenario())
    [event] = [e for e in daemon.hub.store.events() if e["kind"] == "watchdog_error"]
    assert "event loop was blocked" in event["message"]
    assert event["evidence"]["loop_lag_seconds"] >= 0.3  # the block, less up to one probe interval
    assert daemon.metrics.snapshot()["gpuwarden_loop_blocked_total"][()] == 1


def test_a_crashing_component_is_recorded_as_an_event(tmp_path):
    config = parse(f'[daemon]\nstate_dir = "{tmp_path}"\n')
    daemon = Daemon(config, None, Notifier({}))
    daemon.hub.store = Store(tmp_path / "gpuwarden.db")
    daemon.health.crashed("kernel", PermissionError("/dev/kmsg: Operation not permitted"))
    [event] = daemon.hub.store.events()
    assert (event["kind"], event["severity"]) == ("watchdog_error", "warning")
    assert "component kernel failed" in event["message"]
