"""The exporter as Prometheus' conventions want it, checked by the real promtool on the real daemon's /metrics:
the daemon's process_* metrics, ratios and base units, counters named _total; the old names are gone."""

import subprocess

from helpers import TEST_GPU, need, wait_for

from fakesysfs import build

OLD_NAMES = ("gpuwarden_engine_cpu_percent", "gpuwarden_gpu_pcie_link_speed_gigatransfers",
             "gpuwarden_store_dropped_writes ")

WANTED = ("gpuwarden_engine_cpu_ratio{", "gpuwarden_gpu_pcie_link_speed_transfers_per_second{",
          "gpuwarden_store_dropped_writes_total ")


def test_promtool_finds_nothing_to_say_about_the_metrics(daemon_factory, fake_engine, tmp_path):
    promtool = need("promtool")
    engine = fake_engine("progress")
    root = build(tmp_path / "sys", {TEST_GPU: "rdna3"})
    d = daemon_factory(f'[gpu]\nsysfs_root = "{root}"\nnvml = false\n[guard]\nenabled = false\n'
                       f'[[engine]]\nname = "fake"\nmetrics_url = "{engine.url}"\nscrape_interval = "0.5s"\n').start()
    d.wait_serving()

    def complete():
        text = d.metrics()
        return text if all(f in text for f in WANTED) else None
    text = wait_for(complete, 15, 0.2, "every family of interest")
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0 and not lint.stdout.strip() and "problem" not in lint.stderr, lint.stdout + lint.stderr
    for family in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
                   "process_start_time_seconds"):
        assert f"\n{family} " in text, f"{family} is missing"
    assert "# TYPE gpuwarden_store_dropped_writes_total counter" in text
    speed = next(line for line in text.splitlines()
                 if line.startswith("gpuwarden_gpu_pcie_link_speed_transfers_per_second{") and 'link="max"' in line)
    assert float(speed.rsplit(" ", 1)[1]) >= 2.5e9  # transfers per second, not GT/s
    cpu = next(line for line in text.splitlines() if line.startswith('gpuwarden_engine_cpu_ratio{engine="fake"}'))
    assert 0 <= float(cpu.rsplit(" ", 1)[1]) < 4  # a share of one core, not a percent
    assert not [name for name in OLD_NAMES if name in text]
    assert d.stop() == 0
