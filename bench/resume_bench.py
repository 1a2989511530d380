"""A start of gpuwarden on a big store: what the alerter takes up of the last run (the open incidents' pages,
the keys in their cooldown, the outbox, what was never alerted) and the kill budgets (the real kills within
the window). 300,000 alerted events over a week, with `--incidents` incidents still open, opened a week ago
(each scanned over that whole week), and 300,000 events within the last hour for the kill query's worst case.

    .venv/bin/python bench/resume_bench.py [--rows 300000] [--incidents 1 4]

Printed: the reads themselves (best of 5), and the longest the event loop was held while the alerter recovered:
the reads done on the loop (as before) against `Alerter.recover` (read off the loop, taken up on it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import tempfile
import time
from pathlib import Path

from gpuwarden.alert.alerter import Alerter, _LastRun
from gpuwarden.config.settings import AlertsConfig
from gpuwarden.core.metrics import SelfMetrics
from gpuwarden.store.sqlite import QueuedStore, Store
from measure import best

WEEK = 7 * 86400.0


def fill(db: Path, rows: int, incidents: int, now: float, span: float) -> None:
    Store(db).close()  # the schema, as the daemon makes it
    step = span / rows
    with sqlite3.connect(db) as conn:
        conn.executemany(
            "INSERT INTO events (time, kind, severity, gpu, engine, message, evidence, dedupe_key, alerted)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1)",
            ((now - span + i * step, "aer_corrected", "warning", "0000:03:00.0", None, "noise",
              json.dumps({"rule": "aer_corrected", "count": 3}), f"k{i % 1000}") for i in range(rows)))
        for n in range(incidents):
            name = f"20261127-0000{n:02d}-engine_stall"
            evidence = json.dumps({"incident": name, "decision": [{"action": "alert"}]})
            conn.execute("INSERT INTO events (time, kind, severity, gpu, engine, message, evidence, dedupe_key,"
                         " alerted) VALUES (?, 'engine_stall', 'critical', NULL, ?, 'stalled', ?, ?, 1)",
                         (now - WEEK + 10 + n, f"e{n}", evidence, f"stall-{n}"))
            conn.execute("INSERT INTO incidents (id, opened, closed, kind, gpu, engine, content) VALUES"
                         " (?, ?, NULL, 'engine_stall', NULL, ?, ?)",
                         (name, now - WEEK + 10 + n, f"e{n}", json.dumps({"id": name, "opened": now - WEEK + 10 + n,
                                                                          "kind": "engine_stall",
                                                                          "engines": [f"e{n}"]})))
        conn.execute("INSERT INTO events (time, kind, severity, gpu, engine, message, evidence, dedupe_key, alerted)"
                     " VALUES (?, 'engine_killed', 'critical', NULL, 'e0', 'killed', ?, 'kill', 1)",
                     (now - 60, json.dumps({"dry_run": False})))


async def held(recover) -> float:
    """The longest the loop went without a turn while `recover()` ran (a ticker every millisecond)."""
    longest, last, done = 0.0, time.perf_counter(), False

    async def tick():
        nonlocal longest, last
        while not done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            longest, last = max(longest, now - last), now
    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0.01)
    last = time.perf_counter()
    await recover()
    await asyncio.sleep(0.01)
    done = True
    await ticker
    return longest


async def loop_held(db: Path) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    store = QueuedStore(db, loop, lambda error: None)
    try:
        config = AlertsConfig()

        async def on_loop():  # as before: the same reads, on the loop
            alerter = Alerter(config, [], store, SelfMetrics())
            alerter._recovered = True
            alerter._take_up(_LastRun.read(store, time.time(), alerter.storm.cooldown, config.give_up_after))

        async def off_loop():
            await Alerter(config, [], store, SelfMetrics()).recover()
        return await held(on_loop), await held(off_loop)
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--incidents", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="resume-bench-") as tmp:
        for incidents in args.incidents:
            db = Path(tmp) / f"week-{incidents}.db"
            now = time.time()
            fill(db, args.rows, incidents, now, WEEK)
            store = Store(db)
            reads = best(lambda s=store: _LastRun.read(s, time.time(), 600.0, 86400.0))
            kills = best(lambda s=store: s.kills(time.time() - 3600.0))
            store.close()
            before, after = asyncio.run(loop_held(db))
            print(f"{args.rows:,} events over a week, {incidents} open incident(s) a week old: the alerter's reads "
                  f"{reads * 1000:.0f} ms; loop held {before * 1000:.0f} ms on the loop (before) vs "
                  f"{after * 1000:.1f} ms off it (after); kill budgets' read {kills * 1000:.2f} ms")
        db = Path(tmp) / "hour.db"
        fill(db, args.rows, 0, time.time(), 3600.0)
        store = Store(db)
        kills = best(lambda: store.kills(time.time() - 3600.0))
        store.close()
        print(f"{args.rows:,} events within the last hour (the kill window's worst case): kill budgets' read "
              f"{kills * 1000:.0f} ms (off the loop at a start)")


if __name__ == "__main__":
    main()
