"""The outbox's counts for the exporter (gpuwarden_alerts_pending) follow the outbox as it changes: the alerter
sleeps until something is due, with no periodic wake-up to count them (it had one every 5 s)."""

import asyncio
import socket
import time

from gpuwarden.alert.alerter import Alerter
from gpuwarden.alert.targets import build
from gpuwarden.config.settings import AlertsConfig
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.core.model import Event, Severity
from gpuwarden.store.sqlite import Store


def test_an_alert_waiting_for_a_dead_target_is_counted_at_once(tmp_path):
    store = Store(tmp_path / "gpuwarden.db")
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: every connection to it is refused, and it stays ours
    config = AlertsConfig.validate({"hostname": "vm", "group_window": "100ms",
                                    "target": [{"url": f"json://127.0.0.1:{dead.getsockname()[1]}", "name": "dead"}]})
    metrics = SelfMetrics()

    def pending() -> float | None:
        return metrics.snapshot().get("gpuwarden_alerts_pending", {}).get(("dead", "critical"))

    async def main():
        alerter = Alerter(config, build(config), store, metrics)
        running = asyncio.create_task(alerter.run())
        try:
            while pending() is None:  # the component's start counts what its outbox holds: nothing
                await asyncio.sleep(0.01)
            before = pending()
            event = Event("gpu_lost", Severity.CRITICAL, "GPU fell off the bus", time.time(), gpu="ffff:fe:1f.7")
            alerter.submit([event], store.add_events([event]))
            started = time.monotonic()
            while pending() != 1.0 and time.monotonic() - started < 4.0:  # the old export came every 5 s
                await asyncio.sleep(0.01)
            return before, pending(), alerter.pending()
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)

    before, after, outbox = asyncio.run(main())
    assert before == 0.0
    assert outbox == {"dead": 1}  # refused, kept for its next try
    assert after == 1.0
    store.close()
    dead.close()


def test_a_target_a_reload_removed_leaves_no_pending_series(tmp_path):
    """A reload stops the components, configures the alerter and runs it again (daemon.py): the removed target's
    counts go with it, the kept one's stay."""
    store = Store(tmp_path / "gpuwarden.db")
    both = AlertsConfig.validate({"hostname": "vm", "target": [{"url": "json://127.0.0.1:9", "name": "gone"},
                                                                {"url": "json://127.0.0.1:9", "name": "kept"}]})
    kept = AlertsConfig.validate({"hostname": "vm", "target": [{"url": "json://127.0.0.1:9", "name": "kept"}]})
    metrics = SelfMetrics()

    def targets_counted() -> set[str]:
        return {labels[0] for labels in metrics.snapshot().get("gpuwarden_alerts_pending", {})}

    async def run_for(alerter: Alerter) -> None:
        running = asyncio.create_task(alerter.run())
        await asyncio.sleep(0.2)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)

    async def main():
        alerter = Alerter(both, build(both), store, metrics)
        await run_for(alerter)
        before = targets_counted()
        alerter.configure(kept, build(kept))
        await run_for(alerter)
        return before, targets_counted()

    assert asyncio.run(main()) == ({"gone", "kept"}, {"kept"})
    store.close()
