"""Telemetry benchmark: one sampling round of 8 GPUs, and the daemon's steady-state CPU and memory with 8 (then 32)
fake GPUs read every second and its /metrics scraped every second, side by side with Debian's prometheus-node-exporter
reading the same fake tree (`--path.sysfs`, hwmon and drm collectors) scraped every second: the same work for
Prometheus, both at once, measured over the same windows, so each window's ratio compares the two under one moment
of a shared, noisy machine.

    .venv/bin/python bench/telemetry_bench.py [--seconds 30] [--windows 3]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.client
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fakesysfs import build  # noqa: E402
from figure import figure, load  # noqa: E402
from gpuwarden.config.settings import GpuConfig  # noqa: E402
from gpuwarden.core.model import NullSink  # noqa: E402
from gpuwarden.gpu.amd import AmdReader  # noqa: E402
from gpuwarden.gpu.discovery import discover  # noqa: E402
from gpuwarden.gpu.recorder import FlightRecorder  # noqa: E402
from gpuwarden.gpu.watch import GpuWatch  # noqa: E402
from measure import free_port, rss_mb  # noqa: E402

CARDS = ["rdna3", "rdna3", "rdna3", "rdna3", "mi300", "mi300", "rdna4", "rdna4"]


def round_cost(sysfs: Path, rounds: int = 200) -> tuple[float, float]:
    """(CPU ms, wall ms) of one sampling round of every GPU, its readings moving, median over `rounds` (the process's
    CPU: the round's reads are made by the watch's reader thread)."""
    gpus, files = discover(sysfs), readings(sysfs)
    watch = GpuWatch(GpuConfig(sysfs_root=sysfs, nvml=False), lambda: gpus, NullSink(), FlightRecorder())
    watch.open()  # the vendors' readers, as the daemon's watch opens them: without them a round reads nothing
    cpu, wall = [], []

    async def go():
        for i in range(rounds):
            move(files, i)
            c, w = time.process_time(), time.perf_counter()
            if (read := len(await watch.sample_once())) != len(gpus):
                raise SystemExit(f"telemetry_bench: a round read {read} of {len(gpus)} GPUs")
            cpu.append(time.process_time() - c)
            wall.append(time.perf_counter() - w)

    asyncio.run(go())
    return statistics.median(cpu) * 1000, statistics.median(wall) * 1000


def readings(sysfs: Path) -> list[tuple[str, int, int]]:
    """The files of a busy GPU's readings that move each second: (path, base, step) of power, temperatures,
    clock, load and VRAM in use (the fake tree is otherwise still, and a recorder that keeps what changed would
    look better on it than on a GPU)."""
    out = []
    for hw in sorted(sysfs.glob("class/hwmon/hwmon*")):
        hw, device = hw.resolve(), hw.resolve().parents[1]
        for name, base, step in (("power1_average", 150_000_000, 1_004_321), ("power1_input", 150_000_000, 1_004_321),
                                 ("temp1_input", 40000, 311), ("temp2_input", 41000, 313), ("temp3_input", 42000, 317),
                                 ("freq1_input", 500_000_000, 25_000_000)):
            if (hw / name).exists():
                out.append((str(hw / name), base, step))
        out += [(str(device / "gpu_busy_percent"), 0, 1), (str(device / "mem_info_vram_used"), 1 << 30, 4_083_712)]
    return out


def move(files: list[tuple[str, int, int]], second: int) -> None:
    for i, (path, base, step) in enumerate(files):
        with open(path, "w") as f:
            f.write(f"{base + (second * 7 + i * 13) % 97 * step}\n")


def recorder_mb(sysfs: Path, seconds: int) -> tuple[float, float, float]:
    """The flight recorder once full: `seconds` of samples of every GPU (one a second, their readings moving),
    traced: (MB, µs an add() of a sample costs once it is full, ms the history() of one GPU costs). The daemon's
    RSS is read a minute or two after its start, long before its recorder holds its whole window."""
    readers = [AmdReader(sysfs / "bus/pci/devices" / g.pci, g.pci) for g in discover(sysfs)]
    recorder, files = FlightRecorder(seconds), readings(sysfs)
    for reader in readers:  # its plan (open files, labels) is the daemon's from its first round: not the recorder's
        reader.read(1e9 - 1)
    gc.collect()
    tracemalloc.start()
    try:
        for i in range(seconds):
            move(files, i)
            for reader in readers:
                recorder.add(reader.read(1e9 + i))
        gc.collect()
        mb = tracemalloc.get_traced_memory()[0] / 1e6
    finally:
        tracemalloc.stop()
    more = []
    for i in range(seconds, seconds + 60):
        move(files, i)
        more += [reader.read(1e9 + i) for reader in readers]
    start = time.perf_counter()
    for sample in more:
        recorder.add(sample)
    add_us = (time.perf_counter() - start) / len(more) * 1e6
    start = time.perf_counter()
    recorder.history(readers[0].pci)
    return mb, add_us, (time.perf_counter() - start) * 1000


def cpu_seconds(pid: int) -> float:
    """CPU time of the whole process `pid` (every thread, those that have exited too), in ns of the scheduler's
    own count: its CPU-time clock (clock_getcpuclockid; the clock id is the kernel's MAKE_PROCESS_CPUCLOCK).
    /proc/<pid>/stat counts in 10 ms ticks (a 0.3 % process gets a few per window); schedstat per thread misses
    the short-lived ones (gpuwarden runs each blocking call in a thread of its own)."""
    return time.clock_gettime((~pid << 3) | 2)


def windows(pids: dict[str, int], count: int, seconds: float, scrapes: list[str],
            keep_alive: bool = False, moving: list[tuple[str, int, int]] = ()) -> list[dict[str, float]]:
    """% of one core of each process over `count` windows of `seconds`, scraping each of `scrapes` once a second
    (as Prometheus would: node-exporter reads sysfs when scraped, gpuwarden renders what it read): a new connection
    each scrape (urllib), or with `keep_alive` one connection each kept, as Prometheus keeps them. The readings
    of `moving` (readings()) change each second, as a working GPU's do: on a still tree, a reading and a series
    written from one that did not change cost less than on a GPU."""
    time.sleep(3)  # start-up is not steady state
    out, second = [], 0
    kept = {url: http.client.HTTPConnection(urllib.parse.urlsplit(url).netloc, timeout=5) for url in scrapes}
    for _ in range(count):
        start_cpu, start = {name: cpu_seconds(pid) for name, pid in pids.items()}, time.monotonic()
        while time.monotonic() - start < seconds:
            move(moving, second)
            second += 1
            for url in scrapes:
                if keep_alive:
                    kept[url].request("GET", "/metrics")
                    kept[url].getresponse().read()
                else:
                    urllib.request.urlopen(url, timeout=5).read()
            time.sleep(1)
        took = time.monotonic() - start
        out.append({name: (cpu_seconds(pid) - start_cpu[name]) / took * 100 for name, pid in pids.items()})
    return out


def daemon(tmp: Path, sysfs: Path, name: str, port: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`gpuwarden run` on `sysfs` with its exporter on `port`, the kernel source an idle file, no engines (`env`:
    another tree's src on PYTHONPATH, for scrape_bench)."""
    config = tmp / f"{name}.toml"
    (tmp / "empty.log").touch()
    config.write_text(f'[daemon]\nstate_dir = "{tmp}/{name}"\n[exporter]\nlisten = "127.0.0.1:{port}"\n'
                      f'[kernel]\nsource = "file"\nfile = "{tmp}/empty.log"\n[engines]\ndiscover = false\n'
                      f'[gpu]\nsysfs_root = "{sysfs}"\ninterval = "1s"\nnvml = false\n[guard]\nenabled = false\n')
    return subprocess.Popen([sys.executable, "-m", "gpuwarden", "--config", str(config), "run"],
                            stderr=subprocess.DEVNULL, env=env)


def stopped(*processes: subprocess.Popen) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(10)


def side_by_side(tmp: Path, sysfs: Path, args: argparse.Namespace) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Two daemons on `sysfs` (exporter on, as by default; one scraped every second, one not) and node-exporter on
    the same tree, scraped every second, all at once: each window's CPU of each ("reads", "scraped", "node"), and
    their RSS at the end ("node" absent where node-exporter is not installed)."""
    exporter, ports = shutil.which("prometheus-node-exporter"), {"reads": free_port(), "scraped": free_port()}
    procs = {name: daemon(tmp, sysfs, f"{sysfs.name}-{name}", port) for name, port in ports.items()}
    scrapes = [f"http://127.0.0.1:{ports['scraped']}/metrics"]
    try:
        if exporter:
            port = free_port()
            procs["node"] = subprocess.Popen([exporter, f"--path.sysfs={sysfs}", "--collector.disable-defaults",
                                              "--collector.hwmon", "--collector.drm",
                                              f"--web.listen-address=127.0.0.1:{port}"], stderr=subprocess.DEVNULL)
            scrapes.append(f"http://127.0.0.1:{port}/metrics")
        side = windows({name: p.pid for name, p in procs.items()}, args.windows, args.seconds, scrapes,
                       not args.new_connections, readings(sysfs))
        return side, {name: rss_mb(p.pid) for name, p in procs.items()}
    finally:
        stopped(*procs.values())


def ratio_figure(what: str, name: str, side: list[dict[str, float]], rss: dict[str, float], how: str, goal: float,
                 gpus: int) -> None:
    """`what`'s figure: the median window's CPU of daemon `name`, judged by that window's own ratio to
    node-exporter's (the median of node-exporter's over every window would mix two windows: 0.265 % in one at
    0.40x read as met)."""
    if "node" not in rss:
        figure(what, statistics.median(w[name] for w in side), "% of a core",
               "node-exporter not installed: not compared", f"≤ {goal}× node-exporter's (issue 40)", None)
        return
    ratios = sorted((w[name] / w["node"], w[name]) for w in side)
    ratio, cpu = ratios[(len(ratios) - 1) // 2]  # the median window (the lower one of an even count)
    node_cpu = statistics.median(w["node"] for w in side)
    figure(what, cpu, "% of a core",
           f"node-exporter on the same {gpus} GPUs, scraped every 1 s ({how}): {node_cpu:.2f} % of a core (median), "
           f"{rss['node']:.1f} MB; the median window's ratio {ratio:.2f}, the {len(side)} windows' "
           f"{', '.join(f'{r:.2f}' for r, _ in ratios)}, measured at once ({load()})",
           f"≤ {goal}× node-exporter's (issue 40)", ratio <= goal)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30, help="each window's length")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--new-connections", action="store_true",
                        help="a new connection each scrape (urllib), not one kept connection each as Prometheus keeps")
    args = parser.parse_args()
    how = "a new connection each scrape" if args.new_connections else "over kept connections, as Prometheus scrapes"
    with tempfile.TemporaryDirectory() as tmp:
        sysfs = build(Path(tmp) / "sys", {f"0000:{0x10 + i * 0x10:02x}:00.0": card for i, card in enumerate(CARDS)})
        many = build(Path(tmp) / "sys32", {f"0000:{0x10 + i:02x}:00.0": CARDS[i % len(CARDS)] for i in range(32)})
        print("## One sampling round, readings moving (median of 200)\n\n| GPUs | CPU ms | wall ms |\n|---:|---:|---:|")
        for tree in (sysfs, many):
            cpu_ms, wall_ms = round_cost(tree)
            print(f"| {len(discover(tree))} | {cpu_ms:.2f} | {wall_ms:.2f} |")
        print()
        side, rss = side_by_side(Path(tmp), sysfs, args)
        side32, rss32 = side_by_side(Path(tmp), many, args)
        bare_port = free_port()
        bare = daemon(Path(tmp), Path(tmp) / "no-sys", "bare", bare_port)
        try:
            alone = windows({"bare": bare.pid}, 1, args.seconds, [])[0]["bare"]
            bare_rss = rss_mb(bare.pid)
        finally:
            stopped(bare)

        node = "node" in rss
        # the RSS read after `took` s, plus what the recorder still grows by to its whole window (linear in time)
        window, took = GpuConfig().recorder_window, 3 + args.windows * args.seconds
        full, add_us, history_ms = recorder_mb(sysfs, int(window))
        steady = rss["reads"] + full * max(0.0, 1 - took / window)
        for gpus, windows_of in ((8, side), (32, side32)):
            print(f"## {gpus} GPUs side by side, {args.windows} windows of {args.seconds:.0f} s, all at once, {how} "
                  f"({load()})\n")
            print(f"| window | gpuwarden run, {gpus} GPUs read every 1 s: CPU % of one core | the same, its /metrics "
                  "scraped every 1 s | node-exporter, hwmon + drm, scraped every 1 s | ratios |\n"
                  "|---:|---:|---:|---:|---:|")
            for i, w in enumerate(windows_of, 1):
                ratios = f"{w['reads'] / w['node']:.2f}, {w['scraped'] / w['node']:.2f}" if node else "—"
                print(f"| {i} | {w['reads']:.3f} | {w['scraped']:.3f} | {w.get('node', float('nan')):.3f} | "
                      f"{ratios} |")
            print()
        print("| process | CPU % of one core, median | RSS MB |\n|---|---:|---:|")
        print(f"| gpuwarden run (8 GPUs read every 1 s, rules, recorder, exporter on; kernel and engine watch idle) | "
              f"{statistics.median(w['reads'] for w in side):.3f} | {rss['reads']:.1f} |")
        print(f"| the same, its /metrics scraped every 1 s | {statistics.median(w['scraped'] for w in side):.3f} | "
              f"{rss['scraped']:.1f} |")
        print(f"| gpuwarden run with no GPU (the other components' loops) | {alone:.3f} | {bare_rss:.1f} |")
        if node:
            print(f"| prometheus-node-exporter, hwmon + drm collectors, scraped every 1 s | "
                  f"{statistics.median(w['node'] for w in side):.3f} | {rss['node']:.1f} |")
        print(f"| gpuwarden's flight recorder once its {window:.0f} s window is full (8 GPUs, readings moving, traced; "
              f"{full * 1e6 / window / 8:.0f} B a sample, add() {add_us:.1f} µs, one GPU's history() "
              f"{history_ms:.1f} ms) | | {full:.1f} |")

        ratio_figure("8 GPUs read every 1 s: CPU", "reads", side, rss, how, 0.3, 8)
        ratio_figure("8 GPUs read every 1 s, its /metrics scraped every 1 s: CPU", "scraped", side, rss, how, 0.3, 8)
        ratio_figure("32 GPUs read every 1 s: CPU", "reads", side32, rss32, how, 0.25, 32)
        ratio_figure("32 GPUs read every 1 s, its /metrics scraped every 1 s: CPU", "scraped", side32, rss32, how,
                     0.25, 32)
        figure("8 GPUs read every 1 s: RSS, recorder full", steady, "MB",
               f"{rss['reads']:.1f} MB read after {took:.0f} s, and the flight recorder's growth to its {window:.0f} "
               f"s window ({full:.1f} MB when full); node-exporter {rss.get('node', float('nan')):.1f} MB; before "
               "issue 27: 50.1 MB at 60 s", "≤ 35 MB", steady <= 35)


if __name__ == "__main__":
    main()
