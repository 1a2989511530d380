"""The status page's renderer, pure: what a snapshot shows, escaped, with nothing from elsewhere."""

import re

from gpuwarden.alert.recent import Recent
from gpuwarden.core.model import Event, Severity
from gpuwarden.web import statuspage

NOW = 1_800_000_000.0
EVIL = '<script>alert("x")</script>'


def snapshot(**changes) -> dict:
    snap = {
        "host": "box-1", "version": "0.1.0", "pid": 42, "time": NOW, "started": NOW - 3600,
        "summary": "kernel source kmsg; 1 GPU; 7/7 components up", "loop_lag_seconds": 0.002, "store_error": None,
        "sources": [{"name": "kernel", "up": True, "last_success": NOW - 2, "detail": "kmsg"},
                    {"name": "uevents", "up": False, "last_success": None, "detail": "netlink: EPERM"}],
        "components": [{"name": "engines", "up": True, "restarts": 0}, {"name": "gpus", "up": False, "restarts": 3}],
        "gpus": [{"gpu": "0000:03:00.0", "vendor": "amd", "driver": "amdgpu", "model": "Radeon RX 7900 XTX",
                  "state": "ok", "read_at": NOW - 1, "problems": {}, "throttle": [],
                  "sensors": {"power_watts": 272.0, "temperature_junction_celsius": 67.0, "sclk_hz": 2.5e9,
                              "busy_ratio": 0.93, "vram_used_bytes": 20 * 2**30, "pcie_speed_gts": 16.0,
                              "pcie_width": 16},
                  "limits": {"power_cap_watts": 327.0, "temperature_junction_warn_celsius": 100.0,
                             "temperature_junction_critical_celsius": 110.0, "sclk_max_hz": 2.9e9,
                             "vram_total_bytes": 24 * 2**30, "pcie_max_speed_gts": 16.0, "pcie_max_width": 16}}],
        "engines": [{"name": EVIL, "url": "http://127.0.0.1:8000/metrics", "state": "stalled", "running": 2.0,
                     "waiting": 0.0, "generated_tokens": 1000.0, "progress": 1000.0, "last_progress": NOW - 95,
                     "stall_threshold_seconds": 30.0, "last_answer": NOW - 1, "cpu_ratio": 0.98,
                     "gpus": ["0000:03:00.0"], "processes": 3, "kills_in_window": 0}],
        "incidents": [{"id": "20270115-080000-engine_stall", "opened": NOW - 60, "kind": "engine_stall",
                       "message": f"{EVIL} stalled", "engines": [EVIL], "gpus": [],
                       "conditions": ["engine_stalled:x"], "done": [],
                       "picture": "/incidents/20270115-080000-engine_stall/timeline.png",
                       "decisions": [{"action": "kill", "engine": "vllm", "reason": "stalled for 95 s",
                                      "by_hand": False, "dry_run": True}]}],
    }
    return {**snap, **changes}


def test_it_shows_the_engines_the_gpus_the_incidents_and_the_sources():
    page = statuspage.render(snapshot())
    for shown in ("gpuwarden on box-1", "1 open incident", "20270115-080000-engine_stall", "stalled", "kill vllm",
                  "(dry run)", "stalled for 95 s", "1.6 min ago", "0000:03:00.0", "272 W of 327 W cap",
                  "67 (warn 100, critical 110)", "2500 of 2900 MHz", "93%", "20.0 of 24.0 GiB", "16 GT/s x16",
                  "uevents", "netlink: EPERM", "(3 restarts)", "98% of a core", "up 1.0 h",
                  '<img src="/incidents/20270115-080000-engine_stall/timeline.png"'):
        assert shown in page, shown
    assert 'content="5"' in page and 'name="viewport"' in page


def test_everything_from_outside_is_escaped_and_nothing_is_loaded_from_elsewhere():
    page = statuspage.render(snapshot())
    assert "<script" not in page and "&lt;script&gt;" in page
    assert not re.findall(r'(?:src|href)="(?!/)', page)  # only links to this server's own paths
    assert "@import" not in page and "url(" not in page


def test_an_empty_box_and_a_broken_store_say_so():
    page = statuspage.render(snapshot(engines=[], gpus=[], incidents=[], store_error="disk full"))
    assert "no engine watched" in page and "no GPU found" in page and "no open incident" in page
    assert "unwritable" in page and "disk full" in page


def test_the_page_without_a_snapshot_says_why():
    page = statuspage.unavailable("the daemon's event loop did not answer within 2 s <b>")
    assert "did not answer" in page and "&lt;b&gt;" in page and 'content="5"' in page


def test_an_nvidia_gpu_is_named_as_the_pages_name_it_with_its_own_core_limits():
    """The snapshot of an H100 as gpu/nvidia.py reads it through NVML (no NVIDIA GPU here: the sample is made as
    that reader makes it): its core temperature is shown against the card's own slowdown and shutdown."""
    from types import SimpleNamespace

    from gpuwarden.config.settings import GpuConfig
    from gpuwarden.core.model import GpuSample
    from gpuwarden.hub import snapshot as snap_module

    sample = GpuSample("ffff:fe:1f.7", "nvidia", "NVIDIA H100 80GB HBM3", NOW, temperatures={"gpu": 71.0},
                       temperature_limits={"gpu": (87.0, 92.0)}, power_watts=300.0, power_cap_watts=700.0)
    daemon = SimpleNamespace(
        recorder=SimpleNamespace(latest=lambda: {"ffff:fe:1f.7": sample}), config=SimpleNamespace(gpu=GpuConfig()),
        inventory=SimpleNamespace(seen={"ffff:fe:1e.0", "ffff:fe:1f.7"}, gpus=[SimpleNamespace(
            pci="ffff:fe:1f.7", vendor="nvidia", driver="nvidia")]))
    [row] = snap_module._gpus(daemon)
    assert row["index"] == 1 and row["limits"]["temperature_gpu_warn_celsius"] == 87.0
    assert row["limits"]["temperature_gpu_critical_celsius"] == 89.0  # 3 °C under its shutdown, as the rules judge
    page = statuspage.render(snapshot(gpus=[row]))
    assert "GPU 1 (ffff:fe:1f.7)" in page and "71 (warn 87, critical 89)" in page


def test_the_recent_past_is_shown_and_an_incident_whose_all_clear_went_out_is_green():
    paged = {"20270115-080000-engine_stall": {"title": "box-1: engine vllm back", "first_paged": NOW - 300,
                                              "last_paged": NOW - 30, "all_clear": NOW - 29, "steps": ["x"]}}
    targets = [{"name": "pager", "last_sent": NOW - 29, "last_title": "box-1: engine vllm back", "last_failure":
                NOW - 200, "last_error": "HTTP 503", "failures": 2, "undeliverable": 0, "pending": 0}]
    events = [{"time": NOW - 31, "kind": "engine_back", "severity": "info", "gpu": None, "engine": "vllm",
               "message": "vllm back", "incident": "20270115-080000-engine_stall"}]
    page = statuspage.render(snapshot(paged=paged, targets=targets, recent_events=events))
    assert '<span class="pill ok">no open incident</span>' in page  # the incident still open, its all-clear sent
    recent = page.split("<h2>Recent incidents</h2>")[1]
    assert "20270115-080000-engine_stall" in recent and "all-clear sent" in recent
    assert "2 (0 given up); the last 3.3 min ago" in page and "HTTP 503" in page
    assert "engine_back" in page.split("<h2>Recent events</h2>")[1]


def test_history_in_recent_events_says_so_and_when_its_line_was_logged():
    """At a first start on a host whose log holds old faults, the recent events are those: each says it is
    history, with its line's own time where the log said it (the reading's time is the start's)."""
    old = {"time": NOW - 5, "kind": "xid", "severity": "warning", "gpu": "ffff:fe:1f.7", "engine": None,
           "message": "Xid 13", "incident": None, "history": True, "logged_at": NOW - 3600}
    undated = {**old, "logged_at": None, "kind": "sq_intr"}
    live = {**old, "history": False, "logged_at": None, "kind": "ring_timeout", "message": "ring"}
    recent = statuspage.render(snapshot(recent_events=[old, undated, live])).split("<h2>Recent events</h2>")[1]
    seen = Recent()  # what the page is given: the alerter's record of each event it was told
    seen.event(Event("xid", Severity.WARNING, "Xid 13", NOW - 5, gpu="ffff:fe:1f.7").as_history(NOW - 3600))
    seen.event(Event("ring_timeout", Severity.WARNING, "ring", NOW - 4))
    assert [(e["history"], e["logged_at"]) for e in seen.snapshot([], {})["recent_events"]] == [
        (False, None), (True, NOW - 3600)]
    assert f"Xid 13 <i>(history: logged {statuspage._clock(NOW - 3600)})</i>" in recent
    assert recent.count("<i>(history: logged before gpuwarden started)</i>") == 1
    assert "ring</li>" in recent


def test_a_down_engine_says_it_is_down_not_never():
    engine = {**snapshot()["engines"][0], "state": "down", "last_progress": None}
    page = statuspage.render(snapshot(engines=[engine]))
    assert "none: it is down (none seen)" in page and "never" not in page.split("<h2>Engines</h2>")[1].split(
        "<h2>")[0].split("last answer")[0]
