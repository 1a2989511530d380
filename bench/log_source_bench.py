"""Stall onset to engine tree gone through each progress source, on the same real engine: a real llama.cpp
llama-server (started with --metrics, so every source can read it) under load, its inference thread frozen by
ptrace, watched by the real daemon through /metrics, through /slots, and through its own log (plus the
canary that confirms a log stall). A real vLLM (CPU) with its EngineCore stopped, through /metrics and its log.
The median of N runs per source.

    .venv/bin/python bench/log_source_bench.py [--runs 3] [--only vllm|llamacpp]

Needs root (ptrace) and the engines that `bash tests/peers/install.sh` installs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "integration")]

from helpers import Daemon, free_port, wait_for  # noqa: E402

from peers.engines import LlamaCpp, Vllm, missing  # noqa: E402
from peers.freezer import Freezer  # noqa: E402
from peers.load import Load  # noqa: E402

INTERVAL, MIN_STALL, GRACE, CANARY = 2.0, 10.0, 10.0, 5.0
SOURCES = {  # engine: sources to compare
    LlamaCpp: ("metrics", "slots", "log"),
    Vllm: ("metrics", "log"),
}


def config(server, source: str) -> str:
    extra = (f'source = "log"\nlog_file = "{server.log}"\nprofile = "{server.name}"\n' if source == "log"
             else f'source = "{source}"\n')
    return (f'[[engine]]\nname = "e"\nmetrics_url = "{server.metrics_url}"\n{extra}'
            f'scrape_interval = "{INTERVAL}s"\nscrape_timeout = "2s"\nmin_stall = "{MIN_STALL}s"\n'
            f'kill_grace = "{GRACE}s"\ncanary_timeout = "{CANARY}s"\n')


def one_run(kind, source: str, tmp: Path) -> float:
    server = kind(free_port(), tmp / "engine").start()
    daemon = Daemon(tmp, config(server, source))
    held = None
    try:
        with Load(server.url, streams=8 if kind is Vllm else 4, max_tokens=1500 if kind is Vllm else 300,
                  deadline=180, timeout=180):
            daemon.start()
            daemon.wait_serving()
            time.sleep(25 if kind is Vllm else 3 * INTERVAL)  # vLLM: a few of its 10 s log lines first
            if kind is Vllm:
                os.kill(server.process("VLLM::EngineCore"), signal.SIGSTOP)
            else:
                held = Freezer(server.proc.pid).__enter__()
            onset = time.monotonic()
            wait_for(server.gone, 120, interval=0.05, what="the engine's tree to be gone")
            return time.monotonic() - onset
    finally:
        if held:
            held.thaw()
        daemon.stop()
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=("vllm", "llamacpp"))
    args = parser.parse_args()
    rows, raw = [], {}
    for kind, sources in SOURCES.items():
        if args.only and kind.name != args.only:
            continue
        if why := missing(kind.name):
            sys.exit(why)
        for source in sources:
            times, failed = [], 0
            while len(times) < args.runs and failed < args.runs:
                with tempfile.TemporaryDirectory() as tmp:
                    try:
                        times.append(one_run(kind, source, Path(tmp)))
                    except (LookupError, RuntimeError, AssertionError) as exc:  # a run the machine spoilt
                        failed += 1
                        print(f"{kind.name} {source}: run failed, again: {exc}", file=sys.stderr, flush=True)
                        continue
                print(f"{kind.name} {source} run {len(times)}: {times[-1]:.1f} s", file=sys.stderr, flush=True)
            rows.append((kind.name, source, times))
            raw[f"{kind.name}-{source}"] = [round(t, 2) for t in times]
    print(f"| engine | source | stall onset to tree gone, median of {args.runs} (s) | max (s) |\n|---|---|---:|---:|")
    for engine, source, times in rows:
        print(f"| {engine} | {source} | {statistics.median(times):.1f} | {max(times):.1f} |")
    print(json.dumps(raw))


if __name__ == "__main__":
    main()
