"""The confirmation after a reboot, by the real daemon at its start: the last boot (a baseline recorded under
another boot id, and a stored GPU loss from before this boot began) lost a GPU; the GPUs (a fake sysfs tree: no
Radeon here) are back as before, so the daemon says so once, on the incident that lost it, and records this
boot's baseline."""

import json
import time

from helpers import wait_for

from fakesysfs import build
from gpuwarden import recovery
from gpuwarden.model import Event, Severity
from gpuwarden.store import Store

GPUS = {"ffff:fe:1f.5": "rdna3", "ffff:fe:1f.6": "rdna3"}
INCIDENT = "20261204-031207-reset_failed"


def test_the_daemon_confirms_the_gpus_after_the_reboot_that_followed_a_lost_gpu(daemon_factory, receiver,
                                                                                 tmp_path):
    sysfs = build(tmp_path / "sys", GPUS)
    config = (f'[gpu]\nsysfs_root = "{sysfs}"\nnvml = false\n[guard]\nenabled = false\n'
              f'[alerts]\nhostname = "box1"\ngroup_window = "300ms"\n'
              f'urls = ["json://127.0.0.1:{receiver.port}/hook"]\n')
    d = daemon_factory(config)
    d.state.mkdir(mode=0o700)
    booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    recovery.save_baseline(d.state / recovery.BASELINE, "an-earlier-boot", booted - 100, recovery.read(sysfs))
    store = Store(d.state / "gpuwarden.db")
    ids = store.add_events([Event("reset_failed", Severity.CRITICAL, "the GPU reset failed", booted - 50,
                                  gpu="ffff:fe:1f.6", evidence={"incident": INCIDENT})])
    store.mark_alerted(ids)  # paged in the last boot
    store.close()

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

    d.start()  # a restart within this boot: nothing to confirm again
    d.wait_serving()
    d.wait_log("gpuwarden running")
    assert d.stop() == 0
    assert [e["kind"] for e in d.events()].count("gpus_back") == 1 and len(receiver.json_bodies("/hook")) == 1
