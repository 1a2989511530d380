"""The status page end to end: the real daemon with a real (fake) engine process that stalls and a fake GPU in a
fake sysfs (no Radeon here: its sysfs is the one thing mocked), read by the real `gpuwarden status` and shown
in a real headless browser (Debian's chromium), whose screenshot goes to docs/status.png."""

import json
import mimetypes
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import GPUWARDEN, TEST_GPU, free_port, heavy_lock, http_get, need, wait_for

from fakesysfs import build
from gpuwarden.store.bundles import PICTURE

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture
def stalled(daemon_factory, fake_engine, tmp_path):
    """A daemon watching one fake GPU and one engine that stalls (alert only: it stays stalled, the incident
    stays open)."""
    engine = fake_engine("progress")
    root = build(tmp_path / "sys", {TEST_GPU: "rdna3"})
    d = daemon_factory(
        f'[gpu]\nsysfs_root = "{root}"\nnvml = false\n[guard]\nenabled = false\n'
        f'[[engine]]\nname = "vllm-<b>"\nmetrics_url = "{engine.url}"\nscrape_interval = "0.5s"\n'
        f'min_stall = "2s"\non_stall = "alert"\ngpus = ["{TEST_GPU}"]\n').start()
    d.wait_serving()
    engine.set_mode("stall")
    wait_for(lambda: any(e["kind"] == "engine_stall" for e in d.events()), 20, 0.2, "the engine_stall event")

    def snap():
        s = json.loads(http_get(f"http://127.0.0.1:{d.port}/status.json"))
        return s if s["incidents"] and s["gpus"] and s["gpus"][0]["read_at"] else None
    wait_for(snap, 10, 0.2, "a snapshot with the incident and a GPU reading")
    yield d
    d.stop()


def test_the_snapshot_says_what_the_daemon_knows(stalled):
    snap = json.loads(http_get(f"http://127.0.0.1:{stalled.port}/status.json"))
    [engine] = snap["engines"]
    assert engine["name"] == "vllm-<b>" and engine["state"] == "stalled" and engine["running"] == 2
    assert snap["time"] - engine["last_progress"] >= 2  # no progress for at least min_stall
    [gpu] = snap["gpus"]
    assert gpu["gpu"] == TEST_GPU and gpu["state"] == "ok"
    assert gpu["sensors"]["power_watts"] > 0 and gpu["limits"]["power_cap_watts"] > 0
    assert gpu["limits"]["temperature_edge_critical_celsius"] == 100
    [incident] = snap["incidents"]
    assert "engine_stall" in incident["id"] and incident["engines"] == ["vllm-<b>"]
    assert [(d["action"], d["engine"]) for d in incident["decisions"]] == [("alert_only", "vllm-<b>")]
    kernel = next(s for s in snap["sources"] if s["name"] == "kernel")
    assert kernel["up"] is True and kernel["detail"] == "file" and snap["time"] - kernel["last_success"] < 60
    assert sorted(s["name"] for s in snap["sources"]) == ["kernel", "uevents"]
    assert all(c["up"] for c in snap["components"]), snap["components"]


def test_status_command_reads_the_running_daemon(stalled):
    out = subprocess.run([*GPUWARDEN, "--config", str(stalled.config_path), "status"], capture_output=True,
                         text=True, timeout=30, env=stalled.env)
    assert out.returncode == 0, out.stderr
    assert "vllm-<b>" in out.stdout and "stalled" in out.stdout and TEST_GPU in out.stdout
    assert "engine_stall" in out.stdout  # the open incident
    as_json = subprocess.run([*GPUWARDEN, "--config", str(stalled.config_path), "status", "--json"],
                             capture_output=True, text=True, timeout=30, env=stalled.env)
    assert json.loads(as_json.stdout)["daemon"]["engines"][0]["state"] == "stalled"


def test_the_incident_picture_is_served_and_nothing_else_of_the_state_dir(stalled):
    base = f"http://127.0.0.1:{stalled.port}"
    [incident] = json.loads(http_get(f"{base}/status.json"))["incidents"]
    assert incident["picture"] == f"/incidents/{incident['id']}/{PICTURE}"

    def picture():
        try:
            with urllib.request.urlopen(base + incident["picture"], timeout=5) as response:
                return response.headers["Content-Type"], response.read()
        except urllib.error.HTTPError:
            return None  # drawn in a child process a few seconds after the incident opened
    kind, data = wait_for(picture, 60, 0.5, "the timeline picture")
    folder = stalled.state / "incidents" / incident["id"]
    assert kind == mimetypes.guess_type(PICTURE)[0] and data == (folder / PICTURE).read_bytes()
    assert b"tokens generated per second" in data and b"power (W)" not in data  # the stalled engine's own signal
    (folder / PICTURE).unlink()
    (folder / PICTURE).symlink_to(stalled.state / "gpuwarden.db")  # a link is not followed
    for path in (incident["picture"], "/incidents/../gpuwarden.db", f"/incidents/..%2Fgpuwarden.db/{PICTURE}",
                 f"/incidents/{incident['id']}/incident.json", f"/incidents/.x/{PICTURE}"):
        with pytest.raises(urllib.error.HTTPError) as caught:
            http_get(base + path)
        assert caught.value.code == 404, path


def test_other_paths_are_not_found_and_metrics_stay(stalled):
    base = f"http://127.0.0.1:{stalled.port}"
    assert "gpuwarden_engine_stalled" in http_get(f"{base}/metrics")
    for path in ("/healthz", "/metrics/x", "/status/../etc"):
        with pytest.raises(urllib.error.HTTPError) as caught:
            http_get(base + path)
        assert caught.value.code == 404, path
    page = http_get(f"{base}/status")
    assert "vllm-&lt;b&gt;" in page and "<b>\"" not in page  # a name from the config is escaped
    assert "<script" not in page and "http-equiv=\"refresh\"" in page


def test_a_headless_browser_shows_the_stalled_engine_the_gpu_and_the_incident(stalled, tmp_path):
    chromium = need("chromium", "chromium")
    url = f"http://127.0.0.1:{stalled.port}/"
    base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'chromium'}"]
    shot, phone = tmp_path / "status.png", tmp_path / "phone.png"
    with heavy_lock():  # chromium is heavy on a shared 2-core box
        dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=60)
        shots = [subprocess.run([*base, f"--screenshot={path}", f"--window-size={size}", url], capture_output=True,
                                text=True, timeout=60) for path, size in ((shot, "1000,1400"), (phone, "390,2000"))]
    assert dom.returncode == 0, dom.stderr[-2000:]
    for shown in ("1 open incident", "engine_stall", "vllm-&lt;b&gt;", "stalled", TEST_GPU, "kernel", "<img src="):
        assert shown in dom.stdout, f"{shown!r} is not on the page"
    for run, path in zip(shots, (shot, phone), strict=True):
        assert run.returncode == 0 and path.stat().st_size > 10_000, run.stderr[-2000:]
    if os.environ.get("GPUWARDEN_UPDATE_DOCS"):  # by hand: refresh the pictures docs/status.md shows
        shutil.copy(shot, DOCS / "status.png")
        shutil.copy(phone, DOCS / "status-phone.png")


def test_status_without_a_daemon_reads_the_gpus_itself(tmp_path):
    root = build(tmp_path / "sys", {TEST_GPU: "rdna3"})
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n[exporter]\nport = {free_port()}\n'
                   f'[gpu]\nsysfs_root = "{root}"\nnvml = false\n')
    out = subprocess.run([*GPUWARDEN, "--config", str(cfg), "status", "--json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "no daemon answers" in out.stderr, out.stderr
    document = json.loads(out.stdout)
    assert document["daemon"] is None and "Connection refused" in document["error"]
    assert [r["gpu"] for r in document["readings"]] == [TEST_GPU]


def test_after_an_incident_ended_the_page_is_green_and_lists_it_with_its_pages(daemon_factory, fake_engine,
                                                                               receiver, tmp_path):
    """A stall on an engine gpuwarden only alerts on, which then makes progress again: its all-clear goes out,
    the page turns green at once (the incident itself closes a little later) and lists the incident that ended,
    the alert target's last delivery and the recent events, as a real headless browser shows them."""
    chromium = need("chromium", "chromium")
    engine = fake_engine("progress")
    root = build(tmp_path / "sys", {TEST_GPU: "rdna3"})
    d = daemon_factory(
        f'[gpu]\nsysfs_root = "{root}"\nnvml = false\n[guard]\nenabled = false\n'
        f'[alerts]\ngroup_window = "300ms"\nhostname = "box1"\n'
        f'[[alerts.target]]\nname = "pager"\nurl = "json://127.0.0.1:{receiver.port}/pager"\n'
        f'[[engine]]\nname = "vllm-a"\nmetrics_url = "{engine.url}"\nscrape_interval = "0.5s"\n'
        f'min_stall = "2s"\non_stall = "alert"\ngpus = ["{TEST_GPU}"]\n').start()
    d.wait_serving()
    engine.set_mode("stall")
    wait_for(lambda: any(e["kind"] == "engine_stall" for e in d.events()), 20, 0.2, "the engine_stall event")
    engine.set_mode("progress")
    wait_for(lambda: any(b["type"] == "success" for b in receiver.json_bodies("/pager")), 30, 0.2, "the all-clear")
    snap = json.loads(http_get(f"http://127.0.0.1:{d.port}/status.json"))
    [(incident, page)] = snap["paged"].items()
    assert "engine_stall" in incident and page["all_clear"] is not None
    assert page["steps"] and "Restart vllm-a now" in page["steps"][0]  # what its page told to do
    [target] = snap["targets"]
    assert target["name"] == "pager" and target["last_title"].startswith("box1: resolved: engine vllm-a stalled")
    assert [e["kind"] for e in snap["recent_events"]][-1:] == ["engine_stall"]
    base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'c'}"]
    with heavy_lock():
        dom = subprocess.run([*base, "--dump-dom", f"http://127.0.0.1:{d.port}/"], capture_output=True, text=True,
                             timeout=60)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page_html = dom.stdout
    assert '<span class="pill ok">no open incident</span>' in page_html  # green
    recent = page_html.split("<h2>Recent incidents</h2>", 1)[1].split("<h2>", 1)[0]
    assert incident in recent and "all-clear sent" in recent
    assert f"GPU 0 ({TEST_GPU})" in page_html  # as the pages name it
    targets = page_html.split("<h2>Alert targets</h2>", 1)[1].split("<h2>", 1)[0]
    assert "pager" in targets and "box1: resolved: engine vllm-a stalled" in targets
    assert "engine_stall" in page_html.split("<h2>Recent events</h2>", 1)[1]
    d.stop()
