"""Conditions end to end with the real daemon: a killed engine's stall gauge ends with the kill, a lost GPU keeps
its label across a daemon restart, and npd-check reads the same conditions."""

import json
import subprocess
from datetime import datetime

from helpers import GPUWARDEN, TEST_GPU, wait_for
from prometheus_client.parser import text_string_to_metric_families

from fakesysfs import build
from gpuwarden.store.sqlite import Store


def samples(text: str, name: str) -> dict[tuple, float]:
    """The series of one family: label values (sorted by label name) -> value."""
    return {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


def events_of(d, kind):
    return [e for e in d.events() if e["kind"] == kind]


def test_a_killed_engine_is_no_longer_stalled_at_the_next_scrape_and_its_figures_go(daemon_factory, fake_engine):
    engine = fake_engine("progress")
    d = daemon_factory(f'[[engine]]\nname = "fake"\nmetrics_url = "{engine.url}"\nscrape_interval = "0.5s"\n'
                       'min_stall = "2s"\nkill_grace = "1s"\n').start()
    d.wait_serving()
    engine.set_mode("stall")
    wait_for(lambda: samples(d.metrics(), "gpuwarden_engine_stalled").get((("engine", "fake"),)) == 1, 20,
             interval=0.1, what="the stall on the gauge")
    killed = wait_for(lambda: next(iter(events_of(d, "engine_killed")), None), 20, interval=0.2,
                      what="the kill")
    after = d.metrics()  # the first scrape after the kill is stored
    assert samples(after, "gpuwarden_engine_stalled") == {(("engine", "fake"),): 0}
    # the dead instance runs nothing: its last figure (2 running) is gone, or 0
    assert samples(after, "gpuwarden_engine_requests_running").get((("engine", "fake"),), 0) == 0
    assert samples(after, "gpuwarden_condition") == {
        (("condition", "engine_down"), ("engine", "fake"), ("gpu", ""), ("subject", "fake")): 1}
    assert killed["severity"] == "critical"  # a production engine down pages
    stall = events_of(d, "engine_stall")[0]
    assert stall["evidence"]["decision"] == [{"action": "kill", "engine": "fake", "reason": "stalled",
                                              "by_hand": False, "dry_run": False}]
    assert stall["evidence"]["incident"] == killed["evidence"]["incident"]  # one cause, one incident
    assert samples(d.metrics(), "gpuwarden_incident") == {  # open while the engine is down: one alert
        (("engine", "fake"), ("gpu", ""), ("id", killed["evidence"]["incident"]), ("kind", "engine_stall")): 1}
    bundle = d.state / "incidents" / killed["evidence"]["incident"]  # its bundle: the folder of the same name
    wait_for(lambda: (bundle / "incident.json").exists(), 10, what="the incident's bundle")
    content = json.loads((bundle / "incident.json").read_text())
    assert content["incident"]["id"] == bundle.name and content["incident"]["engines"] == ["fake"]
    assert d.stop() == 0
    store = Store(d.state / "gpuwarden.db")
    assert [(c["condition"], c["raised"]) for c in store.condition_changes()] == [
        ("engine_stalled", True), ("engine_stalled", False), ("engine_down", True)]
    [incident] = store.incidents()
    assert incident["id"] == stall["evidence"]["incident"] and incident["engines"] == ["fake"]
    assert incident["conditions"] == ["engine_down:fake"] and "killed fake" in incident["done"][0]


def test_a_lost_gpu_keeps_its_label_across_a_daemon_restart_and_npd_check_sees_it(daemon_factory, tmp_path):
    root = build(tmp_path / "sys", {TEST_GPU: "rdna3"})  # a Radeon's sysfs (none is here)
    gpus = f'[gpu]\nsysfs_root = "{root}"\nnvml = false\n[guard]\nenabled = false\n'
    d = daemon_factory(gpus).start()
    d.wait_serving()
    stamp = datetime.now().strftime("%b %d %H:%M:%S")
    with d.log_file.open("a") as log:
        log.write(f"{stamp} host kernel: amdgpu {TEST_GPU}: amdgpu: device lost from bus!\n")
    lost = {(("condition", "gpu_lost"), ("engine", ""), ("gpu", TEST_GPU), ("subject", TEST_GPU)): 1}
    wait_for(lambda: samples(d.metrics(), "gpuwarden_condition") == lost, 20, interval=0.2,
             what="the gpu_lost condition")
    assert d.stop() == 0

    again = daemon_factory(gpus, tmp=tmp_path).start()  # the same state folder: the same store
    metrics = again.wait_serving()
    assert samples(metrics, "gpuwarden_condition") == lost  # loaded from the store, not read again
    assert len([e for e in again.events() if e["kind"] == "device_lost"]) == 1
    result = subprocess.run([*GPUWARDEN, "--config", str(again.config_path), "npd-check", "--condition", "gpu",
                             "--timeout", "3"], capture_output=True, text=True, timeout=15)
    assert result.returncode == 1 and result.stdout.startswith(f"device_lost {TEST_GPU} at "), result
    shown = subprocess.run([*GPUWARDEN, "--config", str(again.config_path), "conditions"], capture_output=True,
                           text=True, timeout=15).stdout
    assert f"gpu_lost            {TEST_GPU}  by device_lost" in shown, shown
    assert again.stop() == 0


def test_a_killed_engine_keeps_no_gauge_of_its_dead_instance(daemon_factory, fake_engine):
    """Issue 36: after a kill, gpuwarden_engine_cpu_ratio kept the dead process's last value (a spinning hang
    reads as still spinning). Every engine gauge of the dead instance reads 0 once it is down."""
    engine = fake_engine("progress", "--spin")
    d = daemon_factory(f'[[engine]]\nname = "spun"\nmetrics_url = "{engine.url}"\nscrape_interval = "0.5s"\n'
                       'min_stall = "2s"\nkill_grace = "1s"\n').start()
    d.wait_serving()
    engine.set_mode("stall")  # its child spins a core while the counters are frozen
    cpu = ("gpuwarden_engine_cpu_ratio", (("engine", "spun"),))
    wait_for(lambda: samples(d.metrics(), cpu[0]).get(cpu[1], 0) > 0, 30, interval=0.1, what="its CPU on the gauge")
    wait_for(lambda: events_of(d, "engine_killed"), 30, interval=0.2, what="the kill")
    # down, and no look since finds a process of it: the gauges must say so (the old code kept the last CPU)
    def down_and_idle():
        m = d.metrics()
        return m if "engine_down" in m and samples(m, cpu[0]).get(cpu[1]) == 0 else None

    after = wait_for(down_and_idle, 10, interval=0.2, what="its CPU gauge at 0 once it is down")
    for family in ("gpuwarden_engine_cpu_ratio", "gpuwarden_engine_requests_running",
                   "gpuwarden_engine_requests_waiting", "gpuwarden_engine_stalled"):
        assert samples(after, family).get((("engine", "spun"),), 0) == 0, (family, after)
