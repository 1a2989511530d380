import gc
import random
import tracemalloc
from collections import deque
from dataclasses import fields, replace
from pathlib import Path

import pytest

from fakesysfs import build
from gpuwarden.core.model import GpuSample
from gpuwarden.gpu.amd import AmdReader
from gpuwarden.gpu.recorder import FlightRecorder

GPU, OTHER = "0000:03:00.0", "0000:83:00.0"


class Reference:
    """The recorder as it was before it packed its samples: the plain behaviour the packed one must keep."""

    def __init__(self, window):
        self.window, self.samples = window, {}

    def add(self, sample):
        ring = self.samples.setdefault(sample.gpu, deque())
        ring.append(sample)
        while ring and sample.time - ring[0].time > self.window:
            ring.popleft()

    def latest(self):
        return {gpu: ring[-1] for gpu, ring in self.samples.items() if ring}

    def history(self, gpu, since=None):
        return [s for s in self.samples.get(gpu, ()) if since is None or s.time >= since]

    def forget(self, gpu):
        self.samples.pop(gpu, None)


def same(a, b):
    """Equal and of the same type all the way down (1 == 1.0 and {} order do not pass), dicts in the same order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, GpuSample):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in fields(GpuSample))
    return a == b


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert same(g, w), [f.name for f in fields(GpuSample) if not same(getattr(g, f.name), getattr(w, f.name))]


def maybe(rng, value, none=0.1):
    return None if rng.random() < none else value


def amd_like(rng, gpu, t):
    """A sample shaped as gpu/amd.py makes them: floats from sysfs, int link widths, three (or fewer)
    temperatures, overdrive sections, problems when a file was busy or gone; and an int where the type says float
    (1 == 1.0: it must come back an int all the same)."""
    sensors = rng.choice([("edge", "junction", "mem"), ("junction", "mem"), ("edge", "junction", "mem"),
                          ("mem", "edge")])
    problems = rng.choice([{}, {}, {}, {}, {"gpu_busy_percent": "busy"}, {"power1_average": "gone"}])
    state = "gone" if "gone" in problems.values() else "not_readable" if problems else "ok"
    return GpuSample(
        gpu=gpu, vendor="amd", model=rng.choice(["Radeon RX 7900 XTX", None]), time=t, state=state,
        power_watts=maybe(rng, rng.choice([272.0, rng.uniform(10, 400)])),
        power_source=rng.choice(["power1_average", "power1_input", None]),
        power_instant_watts=maybe(rng, rng.uniform(10, 400), 0.5), power_cap_watts=maybe(rng, 327.0),
        power_cap_max_watts=maybe(rng, 402.0),
        temperatures={s: rng.choice([54.0, rng.uniform(30, 100)]) for s in sensors},
        temperature_limits=rng.choice([{}, {"edge": (100.0, 105.0), "junction": (110.0, None)}]),
        fan_rpm=maybe(rng, rng.choice([1480.0, float(rng.randrange(3000))]), 0.3),
        fan_pwm_ratio=maybe(rng, rng.random()), fan_state=rng.choice([None, None, "passive"]),
        sclk_hz=maybe(rng, rng.choice([2482e6, rng.uniform(5e8, 3e9)])), mclk_hz=maybe(rng, 1249e6),
        sclk_max_hz=maybe(rng, 2950e6), voltage_mv=maybe(rng, rng.uniform(700, 1100)),
        busy_ratio=maybe(rng, rng.choice([0.97, rng.random()])),
        vram_total_bytes=maybe(rng, rng.choice([float(24 << 30), 24 << 30])),
        vram_used_bytes=maybe(rng, float(rng.randrange(24 << 30))), vram_visible_total_bytes=maybe(rng, 256e6),
        pcie_speed_gts=maybe(rng, rng.choice([16.0, 2.5])), pcie_width=maybe(rng, rng.choice([16, 4])),
        pcie_max_speed_gts=maybe(rng, 16.0), pcie_max_width=maybe(rng, 16),
        perf_level=rng.choice(["auto", "manual", None]),
        overdrive=rng.choice([{}, {"OD_SCLK": {"0": 500.0, "1": 2950.0}},
                              {"OD_SCLK": {"0": 500.0, "1": 3000.0}, "OD_MCLK": {"1": 1250.0}}]),
        problems=problems)


def nvml_like(rng, gpu, t):
    """A sample shaped as gpu/nvidia.py makes them: a GPU and maybe an HBM temperature, throttle reasons,
    the driver's reserve, gone when NVML said the GPU is lost."""
    lost = rng.random() < 0.1
    return GpuSample(
        gpu=gpu, vendor="nvidia", model="NVIDIA H200", time=t, state="gone" if lost else "ok",
        power_watts=None if lost else rng.uniform(80, 700), power_source=None if lost else "nvml",
        power_instant_watts=maybe(rng, rng.uniform(80, 750)), power_cap_watts=maybe(rng, 700.0),
        power_cap_max_watts=maybe(rng, 700.0),
        temperatures={} if lost else {k: float(rng.randrange(30, 90)) for k in rng.choice([("gpu", "mem"), ("gpu",)])},
        temperature_limits={} if lost else {"gpu": (89.0, 95.0), "mem": (95.0, None)},
        fan_pwm_ratio=maybe(rng, 0.41, 0.8), fan_state=None if lost else "passive",
        sclk_hz=maybe(rng, rng.choice([1980e6, 345e6])), mclk_hz=maybe(rng, 3201e6), sclk_max_hz=maybe(rng, 1980e6),
        busy_ratio=maybe(rng, rng.randrange(101) / 100), vram_total_bytes=maybe(rng, float(150 << 30)),
        vram_used_bytes=maybe(rng, float(rng.randrange(150 << 30))), vram_reserved_bytes=maybe(rng, 616.0 * 2**20),
        pcie_speed_gts=maybe(rng, 32.0), pcie_width=maybe(rng, 16), pcie_max_speed_gts=maybe(rng, 32.0),
        pcie_max_width=maybe(rng, 16),
        throttle=rng.choice([(), (), ("sw_power_cap",), ("sw_power_cap", "hw_slowdown")]),
        problems={"nvmlDeviceGetPowerUsage": "gone"} if lost else rng.choice([{}, {}, {"fan": "not supported"}]))


def steady(rng, previous, t):
    """Most seconds only the readings move; the settings stay (a copy, not the same objects: equal, not shared)."""
    return replace(previous, time=t, power_watts=rng.uniform(100, 300), busy_ratio=rng.random(),
                   temperatures={k: v + rng.choice([0.0, 1.0]) for k, v in previous.temperatures.items()},
                   problems=dict(previous.problems), overdrive={k: dict(v) for k, v in previous.overdrive.items()})


@pytest.mark.parametrize("seed", range(6))
def test_the_packed_history_is_what_was_added_sample_by_sample(seed):
    rng = random.Random(seed)
    window = rng.choice([5.0, 30.0, 60.0, 900.0])
    ours, reference = FlightRecorder(window), Reference(window)
    previous = {}
    t = 1e9
    for _ in range(400):
        t += rng.choice([1.0, 1.0, 1.0, 0.25, 2.5, 7.0])
        for gpu, shape in ((GPU, amd_like), (OTHER, nvml_like)):
            sample = steady(rng, previous[gpu], t) if gpu in previous and rng.random() < 0.7 else shape(rng, gpu, t)
            previous[gpu] = sample
            ours.add(sample)
            reference.add(sample)
        if rng.random() < 0.02:
            ours.forget(OTHER), reference.forget(OTHER)
            previous.pop(OTHER)
        if rng.random() < 0.1:
            for gpu in (GPU, OTHER, "0000:00:00.0"):
                since = rng.choice([None, t - window / 2, t, t + 1, 0.0])
                assert_same(ours.history(gpu, since), reference.history(gpu, since))
            assert ours.latest().keys() == reference.latest().keys()
            assert all(ours.latest()[gpu] is s for gpu, s in reference.latest().items())
    for gpu in (GPU, OTHER):
        assert_same(ours.history(gpu), reference.history(gpu))


def test_what_equals_the_previous_sample_is_shared_not_copied():
    rng = random.Random(1)
    rec = FlightRecorder()
    first = amd_like(rng, GPU, 1.0)
    rec.add(first)
    rec.add(steady(rng, first, 2.0))
    one, two = rec.history(GPU)
    assert one.overdrive is two.overdrive and one.problems is two.problems


def test_a_real_reader_s_samples_come_back_equal(tmp_path: Path):
    """The amdgpu reader on a fake sysfs (no Radeon here) whose readings move between rounds, a reading lost
    for a while, and a sensor that appears."""
    sysfs = build(tmp_path / "sys", {GPU: "rdna3"})
    hw = next((sysfs / "bus/pci/devices" / GPU / "hwmon").iterdir())
    reader, rng = AmdReader(sysfs / "bus/pci/devices" / GPU, GPU, replan_seconds=10), random.Random(7)
    ours, reference = FlightRecorder(40), Reference(40)
    for i in range(120):
        (hw / "power1_average").write_text(f"{rng.randrange(10**8, 4 * 10**8)}\n")
        (hw / "temp2_input").write_text(f"{rng.randrange(40000, 90000)}\n")
        if i == 85:
            (hw / "fan1_input").write_text("garbage\n")  # not a number: no reading
        if i == 95:
            (hw / "fan1_input").write_text("1500\n")
            (hw / "temp4_input").write_text("33000\n")
        sample = reader.read(1e9 + i)
        ours.add(sample)
        reference.add(sample)
    assert_same(ours.history(GPU), reference.history(GPU))
    assert_same(ours.history(GPU, since=1e9 + 100), reference.history(GPU, since=1e9 + 100))
    assert any(s.fan_rpm is None for s in ours.history(GPU)) and "temp4" in ours.latest()[GPU].temperatures


def sample(gpu, t, watts):
    return GpuSample(gpu=gpu, vendor="amd", model=None, time=t, power_watts=watts)


def test_keeps_the_window_per_gpu_and_the_latest():
    rec = FlightRecorder(window=60)
    for t in range(0, 200, 10):
        rec.add(sample(GPU, float(t), 100.0 + t))
        rec.add(sample(OTHER, float(t), 50.0))
    history = rec.history(GPU)
    assert [s.time for s in history] == [130.0, 140.0, 150.0, 160.0, 170.0, 180.0, 190.0]
    assert [s.power_watts for s in history] == [230.0, 240.0, 250.0, 260.0, 270.0, 280.0, 290.0]
    assert [s.time for s in rec.history(GPU, since=175.0)] == [180.0, 190.0]
    assert rec.latest()[GPU].power_watts == 290.0
    rec.forget(OTHER)
    assert set(rec.latest()) == {GPU} and rec.history(OTHER) == []
    rec.add(sample(OTHER, 200.0, 51.0))  # back after it was forgotten: a fresh ring
    assert [s.power_watts for s in rec.history(OTHER)] == [51.0]


def test_a_window_changed_by_a_reload_trims_at_the_next_sample():
    rec = FlightRecorder(window=900)
    for t in range(100):
        rec.add(sample(GPU, float(t), float(t)))
    rec.window = 10
    rec.add(sample(GPU, 100.0, 100.0))
    assert [s.power_watts for s in rec.history(GPU)] == [float(t) for t in range(90, 101)]


def test_what_leaves_the_window_is_let_go():
    """Traced memory, not time: after the window is full, more samples cost nothing more (they would cost ~100 B
    each were the old ones kept)."""
    rng, rec = random.Random(3), FlightRecorder(window=30)
    latest = amd_like(rng, GPU, 0.0)

    def run(seconds, start):
        nonlocal latest
        for t in range(start, start + seconds):
            latest = steady(rng, latest, float(t))
            rec.add(latest)

    run(1000, 0)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run(5000, 1000)
        del latest
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 20_000, grown
    assert len(rec.history(GPU)) == 31


def test_a_frozen_copy_keeps_what_was_there_when_it_was_taken():
    """What an incident bundle reads off the event loop while the GPU round goes on adding."""
    rng, rec = random.Random(5), FlightRecorder(window=100)
    reference = Reference(100)
    for t in range(150):
        s = amd_like(rng, GPU, float(t))
        rec.add(s), reference.add(s)
    want = reference.history(GPU)
    frozen = rec.frozen()
    for t in range(150, 400):
        rec.add(amd_like(rng, GPU, float(t)))
    assert_same(frozen.history(GPU), want)
    assert frozen.latest()[GPU] is want[-1] and rec.latest()[GPU] is not want[-1]
