"""The alerter's start: events stored but never alerted before the last stop are alerted, and the events this
run recorded before the alerter first ran (the kernel watch starts first) are not taken for them."""

import asyncio
import logging
import time

from gpuwarden.alert.alerter import Alerter
from gpuwarden.config.settings import AlertsConfig
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.core.model import Event, Severity
from gpuwarden.store.sqlite import Store


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
        await alerter.recover()
        return alerter

    alerter = asyncio.run(main())
    assert "alerting 1 event(s) stored before the last stop" in caplog.text
    keys = alerter.storm._keys
    assert keys[event("watchdog_error").dedupe_key].suppressed == 0  # not counted as a repeat of itself
    assert keys[event("ring_timeout").dedupe_key].suppressed == 0
    store.close()


def test_a_restarted_alerter_resumes_an_open_incidents_page_and_its_firing_alerts(tmp_path):
    """The last run paged an incident that is still open (its row, its alerted events): this run's storm control
    takes its "back" for a follow-up of that page, and the Alertmanager target holds its alerts firing again,
    due at once (they may have expired while gpuwarden was away). A closed incident is not resumed."""
    from gpuwarden.alert.targets import build

    store = Store(tmp_path / "gpuwarden.db")
    now = time.time()
    for name, closed in (("20261204-031207-engine_stall", None), ("20261204-021207-engine_stall", now - 5)):
        stall = Event("engine_stall", Severity.CRITICAL, "vllm stalled", now - 30, engine="vllm",
                      evidence={"incident": name})
        store.mark_alerted(store.add_events([stall]))
        store.save_incident({"id": name, "opened": now - 30, "closed": closed, "kind": "engine_stall",
                             "engines": ["vllm"]})
    config = AlertsConfig.validate({"hostname": "vm", "target": [{"url": "alertmanager://127.0.0.1:9",
                                                                         "name": "am"}]})

    async def main():
        alerter = Alerter(config, build(config), store, SelfMetrics())
        await alerter.recover()
        return alerter

    alerter = asyncio.run(main())
    firing = alerter.targets[0].channel.firing
    [item] = firing.items.values()
    assert item["labels"] == {"alertname": "engine_stall", "severity": "critical", "host": "vm", "engine": "vllm",
                              "incident": "20261204-031207-engine_stall"}
    assert item["annotations"]["summary"].startswith("vm: engine vllm stalled") and firing.next <= time.time()
    assert set(alerter.storm._incidents) == {"20261204-031207-engine_stall"}
    store.close()
