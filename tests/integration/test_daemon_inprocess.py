"""The daemon's health component, wired to its hub and a real store, with a running event loop, in this process."""

import asyncio
import time

from inprocess import daemon_in, running

from gpuwarden.store.sqlite import Store


def test_loop_lag_monitor_reports_a_blocked_loop(tmp_path):
    daemon = daemon_in(tmp_path, 'loop_lag_warn = "100ms"')

    async def scenario():
        async with running(daemon):
            await asyncio.sleep(0.3)
            time.sleep(0.8)  # a blocking call on the loop, as a hung sysfs read would be
            await asyncio.sleep(0.6)

    asyncio.run(scenario())
    [event] = [e for e in Store(tmp_path / "gpuwarden.db").events() if e["kind"] == "watchdog_error"
               and "event loop" in e["message"]]
    assert "event loop was blocked" in event["message"]
    assert event["evidence"]["loop_lag_seconds"] >= 0.3  # the block, less up to one probe interval
    assert daemon.metrics.snapshot()["gpuwarden_loop_blocked_total"][()] == 1


def test_a_crashing_component_is_recorded_as_an_event(tmp_path):
    daemon = daemon_in(tmp_path)

    async def scenario():
        async with running(daemon):
            daemon.supervisor._on_crash("kernel", PermissionError("/dev/kmsg: Operation not permitted"))

    asyncio.run(scenario())
    [event] = [e for e in Store(tmp_path / "gpuwarden.db").events() if e["message"].startswith("component kernel")]
    assert (event["kind"], event["severity"]) == ("watchdog_error", "warning")
    assert "component kernel failed" in event["message"]
