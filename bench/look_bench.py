"""What one look at an engine's processes costs (issue 36: ≤ 100 ms median with 1 M descriptors held by another
user; issue 40: ≤ 1 ms, independent of the host's sockets and descriptors), beside the way it was done before:
psutil.net_connections() (the link of every descriptor of every process on the host) and a process_iter over the
whole host.

    .venv/bin/python bench/look_bench.py [--looks N] [--old N]

A real engine process tree (tests/integration/fake_engine.py, run by root, with a worker) serves /metrics on
loopback. A look is the daemon's own (engine/looks.py `Looker._look`: its target resolved from the kernel's
socket table, its tree, CPU and GPUs; NVML off), with a kept tracker as the daemon keeps one: a scrape's look,
which walks the engine's tree (a kill's look, which also reads every process of the engine's user, here root's,
is measured beside it, as a scrape's is at least every 30 s: Tracker.refresh). Measured on a quiet
box, then beside a real unprivileged user (useradd) holding ~1 M descriptors (tests/hoarder.py) and 13,000 TCP
sockets (6,500 loopback connections, both ends), the looks and the old way's interleaved. Needs root (the user)."""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from gpuwarden.config.settings import EngineConfig
from gpuwarden.engine.looks import Looker
from gpuwarden.engine.processes import Tracker

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "integration")]
from helpers import FakeEngine  # noqa: E402

from figure import figure, load  # noqa: E402
from hoarder import SYSTEM_PYTHON, Hoard, hoarder  # noqa: E402

GOAL_MS = 1.0
_SOCKETS = """
import os, socket, sys
listener = socket.create_server(("127.0.0.1", 0), backlog=8192)
held = []
for _ in range(int(sys.argv[1]) // 2):
    held.append(socket.create_connection(listener.getsockname()))
    held.append(listener.accept()[0])
print(len(held), flush=True)
os.close(1)
os.pause()
"""


@contextlib.contextmanager
def sockets(hoard: Hoard, count: int):
    """`count` TCP sockets (loopback connections, both ends) held by the hoard's user: how many it holds."""
    proc = subprocess.Popen([SYSTEM_PYTHON, "-c", _SOCKETS, str(count)], user=hoard.uid, group=hoard.gid,
                            extra_groups=[], cwd="/", env={"PATH": "/usr/bin:/bin"}, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        yield int(proc.stdout.readline() or 0)
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()


def old_way() -> float:
    """The look's host-wide part before: every inet socket with its process, and every process's parent."""
    start = time.perf_counter()
    psutil.net_connections(kind="inet")
    list(psutil.process_iter(["ppid"]))
    return time.perf_counter() - start


def looks(looker: Looker, config: EngineConfig, tracker: Tracker, n: int, wide: bool = False) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        seen = looker._look(config, tracker, wide)
        times.append(time.perf_counter() - start)
        assert seen.procs and not seen.taken, seen.taken
    return times


def spread(times: list[float]) -> str:
    return f"{min(times) * 1e3:.2f}-{max(times) * 1e3:.2f} ms over {len(times)}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--looks", type=int, default=30)
    parser.add_argument("--old", type=int, default=3, help="old-way runs per condition (10 s each beside the hoard)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine = FakeEngine(Path(tmp), ROOT / "tests/corpus/metrics/vllm-01.prom", "vllm", "progress")
        try:
            config = EngineConfig(name="bench", metrics_url=engine.url)
            looker, tracker = Looker(nvml=False), Tracker()
            looks(looker, config, tracker, 3)  # warm: the tracker keeps the engine's pids, as the daemon's does
            quiet_new, quiet_old = [], []
            for _ in range(args.old):
                quiet_new += looks(looker, config, tracker, args.looks // args.old)
                quiet_old.append(old_way())
            with hoarder() as hoard, sockets(hoard, 13_000) as socks:
                held_new, held_old, held_wide = [], [], []
                for _ in range(args.old):
                    held_new += looks(looker, config, tracker, args.looks // args.old)
                    held_wide += looks(looker, config, tracker, args.looks // args.old // 3 or 1, wide=True)
                    held_old.append(old_way())
                held = hoard.held
        finally:
            engine.kill()
    print(f"{len(psutil.pids())} processes; {held} descriptors and {socks} TCP sockets held by another user in the "
          f"second part; {load()}")
    for what, times in (("quiet, this look", quiet_new), ("quiet, net_connections way", quiet_old),
                        ("1 M fds + 13 k sockets, this look", held_new),
                        ("1 M fds + 13 k sockets, a kill's look", held_wide),
                        ("1 M fds + 13 k sockets, old way", held_old)):
        print(f"{what:<36} median {statistics.median(times) * 1e3:9.2f} ms  ({spread(times)})")
    new, old = statistics.median(held_new) * 1e3, statistics.median(held_old) * 1e3
    figure("one look at an engine, 1 M descriptors and 13,000 sockets held by another user", new, "ms",
           f"net_connections way {old:.0f} ms ({old / new:.0f}x); quiet box {statistics.median(quiet_new) * 1e3:.2f}"
           f" ms; a kill's look (every process of root's read too) {statistics.median(held_wide) * 1e3:.2f} ms "
           f"(spread {spread(held_wide)}); this look's spread {spread(held_new)}; {load()}",
           f"≤ {GOAL_MS:.0f} ms median", new <= GOAL_MS)


if __name__ == "__main__":
    main()
