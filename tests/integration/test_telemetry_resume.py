"""A telemetry condition (a hot GPU) is told once when it begins and once when it ends, whatever gpuwarden does
between: a reload (the GPU watch is built again: it was said again), a restart while it lasts (it was closed
unsaid and said again), a restart after it ended (its end was never said). The real daemon on a fake amdgpu sysfs
tree (no Radeon here: tests/fakesysfs.py)."""

import time

from helpers import TEST_GPU, wait_for
from test_reload import reload

from fakesysfs import build
from gpuwarden.store.sqlite import Store

KEY = f"thermal:{TEST_GPU}:junction"


def open_keys(d) -> set[str]:
    return {line.split('subject="')[1].split('"')[0] for line in d.metrics().splitlines()
            if line.startswith('gpuwarden_condition{condition="gpu_degraded"')}


def changes(d) -> list[tuple[bool, str]]:
    return [(c["raised"], c["message"]) for c in Store(d.state / "gpuwarden.db").condition_changes()
            if c["subject"] == KEY]


def thermal_events(d) -> int:
    return sum(1 for e in d.events() if e["kind"] == "thermal")


def test_a_hot_gpu_is_told_once_when_it_begins_and_once_when_it_ends_across_a_reload_and_restarts(
        daemon_factory, tmp_path):
    root = build(tmp_path / "sys", {TEST_GPU: "rdna3"})
    junction = root / "devices/pci0000:00" / TEST_GPU / "hwmon/hwmon1/temp2_input"
    gpus = f'[gpu]\nsysfs_root = "{root}"\ninterval = "0.2s"\nnvml = false\n[guard]\nenabled = false\n'
    hot, cool = "104000\n", "67000\n"  # junction 104 °C: above the 100 °C warning, under the 110 °C critical

    junction.write_text(hot)
    d = daemon_factory(gpus).start()
    d.wait_serving()
    wait_for(lambda: open_keys(d) == {KEY}, 15, interval=0.2, what="the thermal condition")
    assert reload(d.proc.pid).returncode == 0  # the GPU watch is built again: what is open stays its to end
    time.sleep(1.0)  # five rounds of the new GPU watch, still hot: nothing new is said
    assert thermal_events(d) == 1
    junction.write_text(cool)
    wait_for(lambda: open_keys(d) == set(), 15, interval=0.2, what="the end of the condition after a reload")
    junction.write_text(hot)
    wait_for(lambda: open_keys(d) == {KEY}, 15, interval=0.2, what="the condition again")
    assert d.stop() == 0

    again = daemon_factory(gpus, tmp=tmp_path).start()  # still hot across the restart: nothing new is said
    again.wait_serving()
    assert open_keys(again) == {KEY}
    wait_for(lambda: "gpuwarden_gpu_temperature_celsius{" in again.metrics(), 15, interval=0.2,
             what="the GPU watch's first round")
    time.sleep(1.0)  # five rounds more: what they found is stored by the stop
    assert again.stop() == 0
    assert thermal_events(again) == 2 and open_keys_stored(again) == {KEY}

    junction.write_text(cool)  # it ended while gpuwarden was down: the next run says so
    last = daemon_factory(gpus, tmp=tmp_path).start()
    last.wait_serving()
    wait_for(lambda: open_keys(last) == set(), 15, interval=0.2, what="the end told at the next start")
    assert last.stop() == 0
    assert [raised for raised, _ in changes(last)] == [True, False, True, False]
    assert {message for raised, message in changes(last) if not raised} == {f"thermal back to normal: {KEY}"}
    assert thermal_events(last) == 2


def open_keys_stored(d) -> set[str]:
    return {c.key.subject for c in Store(d.state / "gpuwarden.db").open_conditions()}
