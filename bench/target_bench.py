"""Target resolution benchmark: what one look at an engine's processes costs (done once per scrape, off the
event loop), per target kind, with the safety checks of README "Safety" (serving socket, owner, kernel thread,
ancestors, the tree walk that stops at another user).

    .venv/bin/python bench/target_bench.py [--looks N]

A real engine process tree (tests/integration/fake_engine.py with a worker and an orphan) serves /metrics on
loopback; each kind resolves to it, and a fresh Tracker and a kept one (the daemon's case) are timed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from gpuwarden.engine.processes import TargetSpec, Tracker, resolve

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from helpers import FakeEngine  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--looks", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine = FakeEngine(Path(tmp), ROOT / "tests/corpus/metrics/vllm-01.prom", "vllm", "progress", "--orphans",
                            "vllm", "serve", "Qwen/Qwen3-0.6B")
        try:
            pidfile = Path(tmp) / "engine.pid"
            pidfile.write_text(f"{engine.pids()[0]}\n")
            os.chmod(tmp, 0o755)
            specs = {"port": TargetSpec("port", port=engine.port, host="127.0.0.1"),
                     "pidfile": TargetSpec("pidfile", port=engine.port, host="127.0.0.1", pidfile=pidfile),
                     "cmdline": TargetSpec("cmdline", port=engine.port, host="127.0.0.1",
                                           pattern="vllm serve .*Qwen")}
            print(f"{len(psutil.pids())} processes on this host; engine tree of {len(engine.pids())}")
            for kind, spec in specs.items():
                kept = Tracker()
                assert len(kept.refresh(resolve(spec))) == len(engine.pids()), kind
                times = []
                for _ in range(args.looks):
                    start = time.perf_counter()
                    kept.refresh(resolve(spec))
                    times.append(time.perf_counter() - start)
                print(f"{kind:<8} median {statistics.median(times) * 1e3:6.2f} ms  "
                      f"p95 {sorted(times)[int(len(times) * 0.95)] * 1e3:6.2f} ms  per look")
        finally:
            engine.kill()
            subprocess.run(["true"])


if __name__ == "__main__":
    main()
