"""GPU telemetry in the real daemon over fake sysfs trees (no Radeon here), a read that blocks for good (a FIFO
where a sysfs file should be), and real errnos through a FUSE mount (EBUSY, EREMOTEIO, ENODEV)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_port, wait_for

from fakesysfs import build
from gpuwarden.gpu import amd

FAULTFS = Path(__file__).parents[1] / "faultfs.py"


def gpu_config(root: Path) -> str:
    return (f'[gpu]\nsysfs_root = "{root}"\ninterval = "300ms"\nread_deadline = "1s"\nnvml = false\n'
            '[guard]\nenabled = false\n')


def metric_value(text: str, prefix: str) -> float | None:
    line = next((x for x in text.splitlines() if x.startswith(prefix)), None)
    return float(line.rsplit(" ", 1)[1]) if line else None


def test_a_blocked_read_is_gpu_unresponsive_while_the_rest_carries_on(daemon_factory, notify_socket, tmp_path):
    root = build(tmp_path / "sys", {"0000:03:00.0": "rdna3", "0000:83:00.0": "mi300"})
    stuck = root / "devices/pci0000:00/0000:83:00.0/gpu_busy_percent"
    stuck.unlink()
    os.mkfifo(stuck)  # opening it for reading never returns: a GPU hung in D state
    d = daemon_factory(gpu_config(root), env={"NOTIFY_SOCKET": notify_socket.path, "WATCHDOG_USEC": "1000000"})
    d.start()
    d.wait_serving()
    event = wait_for(lambda: next((e for e in d.events() if e["kind"] == "gpu_unresponsive"), None), 10,
                     what="gpu_unresponsive")
    assert event["gpu"] == "0000:83:00.0" and event["severity"] == "critical"
    power = 'gpuwarden_gpu_power_watts{gpu="0000:03:00.0",model="Radeon RX 7900 XTX",vendor="amd"}'
    # the other GPU's next reading, handed to a fresh worker at the round that gave up, exported the round after
    wait_for(lambda: metric_value(d.metrics(), power) == 272.0, 5, what="the other GPU read by a fresh worker")
    (root / "devices/pci0000:00/0000:03:00.0/hwmon/hwmon1/power1_average").write_text("301000000\n")
    wait_for(lambda: metric_value(d.metrics(), power) == 301.0, 5, what="the other GPU to keep being read")
    after = len(notify_socket.messages)
    notify_socket.wait("WATCHDOG=1", after=after, timeout=3)  # the loop is healthy: the watchdog keeps going
    text = d.metrics()
    assert 'gpuwarden_gpu_reader_up{gpu="0000:83:00.0",model="",vendor="amd"} 0.0' in text
    assert 'gpuwarden_gpu_temperature_celsius{gpu="0000:03:00.0",model="Radeon RX 7900 XTX",sensor="junction",' \
           'vendor="amd"} 67.0' in text
    assert 'gpuwarden_gpu_clock_hz{clock="sclk",gpu="0000:03:00.0"' in text
    assert 'gpuwarden_gpu_vram_bytes{gpu="0000:03:00.0",kind="used"' in text
    assert d.stop() == 0  # the hung read thread does not hold the exit


def test_a_gpu_that_disappears_is_gpu_missing(daemon_factory, tmp_path):
    root = build(tmp_path / "sys", {"0000:03:00.0": "rdna3", "0000:0a:00.0": "rdna4"})
    d = daemon_factory(gpu_config(root)).start()
    d.wait_serving()
    (root / "bus/pci/devices/0000:0a:00.0").unlink()
    event = wait_for(lambda: next((e for e in d.events() if e["kind"] == "gpu_missing"), None), 15,
                     what="gpu_missing")
    assert event["gpu"] == "0000:0a:00.0"
    def gauges_of_the_vanished_gpu():  # counters (read errors) keep their series, as Prometheus counters do;
        # its gpu_lost condition, and the incident it opened, stay with its label until it is back
        return [line for line in d.metrics().splitlines() if 'gpu="0000:0a:00.0"' in line
                and not line.startswith(("gpuwarden_gpu_read_errors_total", "gpuwarden_condition{",
                                         "gpuwarden_incident{"))]
    wait_for(lambda: not gauges_of_the_vanished_gpu(), 5, what="the vanished GPU's series to be dropped")
    assert 'gpuwarden_condition{condition="gpu_lost",engine="",gpu="0000:0a:00.0",subject="0000:0a:00.0"} 1.0' \
        in d.metrics().splitlines()
    assert d.stop() == 0


def test_status_prints_every_gpu(tmp_path):
    root = build(tmp_path / "sys", {"0000:03:00.0": "rdna3", "0000:83:00.0": "mi300"})
    cfg = tmp_path / "gw.toml"
    # a port nothing listens on: a gpuwarden running on this machine (the README's `make run`) must not answer
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path}"\n[exporter]\nport = {free_port()}\n' + gpu_config(root))
    out = subprocess.run([sys.executable, "-m", "gpuwarden", "--config", str(cfg), "status"], capture_output=True,
                         text=True, timeout=60).stdout
    assert "0000:03:00.0  amd    Radeon RX 7900 XTX     ok" in out and "272 W" in out and "junction=67" in out
    assert "AMD Instinct MI300X" in out and "138 W" in out
    js = subprocess.run([sys.executable, "-m", "gpuwarden", "--config", str(cfg), "status", "--json"],
                        capture_output=True, text=True, timeout=60).stdout
    assert '"power_source": "power1_input"' in js and '"power_source": "power1_average"' in js


@pytest.mark.root
@pytest.mark.parametrize(("fault", "file", "state"), [
    ("EBUSY", "hwmon/hwmon1/power1_average", "not_readable"),  # resetting or suspended (6.18+)
    ("EPERM", "gpu_busy_percent", "not_readable"),  # the same, older kernels
    ("EREMOTEIO", "hwmon/hwmon1/temp2_input", "gone"),  # the SMU answered 0xFFFFFFFF: off the bus
    ("ENODEV", "mem_info_vram_used", "gone"),  # removed under an open file
])
def test_read_errors_mean_not_readable_or_gone(tmp_path, fault, file, state):
    source = build(tmp_path / "src", {"0000:03:00.0": "rdna3"})
    mount = tmp_path / "mnt"
    mount.mkdir()
    rel = f"devices/pci0000:00/0000:03:00.0/{file}"
    fs = subprocess.Popen([sys.executable, str(FAULTFS), str(source), str(mount), f"{rel}={fault}"])
    try:
        wait_for(lambda: (mount / "bus").exists(), 10, what="the FUSE mount")
        s = amd.read(mount / "bus/pci/devices/0000:03:00.0", "0000:03:00.0", time.time())
        assert s.state == state
        assert list(s.problems.values()) == ["busy" if state == "not_readable" else "gone"]
        assert s.temperatures.get("edge") == 54.0  # everything else still read
    finally:
        subprocess.run(["umount", str(mount)], check=False)
        fs.wait(10)
