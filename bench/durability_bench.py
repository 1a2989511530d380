"""Durability benchmark (issue 14): the real daemon under a store held by another process and under hostile
/metrics, with what it costs the event loop and memory.

    .venv/bin/python bench/durability_bench.py [--hold SECONDS]

Locked store: a second process holds `BEGIN EXCLUSIVE` on the daemon's database for --hold seconds while a
ring timeout on a new GPU is written to the followed log every second; the clock runs from each line written
to its alert at a loopback receiver. Hostile /metrics: a 7.7 MB body of 110,000 vLLM series (refused above
MAX_SERIES), the same size of other metrics around a real sample (parsed off the loop), and a server that
sends one byte a second. A kernel-line flood: 50,000 page-fault lines a second for 10 s. For each: the
largest `gpuwarden_loop_lag_seconds` seen (sampled every 0.2 s: the
gauge shows a block while it lasts) and the daemon's peak RSS (VmHWM).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "integration"), str(ROOT / "tests")]

from helpers import Daemon, Receiver, wait_for  # noqa: E402
from test_durability import RING, Hostile, big_body  # noqa: E402
from test_flood import observe_flood  # noqa: E402

from faults import LockHolder  # noqa: E402


def lag(d: Daemon) -> float:
    m = re.search(r"^gpuwarden_loop_lag_seconds (\S+)", d.metrics(), re.M)
    return float(m.group(1)) if m else 0.0


def peak_rss_mb(d: Daemon) -> float:
    text = Path(f"/proc/{d.proc.pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", text).group(1)) / 1024


def watch(d: Daemon, seconds: float, each=lambda i: None, tick=lambda: None) -> float:
    """The largest loop lag over `seconds`, calling each(i) once a second and tick() every sample."""
    worst, start, i = 0.0, time.monotonic(), 0
    while time.monotonic() - start < seconds:
        if time.monotonic() - start >= i:
            each(i)
            i += 1
        tick()
        worst = max(worst, lag(d))
        time.sleep(0.2)
    return worst


def locked_store(hold: float) -> None:
    receiver = Receiver().start()
    tmp = Path(tempfile.mkdtemp())
    d = Daemon(tmp, f'[alerts]\ngroup_window = "0s"\nurls = ["json://127.0.0.1:{receiver.port}/hook"]\n').start()
    d.wait_serving()
    holder = LockHolder(d.state / "gpuwarden.db")
    written: dict[str, float] = {}
    alerted: dict[str, float] = {}

    def fault(i: int) -> None:
        gpu = f"GPU 0000:{0x40 + i:02x}:00.0"
        written[gpu] = time.monotonic()
        with d.log_file.open("a") as f:
            f.write(RING.format(bus=f"{0x40 + i:02x}"))

    def arrivals() -> None:
        for body in receiver.json_bodies():  # a page's title names the GPU ("host: GPU 0000:40:00.0 ring ...")
            for gpu in written:
                if f"{gpu} " in body["title"] + " ":
                    alerted.setdefault(gpu, time.monotonic())

    worst = watch(d, hold, fault, arrivals)
    wait_for(lambda: arrivals() or len(alerted) == len(written), 30)
    delays = sorted(alerted[g] - written[g] for g in written)
    release = time.monotonic()
    holder.release()
    wait_for(lambda: sum(e["kind"] == "ring_timeout" for e in d.events()) == len(written), 60, interval=0.2)
    flushed = time.monotonic() - release
    print(f"locked store, held {hold:.0f} s, one fault a second ({len(written)}): each alerted while locked "
          f"(line to alert median {statistics.median(delays):.2f} s, max {delays[-1]:.2f} s, loop sampled every "
          f"0.2 s); max loop lag {worst:.3f} s; all stored {flushed:.1f} s after release; "
          f"peak RSS {peak_rss_mb(d):.0f} MB")
    d.stop()
    receiver.stop()


def hostile_metrics(name: str, server: Hostile, seconds: float = 20) -> None:
    tmp = Path(tempfile.mkdtemp())
    try:  # the server is a child that holds make bench's output pipe: never left behind
        d = Daemon(tmp, f'[[engine]]\nname = "e"\nmetrics_url = "{server.url}"\nprofile = "vllm"\n'
                        f'scrape_interval = "1s"\nscrape_timeout = "1s"\n').start()
        d.wait_serving()
        worst = watch(d, seconds)
        metrics = d.metrics()
        ok = re.search(r'gpuwarden_engine_up\{engine="e"\} (\S+)', metrics)
        fails = dict(re.findall(r'gpuwarden_engine_scrape_failures_total\{engine="e",reason="(\w+)"\} (\S+)', metrics))
        print(f"{name}: {seconds:.0f} s of 1 s scrapes: up={ok and ok.group(1)} failures={fails or 'none'}; "
              f"max loop lag {worst:.3f} s; peak RSS {peak_rss_mb(d):.0f} MB")
        d.stop()
    finally:
        server.stop()


def kernel_flood(rate: int, seconds: float) -> None:
    """Page-fault lines appended to the followed log at `rate` a second; the old sources read all of it in one
    go on the loop."""
    d = Daemon(Path(tempfile.mkdtemp()), '[engines]\ndiscover = false\n').start()
    d.wait_serving()
    seen = observe_flood(d, rate, seconds)
    print(f"kernel flood, {rate:,} page-fault lines/s for {seconds:.0f} s: all {seen['written']:,} read and "
          f"classified in {seen['seconds']:.1f} s ({seen['written'] / seen['seconds']:,.0f} lines/s held); "
          f"max loop lag {seen['lag']:.2f} s; peak RSS {seen['rss_mb']:.0f} MB")
    d.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hold", type=float, default=30.0)
    args = parser.parse_args()
    locked_store(args.hold)
    kernel_flood(50_000, 10)
    tmp = Path(tempfile.mkdtemp())
    hostile_metrics("7.7 MB, 110,000 vLLM series", Hostile("body", str(big_body(tmp / "a.prom", 110_000, 0))))
    hostile_metrics("7.7 MB, 110,000 other series", Hostile("body", str(big_body(tmp / "b.prom", 2, 110_000))))
    hostile_metrics("slowloris, 1 byte/s", Hostile("slowloris"))


if __name__ == "__main__":
    main()
