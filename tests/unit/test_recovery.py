"""The confirmation after a reboot, on a fake sysfs tree (no Radeon here) that changes between two "boots", a
real store and a fake boot id file."""

import asyncio
import time

import fakesysfs
from gpuwarden import recovery
from gpuwarden.model import Event, Severity
from gpuwarden.store import Store

GPU0, GPU1 = "ffff:03:00.0", "ffff:04:00.0"


def tree(root):
    fakesysfs.build(root, {GPU0: "rdna3", GPU1: "rdna3"})
    return root


def degrade(root):
    """The next boot: GPU 0's link trains at x4, GPU 1 stays off the bus."""
    (root / "devices/pci0000:00" / GPU0 / "current_link_width").write_text("4\n")
    (root / "bus/pci/devices" / GPU1).unlink()


def test_the_same_tree_is_back_as_before(tmp_path):
    root = tree(tmp_path)
    before = recovery.read(root)
    assert set(before) == {GPU0, GPU1} and before[GPU0].links[0] == (GPU0, 16.0, 16)
    assert before[GPU0].model == "Radeon RX 7900 XTX" and before[GPU0].driver == "amdgpu"
    verdict = recovery.compare(before, recovery.read(root))
    event = recovery.verdict_event(verdict, "20261204-031207-reset_failed", [GPU1], 1.0)
    assert (event.kind, event.severity, event.message) == ("gpus_back", Severity.INFO, "GPUs back 2/2, as before")
    assert event.evidence["incident"] == "20261204-031207-reset_failed"
    assert event.evidence["gpus_present"] == [GPU0, GPU1]


def test_a_narrower_link_and_a_missing_gpu_are_named(tmp_path):
    root = tree(tmp_path)
    before = recovery.read(root)
    degrade(root)
    verdict = recovery.compare(before, recovery.read(root))
    assert verdict.missing == [GPU1] and verdict.changed == [f"{GPU0} link x16 → x4"] and verdict.back == []
    event = recovery.verdict_event(verdict, None, [GPU1], 1.0)
    assert event.kind == "gpus_changed" and event.severity == Severity.CRITICAL
    assert event.message == f"GPUs after the reboot: 0/2 back as before; {GPU1} missing; {GPU0} link x16 → x4"
    assert event.evidence["gpus_present"] == [GPU0]


def test_bar_driver_and_a_changed_link_alone_are_a_warning(tmp_path):
    root = tree(tmp_path)
    before = recovery.read(root)
    dev = root / "devices/pci0000:00" / GPU0
    (dev / "resource").write_text(fakesysfs.resource_file({0: (256 << 20, fakesysfs.MEM64_PREFETCH),
                                                           2: (2 << 20, fakesysfs.MEM64_PREFETCH),
                                                           5: (1 << 20, fakesysfs.MEM)}))
    (dev / "current_link_speed").write_text("8.0 GT/s PCIe\n")
    event = recovery.verdict_event(recovery.compare(before, recovery.read(root)), None, [], 1.0)
    assert event.severity == Severity.WARNING
    assert event.evidence["changed"] == [f"{GPU0} BAR 0 24 GiB → 256 MiB", f"{GPU0} link 16.0 GT/s → 8.0 GT/s"]
    assert event.message.startswith("GPUs after the reboot: 1/2 back as before; ")


class Boots:
    """Boots of a machine, as the recovery sees them: a boot id file and when the boot began."""

    def __init__(self, folder):
        self.path, self.began = folder / "boot_id", time.time() - 100

    def next(self, name):
        self.path.write_text(f"{name}\n")
        self.began = time.time()


def run(state, root, store, boots, recorded):
    losses = lambda since, until: recovery.losses_in_events(  # noqa: E731
        lambda t: store.events(t, 100_000), since, until)
    check = recovery.Recovery(state, root, losses, recorded.extend,
                              boot_path=boots.path, wait=0, every=0, booted=lambda: boots.began)
    return asyncio.run(check.run())


def test_after_a_lost_gpu_each_new_boot_says_what_came_back(tmp_path):
    state, root = tmp_path / "state", tree(tmp_path / "sys")
    state.mkdir()
    store, boots, recorded = Store(state / "gpuwarden.db"), Boots(tmp_path), []
    boots.next("boot-a")
    assert run(state, root, store, boots, recorded) is None  # the first start records the baseline
    assert run(state, root, store, boots, recorded) is None  # a restart within the boot changes nothing
    store.add_events([Event("reset_failed", Severity.CRITICAL, "the GPU reset failed", time.time(), gpu=GPU1,
                            evidence={"incident": "20261204-031207-reset_failed"})])
    time.sleep(0.01)
    degrade(root)
    boots.next("boot-b")
    event = run(state, root, store, boots, recorded)
    assert event.kind == "gpus_changed" and event.evidence["missing"] == [GPU1]
    assert event.evidence["incident"] == "20261204-031207-reset_failed" and event.evidence["lost"] == [GPU1]
    assert run(state, root, store, boots, recorded) is None  # told once per boot

    # the owner power-cycles and reseats: the next boot is compared with the baseline from before the fault
    fresh = tree(tmp_path / "sys2")
    boots.next("boot-c")
    event = run(state, fresh, store, boots, recorded)
    assert event.message == "GPUs back 2/2, as before"
    assert [e.kind for e in recorded] == ["gpus_changed", "gpus_back"]
    boots.next("boot-d")
    assert run(state, fresh, store, boots, recorded) is None  # the loss is behind the new baseline
    store.close()
