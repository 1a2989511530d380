from gpuwarden.gpu.recorder import FlightRecorder
from gpuwarden.model import GpuSample


def sample(gpu, t, watts):
    return GpuSample(gpu=gpu, vendor="amd", model=None, time=t, power_watts=watts)


def test_keeps_the_window_per_gpu_and_the_latest():
    rec = FlightRecorder(window=60)
    for t in range(0, 200, 10):
        rec.add(sample("0000:03:00.0", float(t), 100.0 + t))
        rec.add(sample("0000:83:00.0", float(t), 50.0))
    history = rec.history("0000:03:00.0")
    assert [s.time for s in history] == [130.0, 140.0, 150.0, 160.0, 170.0, 180.0, 190.0]
    assert [s.time for s in rec.history("0000:03:00.0", since=175.0)] == [180.0, 190.0]
    assert rec.latest()["0000:03:00.0"].power_watts == 290.0
    rec.forget("0000:83:00.0")
    assert set(rec.latest()) == {"0000:03:00.0"} and rec.history("0000:83:00.0") == []
