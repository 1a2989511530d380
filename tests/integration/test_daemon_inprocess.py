"""The daemon's health component, wired to its hub and a real store, with a running event loop, in this process."""

import asyncio
import time

from inprocess import daemon_in, running

from gpuwarden.hub.health import LAG_PROBE
from gpuwarden.runtime.ticks import next_tick
from gpuwarden.store.sqlite import Store


def test_loop_lag_monitor_reports_a_blocked_loop(tmp_path):
    daemon = daemon_in(tmp_path, 'loop_lag_warn = "100ms"')

    async def scenario():
        async with running(daemon):
            loop = asyncio.get_running_loop()
            await asyncio.sleep(0.3)
            # the probe is due on the one-second grid (ticks.py): the block begins 0.3 s before a grid point, so
            # that the probe due there is late by the rest of it, 0.5 s (begun anywhere, by 0 to 0.8 s)
            await asyncio.sleep(next_tick(loop.time() + 0.4, LAG_PROBE) - 0.3 - loop.time())
            time.sleep(0.8)  # a blocking call on the loop, as a hung sysfs read would be
            await asyncio.sleep(0.6)

    asyncio.run(scenario())
    [event] = [e for e in Store(tmp_path / "gpuwarden.db").events() if e["kind"] == "watchdog_error"
               and "event loop" in e["message"]]
    assert "event loop was blocked" in event["message"]
    assert 0.3 <= event["evidence"]["loop_lag_seconds"] <= 0.8 + 0.1  # (a late wake-up: a tenth of slack)
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
