"""`npd-check` on a big store: 300,000 events since boot and 100,000 condition changes (telemetry conditions that
flap: raised, resolved, raised...), one GPU lost and one engine stalled among them. npd-check reads only the open
conditions (the last change of each key), never the events.

    .venv/bin/python bench/npd_bench.py [--rows 300000] [--changes 100000]

The store is a real one (gpuwarden's schema, WAL) in a temporary folder, filled as a noisy box fills it. The read
and judgement are the best of 5; the command itself (`gpuwarden npd-check`, a fresh process as NPD runs it) is
timed once per condition, against NPD's 5 s timeout and the check's own 4 s `--timeout`.
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

from gpuwarden.cli import npd
from gpuwarden.core import conditions
from gpuwarden.core.model import CONDITION, Event, Severity
from gpuwarden.store.sqlite import Store
from measure import best

NOISE = ("aer_corrected", "page_fault", "ring_timeout_recovered", "telemetry_hot")
GPU = "0000:03:00.0"


def fill(db: Path, rows: int, changes: int, boot: float) -> None:
    store = Store(db)  # the schema, as the daemon makes it
    evidence = json.dumps({"line": "pcieport 0000:00:01.1: AER: Corrected error message received from "
                                   f"{GPU}", "rule": "aer_corrected", "count": 3})
    step = (time.time() - boot - 60) / rows
    with sqlite3.connect(db) as conn:
        conn.executemany(
            "INSERT INTO events (time, kind, severity, gpu, engine, message, evidence, dedupe_key, alerted)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1)",
            ((boot + 1 + i * step, NOISE[i % 4], "warning", GPU, None, "noise", evidence, f"k{i}")
             for i in range(rows)))
    state: dict = {}
    batch = []
    for i in range(changes // 2):  # a power condition on one of 8 sensors, raised then resolved
        telemetry = f"power:{GPU}:{i % 8}"
        hot = Event("power", Severity.WARNING, "over cap", boot + 2 + i, gpu=GPU, evidence={CONDITION: telemetry})
        state, raised = conditions.apply(state, hot)
        state, resolved = conditions.resolve(state, conditions.degraded(telemetry), "back", boot + 2.5 + i)
        batch += raised + resolved
    now = time.time()
    for event in (Event("device_lost", Severity.CRITICAL, "lost", boot + 30, gpu=GPU),
                  Event("engine_stall", Severity.CRITICAL, "stall", now - 50, engine="vllm")):
        state, raised = conditions.apply(state, event)
        batch += raised
    store.add_changes(batch)
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--changes", type=int, default=100_000)
    args = parser.parse_args()
    boot = npd.boot_time()
    with tempfile.TemporaryDirectory(prefix="npd-bench-") as tmp:
        state = Path(tmp)
        db = state / "gpuwarden.db"
        fill(db, args.rows, args.changes, boot)
        print(f"store: {args.rows:,} events and {args.changes:,} condition changes since boot, "
              f"{db.stat().st_size / 1e6:.0f} MB")
        for condition, judge in (("gpu", lambda rows: npd.judge_gpu(rows, boot)), ("engine", npd.judge_engine)):
            took = best(lambda: judge(npd.read_conditions(db, 2)))  # noqa: B023
            print(f"{condition:6} read+judge: {took * 1000:5.1f} ms: {judge(npd.read_conditions(db, 2))}")
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
