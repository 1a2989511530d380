"""Stall onset to engine tree gone, on real engines: a real vLLM (CPU build) and a real llama.cpp llama-server
under load, stalled for real, watched by the real daemon. The median of N runs per stall, beside the
threshold plus one scrape interval (what the watch promises) and the same with the kill grace (what waiting
out a stopped process would cost).

    .venv/bin/python bench/real_engines_bench.py [--runs 3] [--only vllm|llamacpp]

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
from peers.freezer import Freezer, freeze_inside_a_decode  # noqa: E402
from peers.load import Load  # noqa: E402

INTERVAL, MIN_STALL, GRACE = 2.0, 10.0, 10.0


def stop(pid):
    os.kill(pid, signal.SIGSTOP)


STALLS = {  # name: (engine, how it is made, what makes it)
    "vllm-enginecore": (Vllm, "SIGSTOP of VLLM::EngineCore", lambda s: stop(s.process("VLLM::EngineCore"))),
    "vllm-worker": (Vllm, "SIGSTOP of VLLM::Worker", lambda s: stop(s.process("VLLM::Worker"))),
    "vllm-apiserver": (Vllm, "SIGSTOP of the API server (/metrics hangs)", lambda s: stop(s.proc.pid)),
    "llamacpp-frozen": (LlamaCpp, "inference thread frozen by ptrace inside a decode",
                        lambda s: freeze_inside_a_decode(s.proc.pid, s.metrics_url)),
    "llamacpp-stopped": (LlamaCpp, "SIGSTOP of llama-server (/metrics hangs)", lambda s: stop(s.proc.pid)),
}


def one_run(kind, make_stall, tmp: Path) -> float:
    server = kind(free_port(), tmp / "engine").start()
    daemon = Daemon(tmp, f'[[engine]]\nname = "e"\nmetrics_url = "{server.metrics_url}"\n'
                         f'scrape_interval = "{INTERVAL}s"\nscrape_timeout = "2s"\nmin_stall = "{MIN_STALL}s"\n'
                         f'kill_grace = "{GRACE}s"\n')
    held = None
    try:
        with Load(server.url, streams=8 if kind is Vllm else 4, max_tokens=1500 if kind is Vllm else 500,
                  deadline=120, timeout=120):
            daemon.start()
            daemon.wait_serving()
            time.sleep(3 * INTERVAL)
            held = make_stall(server)
            onset = time.monotonic()
            wait_for(server.gone, MIN_STALL + 60, interval=0.05, what="the engine's tree to be gone")
            return time.monotonic() - onset
    finally:
        if isinstance(held, Freezer):
            held.thaw()
        daemon.stop()
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=("vllm", "llamacpp"))
    args = parser.parse_args()
    results = {}
    for name, (kind, how, make_stall) in STALLS.items():
        if args.only and kind.name != args.only:
            continue
        if why := missing(kind.name):
            sys.exit(why)
        times = []
        for i in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                times.append(one_run(kind, make_stall, Path(tmp)))
            print(f"{name} run {i + 1}: {times[-1]:.1f} s", file=sys.stderr, flush=True)
        results[name] = (kind.name, how, times)
    print(f"| engine | stall made by | stall onset to tree gone, median of {args.runs} (s) | max (s) | "
          "threshold + one scrape (s) |\n|---|---|---:|---:|---:|")
    for kind, how, times in results.values():
        print(f"| {kind} | {how} | {statistics.median(times):.1f} | {max(times):.1f} | {MIN_STALL + INTERVAL:.0f} |")
    print(json.dumps({name: [round(t, 2) for t in r[2]] for name, r in results.items()}))


if __name__ == "__main__":
    main()
