"""The Alertmanager channel against the real `prometheus-alertmanager` on loopback: a kill incident becomes
active alerts labelled by kind, severity, host, GPU, engine and incident; the engine back ends them (endsAt),
and Alertmanager's own webhook says "resolved". Its answers decide the outbox's retry: a body it refuses is
not sent again, an Alertmanager that is down is."""

import asyncio
import json
import shutil
import subprocess
import time
from datetime import datetime

import httpx
import pytest
from helpers import GPUWARDEN, free_port, wait_for

from gpuwarden.alert.alerter import Alerter
from gpuwarden.alert.alertmanager import AlertmanagerChannel
from gpuwarden.alert.channel import Alert
from gpuwarden.alert.context import Context
from gpuwarden.alert.targets import build
from gpuwarden.config.settings import AlertsConfig
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.core.model import Event, Severity
from gpuwarden.store.sqlite import Store

pytestmark = pytest.mark.skipif(not shutil.which("prometheus-alertmanager"), reason="needs prometheus-alertmanager")

GPU = "ffff:fe:1f.7"
INCIDENT = "20261204-031207-engine_stall"


def start_alertmanager(tmp_path, receiver, resolve_timeout=None):
    """A real Alertmanager whose one route is a webhook to the test's receiver, resolutions included."""
    port = free_port()
    config = tmp_path / "alertmanager.yml"
    config.write_text(
        (f"global:\n  resolve_timeout: {resolve_timeout}\n" if resolve_timeout else "") +
        "route:\n  receiver: hook\n  group_by: [incident]\n  group_wait: 100ms\n  group_interval: 1s\n"
        "  repeat_interval: 1h\nreceivers:\n  - name: hook\n    webhook_configs:\n"
        f"      - url: http://127.0.0.1:{receiver.port}/am\n        send_resolved: true\n")
    process = subprocess.Popen(
        ["prometheus-alertmanager", f"--config.file={config}", f"--storage.path={tmp_path / 'am-data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"

    def ready():
        assert process.poll() is None, process.stderr.read().decode()
        try:
            return httpx.get(f"{url}/-/ready", timeout=1).is_success
        except httpx.HTTPError:
            return False
    wait_for(ready, timeout=30, what="alertmanager ready")
    return port, process


@pytest.fixture
def alertmanager(tmp_path, receiver):
    port, process = start_alertmanager(tmp_path, receiver)
    yield port
    process.terminate()
    process.wait(10)


@pytest.fixture
def forgetful_alertmanager(tmp_path, receiver):
    """One that resolves an alert 2 s after it was last sent (resolve_timeout; 5 m by default)."""
    port, process = start_alertmanager(tmp_path, receiver, "2s")
    yield port
    process.terminate()
    process.wait(10)


def event(kind, severity, message, **evidence):
    return Event(kind, severity, message, time.time(), gpu=GPU, engine="qwen-72b",
                 evidence={"incident": INCIDENT, **evidence})


def active(port, matcher=f"incident={INCIDENT}"):
    """Alertmanager's active alerts, as amtool (its own client) lists them: labels of each."""
    out = subprocess.run(["amtool", "alert", "query", "-o", "json", f"--alertmanager.url=http://127.0.0.1:{port}",
                          matcher], capture_output=True, text=True, timeout=30, check=True).stdout
    return [a["labels"] for a in json.loads(out)]


async def until(predicate, what):
    for _ in range(300):
        if value := await asyncio.to_thread(predicate):  # amtool blocks: off the test loop
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within 30 s: {what}")


def test_a_kill_incident_fires_in_alertmanager_and_resolves_when_the_engine_is_back(tmp_path, alertmanager,
                                                                                      receiver):
    config = AlertsConfig.validate({
        "hostname": "vm", "group_window": 0.3, "retry_initial": 0.2, "retry_max": 0.5,
        "target": [{"url": f"alertmanager://127.0.0.1:{alertmanager}", "name": "am"}]})
    store = Store(tmp_path / "gpuwarden.db")
    context = Context("vm", {GPU: (0, "Radeon AI PRO R9700")}, {"qwen-72b": frozenset({GPU})})
    fired = [event("engine_stall", Severity.CRITICAL, "qwen-72b: 4 request(s) running and no token for 120 s",
                   decision=[{"action": "restart", "engine": "qwen-72b", "reason": "stalled", "by_hand": False,
                              "dry_run": False}]),
             event("engine_killed", Severity.CRITICAL, "killed qwen-72b: 3 processes (stalled)")]
    back = [event("engine_back", Severity.INFO, "qwen-72b back: first completion 41 s after the kill")]
    seen = {}

    async def main():
        alerter = Alerter(config, build(config), store, SelfMetrics(), incidents_dir=tmp_path / "incidents",
                          context=lambda: context)
        task = asyncio.create_task(alerter.run())
        alerter.submit(fired, store.add_events(fired))
        seen["firing"] = await until(lambda: len(active(alertmanager)) == 2 and active(alertmanager), "2 active")
        alerter.submit(back, store.add_events(back))
        await until(lambda: not active(alertmanager), "no active alert of the incident")
        await until(lambda: any(b["status"] == "resolved" for b in receiver.json_bodies("/am")), "a resolved hook")
        task.cancel()

    asyncio.run(main())
    common = {"severity": "critical", "host": "vm", "gpu": GPU, "engine": "qwen-72b", "incident": INCIDENT}
    assert sorted(seen["firing"], key=lambda labels: labels["alertname"]) == [
        {"alertname": "engine_killed", **common}, {"alertname": "engine_stall", **common}]
    hooks = receiver.json_bodies("/am")
    assert hooks[0]["status"] == "firing"
    resolved = [a for b in hooks if b["status"] == "resolved" for a in b["alerts"]]
    assert {a["labels"]["alertname"] for a in resolved} >= {"engine_killed", "engine_stall"}
    assert all(a["endsAt"] > a["startsAt"] for a in resolved)
    assert resolved[0]["annotations"]["summary"].startswith("vm: engine qwen-72b back")
    assert store.outbox() == []  # delivered: nothing left to retry
    store.close()


def test_an_open_incident_stays_in_an_alertmanager_that_forgets_until_it_ends(tmp_path, forgetful_alertmanager,
                                                                            receiver):
    """resolve_timeout 2 s, alertmanager_resend 0.5 s. A one-off event (a page fault, no condition) is sent once
    and expires there; the alerts of the open incidents, sent at the same time, are sent again and stay active
    past it. The engine back ends its incident's alerts; an incident that closes without an all-clear has its
    alerts ended too (endsAt), not left to expire; neither comes back at a later re-send."""
    port = forgetful_alertmanager
    config = AlertsConfig.validate({
        "hostname": "vm", "group_window": 0.3, "retry_initial": 0.2, "retry_max": 0.5, "alertmanager_resend": 0.5,
        "target": [{"url": f"alertmanager://127.0.0.1:{port}", "name": "am"}]})
    store = Store(tmp_path / "gpuwarden.db")
    other = "20261204-031300-reset_failed"
    is_open = {INCIDENT: True, other: True}
    fired = [event("engine_stall", Severity.CRITICAL, "qwen-72b: 4 request(s) running and no token for 120 s"),
             event("engine_killed", Severity.CRITICAL, "killed qwen-72b: 3 processes (stalled)"),
             Event("reset_failed", Severity.CRITICAL, "the GPU reset failed", time.time(), gpu="ffff:fe:1f.6",
                   evidence={"incident": other}),
             Event("page_fault", Severity.WARNING, "a page fault", time.time(), gpu="ffff:fe:1f.5")]
    back = [event("engine_back", Severity.INFO, "qwen-72b back: first completion 41 s after the kill")]

    async def main():
        alerter = Alerter(config, build(config), store, SelfMetrics(), incidents_dir=tmp_path / "incidents",
                          incident_open=is_open.get)
        task = asyncio.create_task(alerter.run())
        alerter.submit(fired, store.add_events(fired))
        await until(lambda: active(port, "alertname=page_fault"), "the one-off event active")
        await until(lambda: not active(port, "alertname=page_fault"), "the one-off event expired (2 s)")
        assert len(active(port)) == 2 and active(port, f"incident={other}")  # sent before it, sent again since
        alerter.submit(back, store.add_events(back))
        await until(lambda: not active(port), "the engine's incident ended by its all-clear")
        is_open[other] = False  # closed without one
        await until(lambda: not active(port, f"incident={other}"), "the other incident's alerts ended")
        await until(lambda: any(a["labels"].get("incident") == other for b in receiver.json_bodies("/am")
                                if b["status"] == "resolved" for a in b["alerts"]), "its resolved hook")
        firing = alerter.targets[0].channel.firing
        assert firing.items == {} and firing.next is None  # nothing left to send again
        task.cancel()

    asyncio.run(main())
    resolved = [a for b in receiver.json_bodies("/am") if b["status"] == "resolved" for a in b["alerts"]]
    [gone] = [a for a in resolved if a["labels"].get("incident") == other]
    assert gone["annotations"]["summary"].startswith("vm: GPU") and gone["endsAt"] > gone["startsAt"]
    store.close()


def test_the_channels_answer_decides_the_retry(alertmanager):
    bad = Alert("t", "b", "b", "info", False, identities=[{"labels": {"alertname": "x", "bad-name": "y"},
                                                           "starts": time.time()}])
    retry, error = asyncio.run(AlertmanagerChannel(f"alertmanager://127.0.0.1:{alertmanager}").notify(bad, 5))
    assert (retry, error.split(":")[0]) == (False, "Alertmanager answered 400")  # refused: sending again cannot help
    good = Alert("t", "b", "b", "info", False, identities=[{"labels": {"alertname": "x"}, "starts": time.time()}])
    assert asyncio.run(AlertmanagerChannel(f"alertmanager://127.0.0.1:{alertmanager}").notify(good, 5)) == (False,
                                                                                                          None)
    retry, error = asyncio.run(AlertmanagerChannel(f"alertmanager://127.0.0.1:{free_port()}").notify(good, 5))
    assert retry and "ConnectError" in error  # down: the outbox tries again later


def test_test_alert_reaches_alertmanager(tmp_path, alertmanager):
    config = tmp_path / "gw.toml"
    config.write_text(f'[alerts]\nhostname = "vm"\n\n[[alerts.target]]\nname = "am"\n'
                      f'url = "alertmanager://127.0.0.1:{alertmanager}"\n')
    result = subprocess.run([*GPUWARDEN, "test-alert", "--config", str(config)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "am: ok", result.stdout + result.stderr
    out = subprocess.run(["amtool", "alert", "query", "-o", "json", f"--alertmanager.url=http://127.0.0.1:{alertmanager}",
                          "alertname=test_alert"], capture_output=True, text=True, timeout=30, check=True).stdout
    assert [a["labels"] for a in json.loads(out)] == [{"alertname": "test_alert", "severity": "info", "host": "vm"}]


def test_a_restarted_daemon_keeps_its_open_incident_alive_in_alertmanager(daemon_factory, fake_engine,
                                                                          forgetful_alertmanager):
    """The real daemon kills a stalled fake engine (an open incident: the engine stays down) and is restarted.
    The new process holds the incident's alerts firing again from the store, so Alertmanager (resolve_timeout
    2 s) still has them active, last updated well past 2 s after the restart: sent by the new process."""
    port = forgetful_alertmanager
    engine = fake_engine("progress")
    d = daemon_factory(f'[[engine]]\nname = "fake"\nmetrics_url = "{engine.url}"\nscrape_interval = "0.5s"\n'
                       'min_stall = "2s"\nkill_grace = "1s"\n[alerts]\nhostname = "vm"\ngroup_window = "300ms"\n'
                       f'alertmanager_resend = "500ms"\n[[alerts.target]]\nname = "am"\n'
                       f'url = "alertmanager://127.0.0.1:{port}"\n').start()
    d.wait_serving()
    engine.set_mode("stall")
    wait_for(lambda: active(port, "alertname=engine_killed"), 30, interval=0.2, what="the kill in Alertmanager")
    assert d.stop() == 0
    restarted = time.time()
    d.start()
    d.wait_serving()

    def updated_since_restart():
        alerts = httpx.get(f"http://127.0.0.1:{port}/api/v2/alerts", params={"filter": "engine=fake"}, timeout=5)
        return [a for a in alerts.json() if a["status"]["state"] == "active"
                and datetime.fromisoformat(a["updatedAt"]).timestamp() > restarted + 3]
    found = wait_for(updated_since_restart, 30, interval=0.3, what="the incident's alerts sent by the new process")
    assert {a["labels"]["alertname"] for a in found} >= {"engine_killed"}
    assert d.stop() == 0
