"""One page per incident, through the real alerter, real apprise and a real loopback receiver: the first page,
then follow-ups on the same incident ("restarting", "back") that reach the pager the first page reached, each in
its own tone; Markdown to the JSON target, plain text to ntfy (whose apprise plugin takes text only)."""

import asyncio
import json
import time

from gpuwarden.alert.alerter import Alerter
from gpuwarden.alert.context import Context
from gpuwarden.alert.targets import build
from gpuwarden.config.settings import AlertsConfig
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.core.model import Event, Severity
from gpuwarden.store.sqlite import Store

GPU = "ffff:fe:1f.7"
INCIDENT = "20261204-031207-engine_stall"


def event(kind, severity, message, **evidence):
    return Event(kind, severity, message, time.time(), gpu=GPU, engine="qwen-72b",
                 evidence={"incident": INCIDENT, **evidence})


def test_a_stall_kill_restart_and_back_is_one_page_and_its_follow_ups(tmp_path, receiver):
    config = AlertsConfig.validate({
        "hostname": "vm", "group_window": 0.3, "retry_initial": 0.2, "retry_max": 0.5, "target": [
            {"url": f"json://127.0.0.1:{receiver.port}/pager", "min_severity": "critical"},
            {"url": f"ntfy://127.0.0.1:{receiver.port}/phone", "min_severity": "critical"}]})
    store = Store(tmp_path / "gpuwarden.db")
    context = Context("vm", {GPU: (0, "Radeon AI PRO R9700")}, {"qwen-72b": frozenset({GPU})})
    steps = [
        [event("engine_stall", Severity.CRITICAL, "qwen-72b: 4 request(s) running and no token processed for 120 s",
               figures={"stalled_seconds": 120.0, "running": 4}, decision=[
                   {"action": "restart", "engine": "qwen-72b", "reason": "stalled", "by_hand": False,
                    "dry_run": False}]),
         event("engine_killed", Severity.CRITICAL, "killed qwen-72b: 3 processes (stalled)")],
        [event("engine_stall", Severity.CRITICAL, "qwen-72b: still stalled")],  # the same cause: no news
        [event("engine_restarting", Severity.WARNING, "restarting qwen-72b through its unit vllm-qwen.service")],
        [event("engine_back", Severity.INFO, "qwen-72b back: first completion 41 s after the kill",
               seconds_since_kill=41.2)],
    ]

    async def main():
        alerter = Alerter(config, build(config), store, SelfMetrics(), incidents_dir=tmp_path / "incidents",
                          context=lambda: context)
        task = asyncio.create_task(alerter.run())
        for events in steps:
            alerter.submit(events, store.add_events(events))
            await asyncio.sleep(0.6)  # past the group window: each step its own message, if it is news
        for _ in range(200):
            if len(receiver.received) >= 6:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # nothing more may come
        task.cancel()

    folder = tmp_path / "incidents" / INCIDENT
    folder.mkdir(parents=True)
    (folder / "render-error.txt").write_text("no picture in this test\n")  # ntfy would wait for it
    asyncio.run(main())
    assert len(receiver.received) == 6, [r["path"] for r in receiver.received]
    pager = receiver.json_bodies("/pager")
    assert [(b["title"], b["type"]) for b in pager] == [
        ("vm: engine qwen-72b killed — stalled 2 min with 4 requests running", "failure"),
        ("vm: engine qwen-72b restarting — stalled 2 min with 4 requests running", "warning"),
        ("vm: engine qwen-72b back — first completion 41 s after the kill", "success")]
    assert "**Decision**\n- kill and restart qwen-72b: stalled." in pager[0]["message"]
    assert "And 1 more event of this incident" in pager[1]["message"]  # the repeat, counted, not paged
    assert f"**Incident report**: `{tmp_path / 'incidents' / INCIDENT}` (" in pager[2]["message"]
    phones = [r for r in receiver.received if not r["path"].startswith("/pager")]
    phone = [json.loads(r["body"])["message"] for r in phones]
    # each page rings as urgently as it is: the kill through Do Not Disturb, "restarting" high, "back" as usual
    assert [(r["headers"].get("X-Priority"), r["headers"].get("X-Tags")) for r in phones] == [
        ("max", "rotating_light"), ("high", "warning"), (None, "white_check_mark")]
    assert len(phone) == 3 and all("**" not in text and "`" not in text for text in phone)
    assert "Decision:\n  - kill and restart qwen-72b: stalled." in phone[0]
    store.close()
