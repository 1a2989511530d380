"""The amdgpu reader on faithful fake sysfs trees (fakesysfs.py): the values and states per card kind."""

import pytest

from fakesysfs import GiB, add_gpu, build
from gpuwarden.gpu import amd
from gpuwarden.gpu.discovery import discover


def read(root, bdf):
    return amd.read(root / "bus/pci/devices" / bdf, bdf, 1000.0)


def test_rdna3_reads_everything_and_says_power1_average(tmp_path):
    build(tmp_path, {"0000:03:00.0": "rdna3"})
    s = read(tmp_path, "0000:03:00.0")
    assert s.state == "ok" and s.problems == {}
    assert (s.power_watts, s.power_source, s.power_instant_watts) == (272.0, "power1_average", None)
    assert (s.power_cap_watts, s.power_cap_max_watts) == (327.0, 402.0)
    assert s.temperatures == {"edge": 54.0, "junction": 67.0, "mem": 60.0}
    assert (s.fan_rpm, round(s.fan_pwm_ratio, 3)) == (1480.0, round(96 / 255, 3))
    assert (s.sclk_hz, s.mclk_hz, s.sclk_max_hz) == (2482e6, 1249e6, 2950e6)
    assert (s.voltage_mv, s.busy_ratio) == (1012.0, 0.97)
    assert (s.vram_total_bytes, s.vram_used_bytes, s.vram_visible_total_bytes) == (24 * GiB, 21 * GiB, 24 * GiB)
    assert (s.pcie_speed_gts, s.pcie_width, s.pcie_max_speed_gts, s.pcie_max_width) == (16.0, 16, 16.0, 16)
    assert s.perf_level == "auto" and s.model == "Radeon RX 7900 XTX"
    assert s.overdrive == {"OD_SCLK": {"0": 500.0, "1": 2950.0}, "OD_MCLK": {"0": 97.0, "1": 1250.0},
                           "OD_VDDGFX_OFFSET": {"": 0.0}}


def test_mi300_has_power1_input_only_and_no_edge_or_fan(tmp_path):
    build(tmp_path, {"0000:83:00.0": "mi300"})
    s = read(tmp_path, "0000:83:00.0")
    assert (s.power_watts, s.power_source) == (138.0, "power1_input")
    assert s.temperatures == {"junction": 45.0, "mem": 41.0}
    assert s.fan_rpm is None and s.fan_pwm_ratio is None and s.state == "ok"
    assert (s.sclk_hz, s.sclk_max_hz) == (132e6, 2100e6)


def test_apu_has_no_cap_no_fan_and_an_unknown_link(tmp_path):
    build(tmp_path, {"0000:c4:00.0": "apu"})
    s = read(tmp_path, "0000:c4:00.0")
    assert s.temperatures == {"edge": 48.0} and s.power_cap_watts is None and s.fan_rpm is None
    assert s.voltage_mv == 780.0 and s.mclk_hz is None and s.pcie_speed_gts is None
    assert s.model is None and s.state == "ok"


def test_rdna4_unindexed_sclk_offset(tmp_path):
    build(tmp_path, {"0000:0a:00.0": "rdna4"})
    assert read(tmp_path, "0000:0a:00.0").overdrive["OD_SCLK_OFFSET"] == {"": -150.0}


@pytest.mark.parametrize(("text", "want"), [
    ("OD_SCLK_OFFSET:\n0: -500Mhz\n1: 1000Mhz\n", {"OD_SCLK_OFFSET": {"0": -500.0, "1": 1000.0}}),  # before 2025
    ("OD_SCLK_OFFSET:\n0Mhz\nOD_RANGE:\nSCLK_OFFSET: -500Mhz 1000Mhz\n", {"OD_SCLK_OFFSET": {"": 0.0}}),
    ("garbage\n", {}),
])
def test_overdrive_layouts(text, want):
    assert amd.parse_overdrive(text) == want


def test_fine_grained_dpm_and_unavailable_levels(tmp_path):
    add_gpu(tmp_path, "0000:03:00.0", "rdna3", {"pp_dpm_sclk": "unavailable", "freq1_input": None,
                                                 "freq1_label": None})
    s = read(tmp_path, "0000:03:00.0")
    assert s.sclk_hz is None and s.sclk_max_hz is None and s.state == "ok"


def test_discovery_keys_gpus_by_pci_address_not_hwmon_index(tmp_path):
    build(tmp_path, {"0000:83:00.0": "mi300", "0000:03:00.0": "rdna3"})
    assert [(g.pci, g.vendor, g.driver) for g in discover(tmp_path)] == [
        ("0000:03:00.0", "amd", "amdgpu"), ("0000:83:00.0", "amd", "amdgpu")]


def test_the_asics_own_temperature_limits_are_read(tmp_path):
    """amdgpu's hwmon temp<N>_crit (the SMU throttles) and temp<N>_emergency (it shuts the ASIC down), in
    millidegrees; written into a temporary tree (no Radeon here)."""
    from gpuwarden.gpu.amd import AmdReader

    hw = tmp_path / "hwmon" / "hwmon3"
    hw.mkdir(parents=True)
    for name, text in (("name", "amdgpu"), ("temp1_input", "45000"), ("temp1_label", "edge"),
                       ("temp1_crit", "100000"), ("temp1_emergency", "105000"), ("temp2_input", "60000"),
                       ("temp2_label", "junction"), ("temp2_crit", "110000"), ("temp2_emergency", "115000"),
                       ("temp3_input", "50000"), ("temp3_label", "mem")):
        (hw / name).write_text(text + "\n")
    sample = AmdReader(tmp_path, "0000:03:00.0").read(1.0)
    assert sample.temperatures == {"edge": 45.0, "junction": 60.0, "mem": 50.0}
    assert sample.temperature_limits == {"edge": (100.0, 105.0), "junction": (110.0, 115.0)}


def test_a_name_or_label_that_cannot_be_read_leaves_it_unnamed_not_the_gpu_unread(tmp_path):
    """The plan reads each folder's listing once, then the few names it needs: a product_name or a sensor's label
    that cannot be read (here a folder where the file was; amdgpu answers some with an error on some ASICs) gives
    no model and the sensor's own name, and the rest of the GPU is read. Before, the error ended the read of the
    GPU, every round."""
    build(tmp_path, {"0000:03:00.0": "rdna3"})
    device = tmp_path / "bus/pci/devices/0000:03:00.0"
    [hw] = device.glob("hwmon/hwmon*")
    for unreadable in (device / "product_name", hw / "temp2_label"):
        unreadable.unlink()
        unreadable.mkdir()
    s = read(tmp_path, "0000:03:00.0")
    assert s.state == "ok" and s.model is None and s.power_watts == 272.0
    assert s.temperatures == {"edge": 54.0, "temp2": 67.0, "mem": 60.0}
