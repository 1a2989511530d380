"""README's contributing section, done as it says, each with the real daemon in this process: a new alert channel
is a class implementing alert/channel.Channel and one registration line (alert/targets.register), and the daemon
delivers to it from a config URL of its scheme, as it does to apprise's; a new GPU vendor is one GpuVendor
(gpu/vendors/base.py) and one registration line (gpu/vendors.register), and the daemon finds its GPU, exports its
readings and raises its conditions; a new event kind is one row and one registration call (core/eventkinds.register),
and the daemon's hub raises the conditions, says the words and points to the runbook its row names. (An engine
kind's fake, toyllm, is tests/integration/test_engine_kinds.py's.)"""

import asyncio
import os
import time
from pathlib import Path

from helpers import TEST_GPU, driver_record
from inprocess import daemon_in, running

from gpuwarden.alert import targets
from gpuwarden.alert.channel import Alert
from gpuwarden.config.settings import GpuConfig
from gpuwarden.core import conditions, eventkinds, families
from gpuwarden.core.model import Event, GpuSample, Severity
from gpuwarden.gpu import vendors
from gpuwarden.gpu.vendors.base import GpuVendor, Opened
from gpuwarden.hub.queue import Outbox

GOT: list[Alert] = []


class Pager:
    """A channel of this test's own: it keeps what it is handed."""

    takes_pictures = False
    got = GOT

    def __init__(self, url: str, name: str, resend: float) -> None:
        self.url, self.name = url, name

    async def notify(self, alert: Alert, timeout: float) -> tuple[bool, str | None]:
        self.got.append(alert)
        return False, None

    async def refresh(self, timeout, still_open) -> tuple[bool, str | None]:
        return False, None

    def resume(self, alert: Alert) -> None:
        pass

    def carry(self, earlier) -> None:
        pass


def test_a_channel_registered_in_one_line_gets_the_daemons_alerts(tmp_path):
    targets.register(["testpager"], Pager)  # the one line
    kernel = tmp_path / "kern.log"
    kernel.touch()
    daemon = daemon_in(tmp_path, f'[kernel]\nsource = "file"\nfile = "{kernel}"\n'
                                 f'[alerts]\nhostname = "box1"\ngroup_window = "200ms"\nurls = ["testpager://ops"]\n')

    async def scenario():
        async with running(daemon):
            await asyncio.sleep(0.5)
            with kernel.open("a") as log:
                log.write(driver_record(f"NVRM: Xid (PCI:{TEST_GPU[:-2]}): 79, pid=1234, name=python3, "
                                        "GPU has fallen off the bus.", device=None))
            for _ in range(100):
                if GOT:
                    break
                await asyncio.sleep(0.1)
    try:
        asyncio.run(scenario())
    finally:
        targets.unregister(["testpager"])
    [alert] = GOT
    print(alert.title)
    assert alert.title.startswith("box1: ") and "fallen off the bus" in alert.body, (alert.title, alert.body)


# A GPU vendor of this test's own, "acme" (PCI vendor ID 0xacee): no such device exists here, so its sysfs tree is
# one the test makes (mocked: a directory that looks like /sys/bus/pci/devices/<bdf>), and its reader reads the
# one sensor file the test writes there. The rest is the real daemon's.
def _acme_open(config: GpuConfig) -> Opened:
    def reader(gpu):
        device = config.sysfs_root / "bus/pci/devices" / gpu.pci

        def read(now: float) -> GpuSample:
            celsius = int((device / "acme_hotspot_millicelsius").read_text()) / 1000
            return GpuSample(gpu=gpu.pci, vendor="acme", model="Acme A1", time=now, temperatures={"junction": celsius},
                             throttle=("acme_hot",) if celsius > 100 else ())
        return read

    return Opened(reader)


ACME = GpuVendor("acme", frozenset({"0xacee"}), open=_acme_open, throttle_reasons=("acme_hot", "acme_power"))


def _acme_gpu(sysfs: Path, bdf: str, celsius: float) -> None:
    device = sysfs / "bus/pci/devices" / bdf
    device.mkdir(parents=True)
    (device / "vendor").write_text("0xacee\n")
    (device / "class").write_text("0x120000\n")  # a processing accelerator
    (sysfs / "bus/pci/drivers/acmegpu").mkdir(parents=True)
    os.symlink(sysfs / "bus/pci/drivers/acmegpu", device / "driver")
    (device / "acme_hotspot_millicelsius").write_text(f"{int(celsius * 1000)}\n")


def test_a_gpu_vendor_registered_in_one_line_is_found_read_exported_and_judged(tmp_path):
    vendors.register(ACME)  # the one line
    sysfs = tmp_path / "sys"
    _acme_gpu(sysfs, TEST_GPU, 104.0)  # above [gpu] junction_warn_celsius (100)
    kernel = tmp_path / "kern.log"  # an empty log: this host's own kernel lines raise nothing here
    kernel.touch()
    daemon = daemon_in(tmp_path, f'[gpu]\nsysfs_root = "{sysfs}"\ninterval = "200ms"\nnvml = false\n'
                                 f'[kernel]\nsource = "file"\nfile = "{kernel}"\n[guard]\nenabled = false\n')
    hot = conditions.degraded(f"thermal:{TEST_GPU}:junction")
    base = (TEST_GPU, "acme", "Acme A1")

    async def scenario():
        async with running(daemon):
            for _ in range(100):
                if hot in daemon.hub.conditions:
                    break
                await asyncio.sleep(0.1)
            return daemon.metrics.snapshot(), [g.vendor for g in daemon.inventory.gpus], dict(daemon.hub.conditions)
    try:
        metrics, found, raised = asyncio.run(scenario())
    finally:
        vendors.unregister("acme")
    assert found == ["acme"]
    assert metrics[families.GPU_TEMPERATURE.name] == {(*base, "junction"): 104.0}
    assert metrics[families.GPU_THROTTLE.name] == {(*base, "acme_hot"): 1.0, (*base, "acme_power"): 0.0}
    assert metrics[families.GPU_READER_UP.name] == {base: 1.0}
    assert hot in raised, list(raised)


KIND_GOT: list[Alert] = []


class KindPager(Pager):
    got = KIND_GOT


def test_an_event_kind_registered_in_one_call_is_what_its_row_says_in_the_hub(tmp_path):
    """A kind the catalog did not have at import: its row says a critical one loses the GPU (condition "gpu"),
    its title words and its runbook; an event of it, recorded by a component of the test's own through the real
    queue, is judged by the daemon's hub stages (conditions, titles, alert) as that row says."""
    eventkinds.register("acme_meltdown", eventkinds.Kind("gsp", condition="gpu", words="melted down"))  # the call
    targets.register(["kindpager"], KindPager)
    kernel = tmp_path / "kern.log"  # an empty log: nothing but the test's event is alerted
    kernel.touch()
    daemon = daemon_in(tmp_path, f'[kernel]\nsource = "file"\nfile = "{kernel}"\n[guard]\nenabled = false\n'
                                 '[alerts]\nhostname = "box1"\ngroup_window = "200ms"\nurls = ["kindpager://ops"]\n')

    async def scenario():
        async with running(daemon):
            Outbox("acme", daemon.reports, daemon.metrics).record([Event(
                "acme_meltdown", Severity.CRITICAL, "the Acme A1 melted down", time.time(), gpu=TEST_GPU)])
            for _ in range(100):
                if KIND_GOT:
                    break
                await asyncio.sleep(0.1)
            return dict(daemon.hub.conditions)
    try:
        raised = asyncio.run(scenario())
    finally:
        targets.unregister(["kindpager"])
        eventkinds.unregister("acme_meltdown")
    assert conditions.lost(TEST_GPU) in raised, list(raised)
    [alert] = KIND_GOT
    assert alert.title.startswith("box1: ") and "melted down" in alert.title, alert.title
    assert "The GPU's firmware (GSP) stopped answering" in alert.text, alert.text
