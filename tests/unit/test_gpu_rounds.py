"""The daemon's GPU round (gpu/watch.py) on a fake sysfs tree of two Radeons (what cannot exist here): the loop
wakes once a round, the worker's answer is a finished future the next round takes, not a wake-up of the loop;
a reading is exported the round after it was read; a hung read is found at its deadline, a blocked loop makes no
healthy read look hung."""

import asyncio
import contextlib
import os
import threading
import time
from pathlib import Path

from fakesysfs import build
from gpuwarden.config.settings import GpuConfig
from gpuwarden.core import families
from gpuwarden.core.model import NullSink
from gpuwarden.gpu.discovery import discover
from gpuwarden.gpu.recorder import FlightRecorder
from gpuwarden.gpu.watch import GpuWatch


class Exported(NullSink):
    """What the watch exports, as the exporter would show it, and the events it records."""

    def __init__(self):
        self.series, self.events = {}, []

    def replace_series(self, family, series):
        self.series[family] = dict(series)

    def record(self, events, cursor=None):
        self.events += events
        return super().record(events, cursor)


def watched(tmp_path, **gpu):
    """A watch of two fake Radeons, and what it exports."""
    sysfs = build(tmp_path / "sys", {"ffff:fe:1f.7": "rdna3", "ffff:fe:1e.7": "mi300"})
    gpus, exported = discover(sysfs), Exported()
    watch = GpuWatch(GpuConfig(sysfs_root=sysfs, nvml=False, **gpu), lambda: gpus, exported, FlightRecorder())
    watch.open()
    return sysfs, watch, exported


def sampled_for(watch: GpuWatch, seconds: float, meanwhile=None) -> None:
    """The watch's rounds for `seconds`; `meanwhile(loop)` is called once they run."""
    async def main():
        sampling = asyncio.create_task(watch._sample_forever())
        try:
            await asyncio.sleep(0)
            if meanwhile:
                meanwhile(asyncio.get_running_loop())
            await asyncio.sleep(seconds)
        finally:
            sampling.cancel()
            await asyncio.gather(sampling, return_exceptions=True)
    asyncio.run(main())


def release(fifo: Path) -> None:
    """The read hung on `fifo` comes back (its thread ends with it)."""
    with contextlib.suppress(OSError):  # ENXIO: no read hangs on it
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def readers() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "read-gpus")


def test_a_read_that_hangs_is_found_at_its_deadline_when_that_comes_before_the_next_round(tmp_path):
    sysfs, watch, exported = watched(tmp_path, interval=60.0, read_deadline=0.3)
    busy = next(Path(sysfs / "bus/pci/devices/ffff:fe:1e.7").resolve().glob("gpu_busy_percent"))
    busy.unlink()
    os.mkfifo(busy)  # opening it for reading never returns: a GPU hung in D state
    started = time.time()
    sampled_for(watch, 1.5)  # the next round comes at the next minute of the grid
    [hung] = [e for e in exported.events if e.kind == "gpu_unresponsive"]
    assert hung.gpu == "ffff:fe:1e.7" and hung.time - started < 1.5
    release(busy)


def test_a_loop_blocked_past_the_read_deadline_makes_no_healthy_read_look_hung(tmp_path):
    """Rounds the blocked loop missed are skipped, not made up back to back: each would have found the reads handed
    out by the one before still waiting for the GIL, past the deadline counted from the round they were due at,
    and left a thread behind (and a GPU called hung) each time."""
    _, watch, exported = watched(tmp_path, interval=0.2, read_deadline=0.5)
    for gpu in watch.gpus():  # a read takes 50 ms (a GPU's reads are slower than a fake tree's)
        read = watch._reader(gpu)
        watch._readers[gpu.pci] = lambda when, read=read: time.sleep(0.05) or read(when)
    before = readers()  # this watch's worker among them
    sampled_for(watch, 3.0, meanwhile=lambda loop: loop.call_later(0.5, time.sleep, 1.5))  # then a second more
    assert not [e for e in exported.events if e.kind == "gpu_unresponsive"]
    assert readers() <= before  # no worker abandoned


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
    assert not [name for name in woken_from if name.startswith("read-")]


def test_a_watch_that_stops_ends_its_worker(tmp_path):
    """A reload or a restart builds the next watch with a worker of its own: the last one's thread ends with it."""
    _, watch, _ = watched(tmp_path, interval=0.2)

    async def main():
        running = asyncio.create_task(watch.run())
        await asyncio.sleep(0.5)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    asyncio.run(main())
    watch._worker.thread.join(5)
    assert not watch._worker.thread.is_alive()


class Judged(Exported):
    """... and the conditions it ends."""

    def __init__(self):
        super().__init__()
        self.ended = []

    def resolve(self, key, message, cures=None):
        self.ended.append(message)


def test_a_hot_gpu_whose_read_hangs_stays_hot_until_it_is_read_again(tmp_path):
    """Judged on its last reading: the hung GPU's thermal condition is not ended ("back to normal") because the
    other GPU was read and it was not. The hang is its reader waiting (the reader keeps its files open: a file
    made a FIFO after its first read would not hang it)."""
    sysfs = build(tmp_path / "sys", {"ffff:fe:1f.7": "rdna3", "ffff:fe:1e.7": "mi300"})
    gpus, judged = discover(sysfs), Judged()
    watch = GpuWatch(GpuConfig(sysfs_root=sysfs, nvml=False, interval=0.2, read_deadline=0.5), lambda: gpus, judged,
                     FlightRecorder())
    watch.open()
    device = Path(sysfs / "bus/pci/devices/ffff:fe:1f.7").resolve()
    next(device.glob("hwmon/hwmon*/temp2_input")).write_text("104000\n")  # junction over its 100 °C warning
    released = threading.Event()

    def hang(loop):
        def now():
            watch._readers["ffff:fe:1f.7"] = lambda when: released.wait()  # its next read never returns
        loop.call_later(1.0, now)
    try:
        sampled_for(watch, 3.0, meanwhile=hang)
    finally:
        released.set()
    kinds = [e.kind for e in judged.events]
    assert "thermal" in kinds and "gpu_unresponsive" in kinds
    assert not [m for m in judged.ended if "thermal" in m]
