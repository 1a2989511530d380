"""`npd-check` on a big store: 300,000 events since boot, the old read (every row since boot, JSON decoded in
Python, judged there) against the current one (the condition's kinds picked in SQL), in one run.

    .venv/bin/python bench/npd_bench.py [--rows 300000]

The store is a real one (gpuwarden's schema, WAL) in a temporary folder, filled as a noisy box fills it: AER
and page-fault warnings with their evidence, one GPU lost and a few engine events among them. Each read is the
best of 5; the command itself (`gpuwarden npd-check`, a fresh process as NPD runs it) is timed once per
condition, against NPD's 5 s timeout and the check's own 4 s `--timeout`.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuwarden import npd
from gpuwarden.store import Store

NOISE = ("aer_corrected", "page_fault", "ring_timeout_recovered", "telemetry_hot")


def fill(db: Path, rows: int, boot: float) -> None:
    Store(db).close()  # the schema, as the daemon makes it
    evidence = json.dumps({"line": "pcieport 0000:00:01.1: AER: Corrected error message received from "
                                   "0000:03:00.0", "rule": "aer_corrected", "count": 3})
    step = (time.time() - boot - 60) / rows
    with sqlite3.connect(db) as conn:
        conn.executemany(
            "INSERT INTO events (time, kind, severity, gpu, engine, message, evidence, dedupe_key, alerted)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1)",
            ((boot + 1 + i * step, NOISE[i % 4], "warning", "0000:03:00.0", None, "noise", evidence, f"k{i}")
             for i in range(rows)))
        now = time.time()
        conn.executemany(
            "INSERT INTO events (time, kind, severity, gpu, engine, message, evidence, dedupe_key, alerted)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1)",
            [(boot + 30, "device_lost", "critical", "0000:03:00.0", None, "lost", "{}", "lost"),
             (now - 50, "engine_stall", "critical", None, "vllm", "stall", "{}", "s1"),
             (now - 40, "engine_killed", "warning", None, "vllm", "killed", "{}", "k1")])


def old_read(db: Path, since: float) -> list[dict]:
    """read_events before the fix: every row since `since`."""
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=2)
    try:
        rows = conn.execute("SELECT time, kind, severity, gpu, engine, evidence FROM events WHERE time >= ?"
                            " ORDER BY time, id", (since,)).fetchall()
    finally:
        conn.close()
    keys = ("time", "kind", "severity", "gpu", "engine", "evidence")
    return [dict(zip(keys, (*row[:5], json.loads(row[5] or "{}")), strict=True)) for row in rows]


def best(fn, n: int = 5) -> float:
    times = []
    for _ in range(n):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=300_000)
    args = parser.parse_args()
    boot = npd.boot_time()
    with tempfile.TemporaryDirectory(prefix="npd-bench-") as tmp:
        state = Path(tmp)
        db = state / "gpuwarden.db"
        fill(db, args.rows, boot)
        window = time.time() - 900
        print(f"store: {args.rows:,} events since boot, {db.stat().st_size / 1e6:.0f} MB")
        for condition, since, kinds, judge in (("gpu", boot, npd.GPU_LOST_KINDS, npd.judge_gpu),
                                               ("engine", window, npd.ENGINE_KINDS, npd.judge_engine)):
            before = best(lambda: judge(old_read(db, since), since))  # noqa: B023
            after = best(lambda: judge(npd.read_events(db, since, 2, kinds), since))  # noqa: B023
            assert judge(old_read(db, since), since) == judge(npd.read_events(db, since, 2, kinds), since)
            print(f"{condition:6} read+judge: before {before * 1000:7.0f} ms, after {after * 1000:5.1f} ms")
        config = state / "gpuwarden.toml"
        config.write_text(f'[daemon]\nstate_dir = "{state}"\n[exporter]\nenabled = false\n')
        for condition in ("gpu", "engine"):
            began = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "gpuwarden", "--config", str(config), "npd-check",
                                  "--condition", condition], capture_output=True, text=True, timeout=30)
            took = time.perf_counter() - began
            print(f"gpuwarden npd-check --condition {condition}: {took:.2f} s, exit {out.returncode}: "
                  f"{out.stdout.strip()}")


if __name__ == "__main__":
    main()
