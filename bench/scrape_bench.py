"""What one /metrics scrape costs the daemon: CPU ns per scrape (the daemon's whole-process CPU clock over a burst of
scrapes from this process, less its own idle rate measured just before) and its RSS, for this tree and, with
--against REV, for that commit's src/ run side by side (the same fake 8-GPU tree, the same scrapes, turn by turn).

Two clients: a new connection per scrape with `Connection: close` (as urllib, the telemetry bench's client), and
one kept-alive connection (as Prometheus scrapes).

    .venv/bin/python bench/scrape_bench.py [--scrapes 500] [--against main]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from figure import load
from footprint_bench import source_of
from measure import free_port, rss_mb
from telemetry_bench import CARDS, build, cpu_seconds, daemon, stopped


class Client:
    """GET /metrics over one connection while the server keeps it, a new one when it closes it."""

    def __init__(self, port: int, keep: bool) -> None:
        self.port, self.keep, self.sock = port, keep, None
        self.request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + (b"" if keep else b"Connection: close\r\n") + b"\r\n"

    def get(self) -> bytes:
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), 5)
        self.sock.sendall(self.request)
        data = b""
        while b"\r\n\r\n" not in data:
            data += self._recv()
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.lower().split(b"\r\n")
                          if line.startswith(b"content-length:")))
        while len(body) < length:
            body += self._recv()
        if not self.keep or b"connection: close" in head.lower() or head.startswith(b"HTTP/1.0"):
            self.sock.close()
            self.sock = None
        return body

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the server mid-answer")
        return chunk


def per_scrape_us(pid: int, port: int, scrapes: int, keep: bool) -> float:
    """µs of the daemon's CPU per scrape: a burst of `scrapes`, less the idle rate of the 3 s before it."""
    idle_cpu, idle_at = cpu_seconds(pid), time.monotonic()
    time.sleep(3)
    idle_rate = (cpu_seconds(pid) - idle_cpu) / (time.monotonic() - idle_at)
    client = Client(port, keep)
    start_cpu, start = cpu_seconds(pid), time.monotonic()
    for _ in range(scrapes):
        assert b"gpuwarden_build_info" in client.get()
    took = time.monotonic() - start
    return ((cpu_seconds(pid) - start_cpu) - idle_rate * took) / scrapes * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scrapes", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", help="a git revision whose src/ runs beside this tree's")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        sysfs = build(Path(tmp) / "sys", {f"0000:{0x10 + i * 0x10:02x}:00.0": card for i, card in enumerate(CARDS)})
        trees = {"this tree": None}
        if args.against:
            trees[args.against] = stack.enter_context(source_of(args.against))
        procs, ports = {}, {}
        for i, (name, src) in enumerate(trees.items()):
            ports[name] = free_port()
            env = {**os.environ, "PYTHONPATH": src} if src else None
            procs[name] = daemon(Path(tmp), sysfs, f"d{i}", ports[name], env)
        stack.callback(stopped, *procs.values())
        time.sleep(5)  # started, GPUs read a few times
        rss_before = {name: rss_mb(p.pid) for name, p in procs.items()}
        cost = {(name, keep): [] for name in trees for keep in (False, True)}
        for _ in range(args.rounds):  # turn by turn: both trees see the same moments of a shared machine
            for name, proc in procs.items():
                for keep in (False, True):
                    cost[name, keep].append(per_scrape_us(proc.pid, ports[name], args.scrapes, keep))
        print(f"## CPU per /metrics scrape, 8 fake GPUs (µs of the daemon's CPU, median of {args.rounds} bursts of "
              f"{args.scrapes}; {load()})\n")
        print("| tree | new connection each scrape | one kept-alive connection | RSS MB at 5 s | RSS MB after |")
        print("|---|---:|---:|---:|---:|")
        for name, proc in procs.items():
            print(f"| {name} | {statistics.median(cost[name, False]):.0f} | {statistics.median(cost[name, True]):.0f} "
                  f"| {rss_before[name]:.1f} | {rss_mb(proc.pid):.1f} |")


if __name__ == "__main__":
    main()
