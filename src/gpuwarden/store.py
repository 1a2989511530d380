"""SQLite store in WAL mode: events, journal cursors and the alert outbox.

Writes commit before they return, so an event is durable before anything acts on it. WAL with
synchronous=NORMAL survives a crash of the daemon; on a power cut the last commits may roll back.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from gpuwarden.model import Event, Severity

SCHEMA_VERSION = 2

_MIGRATIONS = {
    1: """
    CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        time REAL NOT NULL,
        kind TEXT NOT NULL,
        severity TEXT NOT NULL,
        gpu TEXT,
        engine TEXT,
        message TEXT NOT NULL,
        evidence TEXT NOT NULL,
        count INTEGER NOT NULL DEFAULT 1,
        dedupe_key TEXT NOT NULL
    );
    CREATE INDEX events_time ON events(time);
    CREATE TABLE cursors (source TEXT PRIMARY KEY, cursor TEXT NOT NULL, updated REAL NOT NULL);
    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY,
        event_id INTEGER REFERENCES events(id),
        target TEXT NOT NULL,
        created REAL NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt REAL NOT NULL,
        payload TEXT NOT NULL
    );
    """,
    # 2: alerts. Events before it count as alerted (nothing re-alerts history); the v1 outbox was never used.
    2: """
    ALTER TABLE events ADD COLUMN alerted INTEGER NOT NULL DEFAULT 1;
    CREATE INDEX events_unalerted ON events(alerted) WHERE alerted = 0;
    DROP TABLE outbox;
    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY,
        alert_id TEXT NOT NULL,
        target TEXT NOT NULL,
        created REAL NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt REAL NOT NULL,
        severity TEXT NOT NULL,
        payload TEXT NOT NULL
    );
    CREATE INDEX outbox_target ON outbox(target, id);
    """,
}


class OutboxRow(NamedTuple):
    id: int
    alert_id: str
    target: str
    created: float
    attempts: int
    next_attempt: float
    severity: str
    payload: dict[str, Any]


class StoreError(Exception):
    """The database cannot be used; the message says why and what to do."""


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, timeout=5, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise StoreError(_explain(path, exc)) from None
        except OSError as exc:
            raise StoreError(f"{path}: {exc.strerror or exc}") from None

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(f"{self.path}: schema version {version} was written by a newer gpuwarden")
        for target in range(version + 1, SCHEMA_VERSION + 1):
            with self._transaction():
                self._db.executescript(_MIGRATIONS[target])
                self._db.execute(f"PRAGMA user_version={target}")

    def _transaction(self) -> sqlite3.Connection:
        self._db.execute("BEGIN IMMEDIATE")
        return self._db

    def add_events(self, events: Iterable[Event], cursor: tuple[str, str] | None = None) -> list[int]:
        """Store events (and the source cursor that produced them) in one transaction; returns their ids."""
        try:
            with self._transaction() as db:
                ids = [
                    db.execute(
                        "INSERT INTO events (time, kind, severity, gpu, engine, message, evidence, count, dedupe_key,"
                        " alerted) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0)",
                        (e.time, e.kind, str(e.severity), e.gpu, e.engine, e.message,
                         json.dumps(e.evidence, default=str), e.count, e.dedupe_key),
                    ).lastrowid
                    for e in events
                ]
                if cursor:
                    db.execute(
                        "INSERT INTO cursors (source, cursor, updated) VALUES (?, ?, ?)"
                        " ON CONFLICT(source) DO UPDATE SET cursor = excluded.cursor, updated = excluded.updated",
                        (*cursor, time.time()),
                    )
            return ids  # type: ignore[return-value]
        except sqlite3.DatabaseError as exc:
            raise StoreError(_explain(self.path, exc)) from None

    # --- alerts -----------------------------------------------------------------------------------

    def unalerted_events(self, since: float) -> list[tuple[int, Event]]:
        """Events at or after `since` that the alerter never handled (the daemon died first)."""
        rows = self._db.execute(
            "SELECT id, time, kind, severity, gpu, engine, message, evidence, count FROM events"
            " WHERE alerted = 0 AND time >= ? ORDER BY id", (since,)).fetchall()
        return [(r[0], Event(r[2], Severity.parse(r[3]), r[6], r[1], r[4], r[5], json.loads(r[7]), r[8]))
                for r in rows]

    def mark_alerted(self, event_ids: Iterable[int]) -> None:
        with self._transaction() as db:
            db.executemany("UPDATE events SET alerted = 1 WHERE id = ?", [(i,) for i in event_ids])

    def enqueue_alert(self, alert_id: str, severity: str, payload: dict[str, Any], targets: Iterable[str],
                      event_ids: Iterable[int], now: float) -> None:
        """One outbox row per target, and the events marked as alerted, in one transaction."""
        with self._transaction() as db:
            db.executemany(
                "INSERT INTO outbox (alert_id, target, created, next_attempt, severity, payload)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [(alert_id, t, now, now, severity, json.dumps(payload)) for t in targets])
            db.executemany("UPDATE events SET alerted = 1 WHERE id = ?", [(i,) for i in event_ids])

    def next_alert(self, target: str) -> OutboxRow | None:
        """The oldest pending alert of a target: alerts go out in order, one after the other."""
        row = self._db.execute(
            "SELECT id, alert_id, target, created, attempts, next_attempt, severity, payload FROM outbox"
            " WHERE target = ? ORDER BY id LIMIT 1", (target,)).fetchone()
        return OutboxRow(*row[:7], json.loads(row[7])) if row else None

    def pending_alerts(self) -> dict[tuple[str, str], int]:
        """(target, severity) -> rows waiting in the outbox."""
        rows = self._db.execute("SELECT target, severity, count(*) FROM outbox GROUP BY target, severity")
        return {(t, s): n for t, s, n in rows}

    def delivered(self, row_id: int) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM outbox WHERE id = ?", (row_id,))

    def retry_later(self, row_id: int, next_attempt: float) -> None:
        with self._transaction() as db:
            db.execute("UPDATE outbox SET attempts = attempts + 1, next_attempt = ? WHERE id = ?",
                       (next_attempt, row_id))

    def outbox_targets(self) -> set[str]:
        return {t for (t,) in self._db.execute("SELECT DISTINCT target FROM outbox")}

    def set_count(self, event_id: int, count: int) -> None:
        """A storm grew: the event that stands for it now counts `count` lines."""
        with self._transaction() as db:
            db.execute("UPDATE events SET count = ? WHERE id = ?", (count, event_id))

    def cursor(self, source: str) -> str | None:
        row = self._db.execute("SELECT cursor FROM cursors WHERE source = ?", (source,)).fetchone()
        return row[0] if row else None

    def events(self, since: float | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        """The newest `limit` events at or after `since`, oldest first."""
        rows = self._db.execute(
            "SELECT id, time, kind, severity, gpu, engine, message, evidence, count FROM events"
            " WHERE time >= ? ORDER BY time DESC, id DESC LIMIT ?",
            (since or 0.0, limit),
        ).fetchall()
        keys = ("id", "time", "kind", "severity", "gpu", "engine", "message", "evidence", "count")
        out = [dict(zip(keys, row, strict=True)) for row in reversed(rows)]
        for row in out:
            row["evidence"] = json.loads(row["evidence"])
        return out

    def close(self) -> None:
        self._db.close()


def _explain(path: Path, exc: sqlite3.DatabaseError) -> str:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return f"{path}: database is locked by another process (is another gpuwarden running?)"
    if "not a database" in text or "malformed" in text:
        return (f"{path}: database is corrupt ({text}); move it aside (nothing is deleted) and gpuwarden "
                "starts a new one")
    return f"{path}: database error: {text}"
