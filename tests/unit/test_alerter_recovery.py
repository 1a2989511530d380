"""The alerter's start: events stored but never alerted before the last stop are alerted, and the events this
run recorded before the alerter first ran (the kernel watch starts first) are not taken for them."""

import asyncio
import logging
import time

from gpuwarden.alert.alerter import Alerter
from gpuwarden.config import AlertsConfig
from gpuwarden.exporter import SelfMetrics
from gpuwarden.model import Event, Severity
from gpuwarden.store import Store


def event(kind: str) -> Event:
    return Event(kind, Severity.WARNING, f"{kind} happened", time.time(), gpu="ffff:fe:1f.7")


def test_an_event_submitted_before_the_first_run_is_not_recovered_as_its_own_repeat(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="gpuwarden")
    store = Store(tmp_path / "gpuwarden.db")
    store.add_events([event("ring_timeout")])  # the last run stored it and stopped before alerting it

    async def main():
        alerter = Alerter(AlertsConfig(), [], store, SelfMetrics())
        [now] = store.add_events([event("watchdog_error")])  # this run, before the alerts component started
        alerter.submit([event("watchdog_error")], [now])
        alerter._recover()
        return alerter

    alerter = asyncio.run(main())
    assert "alerting 1 event(s) stored before the last stop" in caplog.text
    keys = alerter.storm._keys
    assert keys[event("watchdog_error").dedupe_key].suppressed == 0  # not counted as a repeat of itself
    assert keys[event("ring_timeout").dedupe_key].suppressed == 0
    store.close()
