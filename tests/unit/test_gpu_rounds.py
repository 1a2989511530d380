"""The daemon's GPU round (gpu/watch.py) on a fake sysfs tree of two Radeons (what cannot exist here): the loop
wakes once a round, the worker's answer is a finished future the next round takes, not a wake-up of the loop;
a reading is exported the round after it was read."""

import asyncio
import threading
from pathlib import Path

from fakesysfs import build
from gpuwarden.config.settings import GpuConfig
from gpuwarden.core import families
from gpuwarden.core.model import NullSink
from gpuwarden.gpu.discovery import discover
from gpuwarden.gpu.recorder import FlightRecorder
from gpuwarden.gpu.watch import GpuWatch


class Exported(NullSink):
    """What the watch exports, as the exporter would show it."""

    def __init__(self):
        self.series = {}

    def replace_series(self, family, series):
        self.series[family] = dict(series)


def test_a_round_takes_the_reads_handed_out_the_round_before_and_no_read_wakes_the_loop(tmp_path):
    sysfs = build(tmp_path / "sys", {"ffff:fe:1f.7": "rdna3", "ffff:fe:1e.7": "mi300"})
    gpus = discover(sysfs)
    power = next(Path(sysfs / "bus/pci/devices/ffff:fe:1f.7").resolve().glob("hwmon/hwmon*/power1_average"))
    exported = Exported()
    watch = GpuWatch(GpuConfig(sysfs_root=sysfs, nvml=False, interval=0.2), lambda: gpus, exported, FlightRecorder())
    watch.open()
    woken_from = []  # the threads that asked the loop to wake up (call_soon_threadsafe)

    def watts() -> float | None:
        series = exported.series.get(families.GPU_POWER, {})
        return next((v for labels, v in series.items() if labels[0] == "ffff:fe:1f.7"), None)

    async def main():
        loop = asyncio.get_running_loop()
        threadsafe = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a, **k: woken_from.append(threading.current_thread().name) or \
            threadsafe(*a, **k)
        sampling = asyncio.create_task(watch._sample_forever())
        seen = []
        try:
            for watts_now in (150, 175):
                power.write_text(f"{watts_now * 1_000_000}\n")
                written = loop.time()  # two rounds at most (one hands the read out, the next takes it): ~0.4 s
                while watts() != watts_now and loop.time() - written < 5.0:
                    await asyncio.sleep(0.01)
                seen.append(watts())
        finally:
            sampling.cancel()
            await asyncio.gather(sampling, return_exceptions=True)
        return seen

    assert asyncio.run(main()) == [150.0, 175.0]
    assert len(watch.recorder.history("ffff:fe:1f.7")) >= 3
    assert not [name for name in woken_from if name.startswith("read-")]
