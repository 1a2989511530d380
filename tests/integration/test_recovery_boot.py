"""The confirmation after a reboot, by the real daemon at its start: the last boot (a baseline recorded under
another boot id, and a GPU loss from before this boot began, stored as the hub stores it: the event, its open
gpu_lost condition and its incident) lost a GPU; the GPUs (a fake sysfs tree: no Radeon here) are back as before,
so the daemon says so once, on the incident that lost it, which that ends, and records this boot's baseline. A
loss that ended before the reboot (the GPU came back on the bus) asks for no confirmation."""

import json
import time

from helpers import wait_for

from fakesysfs import build
from gpuwarden.core import conditions, incidents
from gpuwarden.core.model import Event, Severity
from gpuwarden.gpu import recovery
from gpuwarden.store.sqlite import Store

GPUS = {"ffff:fe:1f.5": "rdna3", "ffff:fe:1f.6": "rdna3"}
INCIDENT = "20261204-031207-reset_failed"


def last_boot(d, sysfs, resolved=False):
    """The last boot as the daemon left it: the baseline, then a GPU lost (its event paged, its condition and
    incident open), or, with `resolved`, lost and back on the bus before the reboot."""
    d.state.mkdir(mode=0o700)
    booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    recovery.save_baseline(d.state / recovery.BASELINE, "an-earlier-boot", booted - 100, recovery.read(sysfs))
    store = Store(d.state / "gpuwarden.db")
    lost = Event("reset_failed", Severity.CRITICAL, "the GPU reset failed", booted - 50, gpu="ffff:fe:1f.6",
                 evidence={"incident": INCIDENT})
    [event_id] = store.add_events([lost])
    store.mark_alerted([event_id])  # paged in the last boot
    state, changes = conditions.apply({}, lost)
    incident = incidents.offer(None, lost, [c.key for c in changes], [], INCIDENT, lost.time)
    if resolved:
        state, ended = conditions.resolve(state, conditions.lost("ffff:fe:1f.6"), "back on the bus", booted - 40)
        changes += ended
        incident = incidents.settle(incident, ended, booted - 40 + incidents.WINDOW)
    store.add_changes(changes)
    store.save_incident(incident.row())
    store.close()


def config_of(sysfs, receiver):
    return (f'[gpu]\nsysfs_root = "{sysfs}"\nnvml = false\n[guard]\nenabled = false\n'
            f'[alerts]\nhostname = "box1"\ngroup_window = "300ms"\n'
            f'urls = ["json://127.0.0.1:{receiver.port}/hook"]\n')


def test_the_daemon_confirms_the_gpus_after_the_reboot_that_followed_a_lost_gpu(daemon_factory, receiver,
                                                                                 tmp_path):
    sysfs = build(tmp_path / "sys", GPUS)
    d = daemon_factory(config_of(sysfs, receiver))
    last_boot(d, sysfs)

    d.start()
    d.wait_serving()
    wait_for(lambda: receiver.json_bodies("/hook"), 20, what="the confirmation")
    [back] = receiver.json_bodies("/hook")
    assert (back["title"], back["type"]) == ("box1: GPUs back 2/2, as before", "success")
    assert "**Lost before the reboot**: ffff:fe:1f.6" in back["message"]
    [event] = [e for e in d.events() if e["kind"] == "gpus_back"]
    assert event["evidence"]["incident"] == INCIDENT
    assert event["evidence"]["gpus_present"] == sorted(GPUS)
    baseline = json.loads((d.state / recovery.BASELINE).read_text())
    assert baseline["boot"] == recovery.boot_id() and sorted(baseline["gpus"]) == sorted(GPUS)
    assert d.stop() == 0
    store = Store(d.state / "gpuwarden.db")
    assert store.open_conditions() == []  # the confirmation ended the loss
    [incident] = store.incidents()
    assert incident["closed"] and incident["ended"] == "GPUs back 2/2, as before"
    store.close()

    d.start()  # a restart within this boot: nothing to confirm again
    d.wait_serving()
    d.wait_log("gpuwarden running")
    assert d.stop() == 0
    assert [e["kind"] for e in d.events()].count("gpus_back") == 1 and len(receiver.json_bodies("/hook")) == 1


def test_a_loss_that_ended_before_the_reboot_sends_no_back_message(daemon_factory, receiver, tmp_path):
    sysfs = build(tmp_path / "sys", GPUS)
    d = daemon_factory(config_of(sysfs, receiver))
    last_boot(d, sysfs, resolved=True)
    d.start()
    d.wait_serving()
    wait_for(lambda: json.loads((d.state / recovery.BASELINE).read_text())["boot"] == recovery.boot_id(), 20,
             what="this boot's baseline")
    assert d.stop() == 0
    assert not [e for e in d.events() if e["kind"] in ("gpus_back", "gpus_changed")]
    assert receiver.json_bodies("/hook") == []
