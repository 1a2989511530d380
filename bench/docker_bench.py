"""Stall onset to the container's processes gone, for a real llama-server in a real Docker container (its port
published on 127.0.0.1), killed through `[engine.target] kind = "docker"`: watched through its /metrics
(--metrics) and through its Docker log (no --metrics; the canary confirms the stall). The inference thread is
frozen by ptrace from the host under load, as in bench/log_source_bench.py. The median of N runs per source.

    .venv/bin/python bench/docker_bench.py [--runs 3]

Needs root, Debian's docker.io (a dockerd is started when none answers) and `bash tests/peers/install.sh`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "integration")]

from helpers import Daemon, free_port, wait_for  # noqa: E402

from peers.docker import Dockerd, LlamaContainer  # noqa: E402
from peers.freezer import Freezer, freeze_inside_a_decode  # noqa: E402
from peers.load import Load  # noqa: E402

INTERVAL, MIN_STALL, GRACE, CANARY = 2.0, 10.0, 10.0, 5.0


def config(box: LlamaContainer, source: str) -> str:
    extra = (f'source = "log"\nlog_container = "{box.name}"\nprofile = "llamacpp"\n' if source == "docker log"
             else 'source = "metrics"\n')
    return (f'[[engine]]\nname = "e"\nmetrics_url = "{box.metrics_url}"\n{extra}'
            f'scrape_interval = "{INTERVAL}s"\nscrape_timeout = "2s"\nmin_stall = "{MIN_STALL}s"\n'
            f'kill_grace = "{GRACE}s"\ncanary_timeout = "{CANARY}s"\n'
            f'[engine.target]\nkind = "docker"\ncontainer = "{box.name}"\n')


def one_run(source: str, tmp: Path) -> float:
    box = LlamaContainer(free_port(), tmp / "engine", metrics=source == "metrics").start()
    daemon = Daemon(tmp, config(box, source))
    held = None
    try:
        pids = box.pids()
        with Load(box.url, streams=4, max_tokens=300, deadline=180, timeout=180):
            daemon.start()
            daemon.wait_serving()
            time.sleep(3 * INTERVAL)
            held = (freeze_inside_a_decode(box.engine_pid(), box.metrics_url) if source == "metrics"
                    else Freezer(box.engine_pid()).__enter__())
            onset = time.monotonic()
            wait_for(lambda: box.gone(pids), 120, interval=0.05, what="the container's processes to be gone")
            took = time.monotonic() - onset
        if not [e for e in daemon.events() if e["kind"] == "engine_killed"]:
            raise RuntimeError("gone, but not killed by gpuwarden")
        return took
    finally:
        if held:
            held.thaw()
        daemon.stop()
        box.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    dockerd = Dockerd().start()
    rows, raw = [], {}
    try:
        for source in ("metrics", "docker log"):
            times, failed = [], 0
            while len(times) < args.runs and failed < args.runs:
                with tempfile.TemporaryDirectory() as tmp:
                    try:
                        times.append(one_run(source, Path(tmp)))
                    except (LookupError, RuntimeError, AssertionError) as exc:  # a run the machine spoilt
                        failed += 1
                        print(f"{source}: run failed, again: {exc}", file=sys.stderr, flush=True)
                        continue
                print(f"{source} run {len(times)}: {times[-1]:.1f} s", file=sys.stderr, flush=True)
            rows.append((source, times))
            raw[source] = [round(t, 2) for t in times]
    finally:
        dockerd.stop()
    print(f"| source | stall onset to container processes gone, median of {args.runs} (s) | max (s) |\n|---|---:|---:|")
    for source, times in rows:
        print(f"| {source} | {statistics.median(times):.1f} | {max(times):.1f} |")
    print(json.dumps(raw))


if __name__ == "__main__":
    main()
