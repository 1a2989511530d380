"""The loop-lag gauge shows a block while it lasts (a blocked loop cannot say so itself)."""

import asyncio
import threading
import time

from inprocess import daemon_in, running


def test_the_lag_gauge_grows_during_a_block(tmp_path):
    daemon = daemon_in(tmp_path)
    during: list[float] = []
    blocking = threading.Event()

    def sample():  # what a Prometheus scrape (exporter thread) would read while the loop is blocked
        blocking.wait()
        time.sleep(2.5)
        during.append(daemon.metrics.snapshot()["gpuwarden_loop_lag_seconds"][()])

    async def scenario():
        async with running(daemon):
            await asyncio.sleep(1.2)
            reader = threading.Thread(target=sample)
            reader.start()
            blocking.set()
            time.sleep(3.5)  # a blocking call on the loop, as a hung read would be
            reader.join()

    asyncio.run(scenario())
    assert during[0] >= 1.0  # 2.5 s into a 3.5 s block, less the probe interval (LAG_PROBE, 1 s) at most
