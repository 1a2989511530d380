"""What watching many engines costs the daemon (issue 40: 32 engines at 5 s scrapes ≤ 2 % of a core, RSS ≤ 45 MB,
no loop block over 50 ms), beside the same daemon watching one of them, over the same window.

    .venv/bin/python bench/engines_bench.py [--engines 32] [--seconds 60] [--warm 15]

N real engine processes (tests/integration/fake_engine.py, vLLM's /metrics, progressing) on loopback; two real
`gpuwarden run` side by side, one with all N as [[engine]] sections, one with the first alone, both scraping every
5 s (each scrape a look at the engine's processes too). After --warm seconds (the first looks, the imports of the
first scrape), the CPU each daemon used (utime + stime of all its threads) over --seconds, in --windows windows (the
median window is the figure, the others its spread), its RSS at the end,
and then, over --loop seconds, the loop's longest block: the most its lag probe (gpuwarden_loop_lag_seconds, how late
its tick came, each LAG_PROBE seconds) read, polled every 0.25 s (not in the CPU window: the polls cost the daemon
CPU). A block that spans no tick goes unseen.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "integration"), str(ROOT / "bench")]

from helpers import Daemon, FakeEngine, http_get  # noqa: E402

from figure import figure, load  # noqa: E402
from gpuwarden.hub.health import LAG_PROBE  # noqa: E402
from measure import rss_mb  # noqa: E402

DUMP = ROOT / "tests" / "corpus" / "metrics" / "vllm-01.prom"
TICK = 100  # clock ticks a second (/proc/PID/stat)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def lag_s(daemon: Daemon) -> float:
    found = re.search(r"^gpuwarden_loop_lag_seconds (\S+)$", http_get(f"http://127.0.0.1:{daemon.port}/metrics"), re.M)
    return float(found[1]) if found else 0.0


def watching(tmp: Path, engines: list[FakeEngine]) -> Daemon:
    sections = "".join(f'[[engine]]\nname = "e{i}"\nmetrics_url = "{e.url}"\nscrape_interval = "5s"\n'
                       for i, e in enumerate(engines))
    tmp.mkdir()
    return Daemon(tmp, sections, status_interval=None).start()  # its default status interval (30 s), not a test's 1 s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engines", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warm", type=float, default=15.0)
    parser.add_argument("--loop", type=float, default=30.0)
    parser.add_argument("--windows", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: bytecode cached (startup_bench.py)
        os.environ["PYTHONPYCACHEPREFIX"] = str(Path(root) / "bytecode")
        engines = []
        daemons = []
        try:
            for _ in range(args.engines):
                engines.append(FakeEngine(Path(root), DUMP, "vllm", "progress"))
            # not measured: a daemon that starts and scrapes once fills the bytecode cache (a daemon that compiles
            # its modules holds ~20 MB more)
            warm = watching(Path(root) / "warm", engines[:1])
            warm.wait_log("gpuwarden running", timeout=60)
            time.sleep(3)
            warm.stop()
            daemons = [watching(Path(root) / "many", engines), watching(Path(root) / "one", engines[:1])]
            for d in daemons:
                d.wait_log("gpuwarden running", timeout=60)
            time.sleep(args.warm)
            shares: list[list[float]] = [[], []]  # each daemon's % of a core, window by window
            for _ in range(args.windows):
                before, started = [cpu_s(d.proc.pid) for d in daemons], time.monotonic()
                time.sleep(args.seconds / args.windows)
                window = time.monotonic() - started
                for share, d, b in zip(shares, daemons, before, strict=True):
                    share.append((cpu_s(d.proc.pid) - b) / window * 100)
            cpu = [statistics.median(share) for share in shares]
            rss = [rss_mb(d.proc.pid) for d in daemons]
            lags = [[], []]
            end = time.monotonic() + args.loop
            while time.monotonic() < end:
                for d, seen in zip(daemons, lags, strict=True):
                    seen.append(lag_s(d) * 1000)
                time.sleep(0.25)
        finally:
            for d in daemons:
                d.stop()
            for e in engines:
                e.kill()
    lag = [max(seen) for seen in lags]
    spread = [f"{min(share):.2f}-{max(share):.2f} % over {len(share)} windows of {window:.0f} s" for share in shares]
    print(f"{args.engines} engines: {cpu[0]:.2f} % of a core ({spread[0]}), RSS {rss[0]:.1f} MB, longest loop block "
          f"seen {lag[0]:.0f} ms; 1 engine: {cpu[1]:.2f} % ({spread[1]}), RSS {rss[1]:.1f} MB, {lag[1]:.0f} ms; CPU "
          f"windows after {args.warm:.0f} s, loop window {args.loop:.0f} s; {load()}")
    figure(f"{args.engines} engines at 5 s scrapes: daemon CPU", cpu[0], "% of a core",
           f"1 engine: {cpu[1]:.2f} % (the same windows, side by side; {load()}); median window, spread {spread[0]}",
           "≤ 2 %", cpu[0] <= 2)
    figure(f"{args.engines} engines at 5 s scrapes: daemon RSS", rss[0], "MB", f"1 engine: {rss[1]:.1f} MB",
           "≤ 45 MB", rss[0] <= 45)
    figure(f"{args.engines} engines at 5 s scrapes: longest loop block seen", lag[0], "ms",
           f"1 engine: {lag[1]:.0f} ms (the loop's {LAG_PROBE:g} s lag probe, polled {args.loop:.0f} s)", "≤ 50 ms",
           lag[0] <= 50)


if __name__ == "__main__":
    main()
