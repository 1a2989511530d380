"""The confirmation after a reboot, on a fake sysfs tree (no Radeon here) that changes between two "boots", a
real store and a fake boot id file."""

import asyncio
import time

import fakesysfs
from gpuwarden.core import conditions, incidents
from gpuwarden.core.model import Event, Severity
from gpuwarden.gpu import recovery

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


class Model:
    """The hub's part, as the daemon keeps it across its restarts (the store): the open conditions and
    incidents, changed by each event, the recovery's verdicts included."""

    def __init__(self):
        self.state, self.incidents, self.recorded = {}, {}, []

    def record(self, events):
        for event in events:
            self.state, changes = conditions.apply(self.state, event)
            raised = [c.key for c in changes if c.raised]
            if (name := event.evidence.get("incident")) and (raised or name in self.incidents):
                joined = incidents.offer(self.incidents.get(name), event, raised, [], name, event.time)
                self.incidents[name] = incidents.settle(joined, changes, event.time + incidents.WINDOW)
            self.recorded.append(event)

    def lose(self, gpu, incident="20261204-031207-reset_failed"):
        self.record([Event("reset_failed", Severity.CRITICAL, "the GPU reset failed", time.time(), gpu=gpu,
                           evidence={"incident": incident})])

    def losses(self, until):
        return recovery.still_lost(self.state, [i for i in self.incidents.values() if i.closed is None], until)


def run(state, root, model, boots):
    check = recovery.Recovery(state, root, model.losses(boots.began), model.record,
                              boot_path=boots.path, wait=0, every=0)
    return asyncio.run(check.run())


def test_after_a_lost_gpu_each_new_boot_says_what_came_back(tmp_path):
    state, root = tmp_path / "state", tree(tmp_path / "sys")
    state.mkdir()
    model, boots = Model(), Boots(tmp_path)
    boots.next("boot-a")
    assert run(state, root, model, boots) is None  # the first start records the baseline
    assert run(state, root, model, boots) is None  # a restart within the boot changes nothing
    model.lose(GPU1)
    time.sleep(0.01)
    degrade(root)
    boots.next("boot-b")
    event = run(state, root, model, boots)
    assert event.kind == "gpus_changed" and event.evidence["missing"] == [GPU1]
    assert event.evidence["incident"] == "20261204-031207-reset_failed" and event.evidence["lost"] == [GPU1]
    assert run(state, root, model, boots) is None  # told once per boot
    assert [c.key for c in model.state.values()] == [conditions.lost(GPU1)]  # still missing: still lost

    # the owner power-cycles and reseats: the next boot is compared with the baseline from before the fault
    fresh = tree(tmp_path / "sys2")
    boots.next("boot-c")
    event = run(state, fresh, model, boots)
    assert event.message == "GPUs back 2/2, as before"
    assert [e.kind for e in model.recorded] == ["reset_failed", "gpus_changed", "gpus_back"]
    assert model.state == {}  # the confirmation ended the loss, and its incident with it
    assert model.incidents["20261204-031207-reset_failed"].ended == "GPUs back 2/2, as before"
    boots.next("boot-d")
    assert run(state, fresh, model, boots) is None  # the loss is behind the new baseline


def test_a_loss_that_ended_before_the_reboot_is_not_confirmed(tmp_path):
    """The GPU came back on the bus before the reboot (its gpu_lost condition resolved): the stored event of the
    loss is still there, but nothing is lost, so no "GPUs back" message; the new boot's baseline is recorded."""
    state, root = tmp_path / "state", tree(tmp_path / "sys")
    state.mkdir()
    model, boots = Model(), Boots(tmp_path)
    boots.next("boot-a")
    assert run(state, root, model, boots) is None
    model.lose(GPU1)
    model.state, _ = conditions.resolve(model.state, conditions.lost(GPU1), "back on the bus", time.time())
    time.sleep(0.01)
    boots.next("boot-b")
    assert run(state, root, model, boots) is None
    assert [e.kind for e in model.recorded] == ["reset_failed"]
    assert recovery.load_baseline(state / recovery.BASELINE)[0] == "boot-b"


def test_a_loss_in_this_boot_is_not_the_last_boots():
    """Only what was lost before the boot began is confirmed; a loss that named no GPU is one of the host."""
    now = time.time()
    state, _ = conditions.apply({}, Event("reset_failed", Severity.CRITICAL, "lost", now - 10))
    state, _ = conditions.apply(state, Event("reset_failed", Severity.CRITICAL, "lost", now, gpu=GPU0))
    assert recovery.still_lost(state, [], now - 1) == [recovery.Loss(None, None)]
    back = recovery.verdict_event(recovery.Verdict([GPU0], [], [], [], 1), None, [], now)
    assert conditions.apply(state, back)[0] == {}  # none missing: the unnamed one is back too
