"""Telemetry benchmark: one sampling round of 8 GPUs, and the daemon's steady-state CPU and memory with 8
fake GPUs read every second for 60 s, beside Debian's prometheus-node-exporter reading the same fake tree
(`--path.sysfs`, hwmon and drm collectors) scraped every second, in the same run.

    .venv/bin/python bench/telemetry_bench.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fakesysfs import build  # noqa: E402
from figure import figure, load  # noqa: E402
from gpuwarden.config import GpuConfig  # noqa: E402
from gpuwarden.gpu.discovery import discover  # noqa: E402
from gpuwarden.gpu.recorder import FlightRecorder  # noqa: E402
from gpuwarden.gpu.watch import GpuWatch  # noqa: E402
from gpuwarden.model import NullSink  # noqa: E402
from measure import free_port, rss_mb  # noqa: E402

CARDS = ["rdna3", "rdna3", "rdna3", "rdna3", "mi300", "mi300", "rdna4", "rdna4"]
TICK = os.sysconf("SC_CLK_TCK")


def round_cost(sysfs: Path, rounds: int = 200) -> tuple[float, float]:
    """(CPU ms, wall ms) of one sampling round of every GPU, median over `rounds`."""
    gpus = discover(sysfs)
    watch = GpuWatch(GpuConfig(sysfs_root=sysfs, nvml=False), lambda: gpus, NullSink(), FlightRecorder())
    cpu, wall = [], []

    async def go():
        for _ in range(rounds):
            c, w = time.process_time(), time.perf_counter()
            await watch.sample_once()
            cpu.append(time.process_time() - c)
            wall.append(time.perf_counter() - w)

    asyncio.run(go())
    return statistics.median(cpu) * 1000, statistics.median(wall) * 1000


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def steady(pid: int, seconds: float, scrape: str | None = None) -> tuple[float, float]:
    """(% of one core, RSS MB at the end) of `pid` over `seconds`, scraping `scrape` once a second."""
    time.sleep(3)  # start-up is not steady state
    start_cpu, start = cpu_seconds(pid), time.monotonic()
    while time.monotonic() - start < seconds:
        if scrape:
            urllib.request.urlopen(scrape, timeout=5).read()
        time.sleep(1)
    return (cpu_seconds(pid) - start_cpu) / (time.monotonic() - start) * 100, rss_mb(pid)


def daemon_steady(tmp: Path, sysfs: Path, seconds: float) -> tuple[float, float]:
    """`gpuwarden run` on `sysfs` with the exporter off, the kernel source an idle file, no engines."""
    config = tmp / "gw.toml"
    (tmp / "empty.log").touch()
    config.write_text(f'[daemon]\nstate_dir = "{tmp}/state"\n[exporter]\nenabled = false\n'
                      f'[kernel]\nsource = "file"\nfile = "{tmp}/empty.log"\n[engines]\ndiscover = false\n'
                      f'[gpu]\nsysfs_root = "{sysfs}"\ninterval = "1s"\nnvml = false\n[guard]\nenabled = false\n')
    daemon = subprocess.Popen([sys.executable, "-m", "gpuwarden", "--config", str(config), "run"],
                              stderr=subprocess.DEVNULL)
    try:
        return steady(daemon.pid, seconds)
    finally:
        daemon.terminate()
        daemon.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sysfs = build(Path(tmp) / "sys", {f"0000:{0x10 + i * 0x10:02x}:00.0": card for i, card in enumerate(CARDS)})
        cpu_ms, wall_ms = round_cost(sysfs)
        print("## One sampling round, 8 fake GPUs (median of 200)\n")
        print(f"| CPU ms | wall ms |\n|---:|---:|\n| {cpu_ms:.2f} | {wall_ms:.2f} |\n")

        rows = [("gpuwarden run (8 GPUs read every 1 s, rules, recorder; kernel and engine watch idle)",
                 *daemon_steady(Path(tmp), sysfs, args.seconds)),
                ("gpuwarden run with no GPU (the other components' loops)",
                 *daemon_steady(Path(tmp), Path(tmp) / "no-sys", args.seconds))]
        exporter = shutil.which("prometheus-node-exporter")
        if exporter:
            port = free_port()
            node = subprocess.Popen([exporter, f"--path.sysfs={sysfs}", "--collector.disable-defaults",
                                     "--collector.hwmon", "--collector.drm", f"--web.listen-address=127.0.0.1:{port}"],
                                    stderr=subprocess.DEVNULL)
            try:
                time.sleep(1)
                rows.append(("prometheus-node-exporter, hwmon + drm collectors, scraped every 1 s",
                             *steady(node.pid, args.seconds, f"http://127.0.0.1:{port}/metrics")))
            finally:
                node.terminate()
                node.wait(10)
        print(f"## Steady state over {args.seconds:.0f} s\n")
        print("| process | CPU % of one core | RSS MB |\n|---|---:|---:|")
        for name, cpu, rss in rows:
            print(f"| {name} | {cpu:.2f} | {rss:.1f} |")
        _, cpu, rss = rows[0]
        node = rows[2][1:] if len(rows) > 2 else None
        alternative = (f"node-exporter {node[0]:.2f} % of a core, {node[1]:.1f} MB ({load()})" if node
                       else "node-exporter not installed: not compared")
        figure("8 GPUs read every 1 s: CPU", cpu, "% of a core", alternative, "≤ 0.5× node-exporter's",
               cpu <= 0.5 * node[0] if node else None)
        figure("8 GPUs read every 1 s: RSS", rss, "MB",
               f"{alternative}; before issue 27: 50.1 MB at the last make bench", "≤ 35 MB", rss <= 35)


if __name__ == "__main__":
    main()
