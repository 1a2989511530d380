"""The GPU watch's samples as Prometheus series (series_of): labels, units, the limits a card reports, and every
throttle reason its vendor can name at 0 while not slowed. Pure: samples made here."""

from gpuwarden.core import families
from gpuwarden.core.model import GpuSample
from gpuwarden.gpu import vendors
from gpuwarden.gpu.watch import series_of


def test_a_sample_becomes_its_series_in_base_units_with_its_labels():
    sample = GpuSample(gpu="ffff:fe:1f.7", vendor="amd", model="MI300X", time=0.0, power_watts=250.0,
                       voltage_mv=850.0, sclk_hz=2.1e9, vram_used_bytes=4096, pcie_speed_gts=16.0, pcie_width=16,
                       temperatures={"edge": 50.0, "junction": 61.0},
                       temperature_limits={"edge": (90.0, None), "junction": (100.0, 110.0)})
    out = series_of({sample.gpu: sample})
    base = ("ffff:fe:1f.7", "amd", "MI300X")
    assert out[families.GPU_POWER] == {base: 250.0}
    assert out[families.GPU_VOLTAGE] == {base: 0.85}  # volts
    assert out[families.GPU_CLOCK] == {(*base, "sclk"): 2.1e9}  # no mclk read: no series, never a 0
    assert out[families.GPU_VRAM] == {(*base, "used"): 4096.0}
    assert out[families.GPU_PCIE_SPEED] == {(*base, "current"): 16e9}  # transfers a second
    assert out[families.GPU_PCIE_WIDTH] == {(*base, "current"): 16.0}
    assert out[families.GPU_FAN] == out[families.GPU_BUSY] == out[families.GPU_POWER_CAP] == {}
    assert out[families.GPU_TEMPERATURE] == {(*base, "edge"): 50.0, (*base, "junction"): 61.0}
    assert list(out[families.GPU_TEMPERATURE_LIMIT].items()) == [
        ((*base, "edge", "slowdown"), 90.0), ((*base, "junction", "slowdown"), 100.0),
        ((*base, "junction", "shutdown"), 110.0)]


def test_every_reason_a_vendor_can_name_is_a_series_at_0_or_1():
    sample = GpuSample(gpu="ffff:fe:1f.7", vendor="nvidia", model="H100", time=0.0, throttle=("hw_slowdown",))
    throttle = series_of({sample.gpu: sample})[families.GPU_THROTTLE]
    reasons = vendors.named("nvidia").throttle_reasons
    assert {key[3] for key in throttle} == set(reasons) and len(reasons) > 1
    assert {key[3]: value for key, value in throttle.items() if value} == {"hw_slowdown": 1.0}
