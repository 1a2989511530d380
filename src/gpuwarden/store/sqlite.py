"""SQLite store in WAL mode: events, condition changes, incidents, journal cursors and the alert outbox.

`Store` writes synchronously (the CLI). The daemon uses `QueuedStore`: the event loop hands every write to one
writer thread and never waits on the disk; what is not written yet (a database locked by another process, a
full disk) stays in memory, in order, and is retried until it is written. WAL with synchronous=NORMAL survives
a crash of the daemon; on a power cut the last commits may roll back.

What is still not written at a stop (the state disk full, the database locked) goes to the spool, a file
beside the database whose space is reserved at start (`posix_fallocate`): writing into reserved blocks needs
no free space, so the events of an outage that filled the disk outlive the stop and a reboot. The next start
queues them first (events, conditions, incidents, alert marks) and empties the spool once they are stored.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from gpuwarden.core import conditions
from gpuwarden.core.model import Event, Severity

SCHEMA_VERSION = 3
# Newest first by time, so that SQLite reads the time index from `since` on: ordered by id, it scanned the whole
# table (110-138 ms of every start at 1 M events, 0.5 ms by the index).
ALERTED_EVENTS = ("SELECT time, kind, severity, gpu, engine, message, evidence, count FROM events"
                  " WHERE time >= ? AND alerted = 1 AND json_extract(evidence, '$.incident') IS ?"
                  " ORDER BY time DESC, id DESC LIMIT ?")

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
    # 3: conditions (each raise and resolve a row; the open ones are those whose last row raised them) and
    # incidents (one row per incident, updated as it evolves; its id is its bundle folder's name).
    3: """
    CREATE TABLE conditions (
        id INTEGER PRIMARY KEY,
        time REAL NOT NULL,
        kind TEXT NOT NULL,
        subject TEXT NOT NULL,
        raised INTEGER NOT NULL,
        message TEXT NOT NULL,
        gpu TEXT,
        engine TEXT,
        causes TEXT NOT NULL,
        alert_keys TEXT NOT NULL,
        event_id INTEGER
    );
    CREATE INDEX conditions_key ON conditions(kind, subject, id);
    CREATE TABLE incidents (
        id TEXT PRIMARY KEY,
        opened REAL NOT NULL,
        closed REAL,
        kind TEXT NOT NULL,
        gpu TEXT,
        engine TEXT,
        content TEXT NOT NULL
    );
    CREATE INDEX incidents_opened ON incidents(opened);
    """,
}

_OPEN_CONDITIONS = ("SELECT time, kind, subject, message, gpu, engine, causes, alert_keys, event_id FROM conditions"
                    " WHERE raised = 1 AND id IN (SELECT max(id) FROM conditions GROUP BY kind, subject)"
                    " ORDER BY id")
_CONDITION_INSERT = ("INSERT INTO conditions (time, kind, subject, raised, message, gpu, engine, causes, alert_keys,"
                     " event_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_INCIDENT_UPSERT = ("INSERT INTO incidents (id, opened, closed, kind, gpu, engine, content)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT(id) DO UPDATE SET closed = excluded.closed, gpu = excluded.gpu,"
                    " engine = excluded.engine, content = excluded.content")


def condition_values(change: conditions.Change) -> tuple:
    c = change.condition
    return (change.time, str(c.key.kind), c.key.subject, int(change.raised), change.message, c.gpu, c.engine,
            json.dumps(sorted(c.causes)), json.dumps(sorted(c.alert_keys)), c.event_id)


def open_conditions(db: sqlite3.Connection) -> list[conditions.Condition]:
    """The conditions whose last stored change raised them (a daemon restart keeps a lost GPU lost)."""
    out = []
    for t, kind, subject, message, gpu, engine, causes, alert_keys, event_id in db.execute(_OPEN_CONDITIONS):
        try:
            key = conditions.Key(conditions.Kind(kind), subject)
        except ValueError:
            continue  # a kind a newer gpuwarden wrote
        out.append(conditions.Condition(key, t, message, gpu, engine, frozenset(json.loads(causes)),
                                        frozenset(json.loads(alert_keys)), event_id))
    return out


def incident_values(incident: dict[str, Any]) -> tuple:
    return (incident["id"], incident["opened"], incident.get("closed"), incident["kind"],
            ",".join(incident.get("gpus", [])) or None, ",".join(incident.get("engines", [])) or None,
            json.dumps(incident, default=str))


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


log = logging.getLogger(__name__)


def _to_wal(db: sqlite3.Connection, timeout: float) -> None:
    """WAL mode. Switching a new store's journal mode while another opener (the daemon starting as `gpuwarden
    events` opens it) is in its first transaction is refused at once, not waited for by the busy handler: tried
    again until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def _statements(script: str) -> list[str]:
    """A migration's statements, one by one (sqlite3.complete_statement finds where each ends)."""
    out, part = [], ""
    for line in script.splitlines(keepends=True):
        part += line
        if sqlite3.complete_statement(part):
            out.append(part)
            part = ""
    return [*out, part] if part.strip() else out


class Store:
    def __init__(self, path: Path, timeout: float = 5.0) -> None:
        self.path = path
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            _private(path)
            self._db = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
            _to_wal(self._db, timeout)
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
                # read again under the write lock: another opener (the daemon starting while `gpuwarden events`
                # opens its store) may have made this step since, and running it twice fails ("already exists")
                if self._db.execute("PRAGMA user_version").fetchone()[0] >= target:
                    continue
                for statement in _statements(_MIGRATIONS[target]):  # not executescript: it commits first
                    self._db.execute(statement)
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

    # --- conditions and incidents -------------------------------------------------------------------

    def add_changes(self, changes: Iterable[conditions.Change]) -> None:
        with self._transaction() as db:
            db.executemany(_CONDITION_INSERT, [condition_values(c) for c in changes])

    def open_conditions(self) -> list[conditions.Condition]:
        return open_conditions(self._db)

    def condition_changes(self, since: float = 0.0) -> list[dict[str, Any]]:
        """Every condition change at or after `since`, oldest first."""
        keys = ("time", "condition", "subject", "raised", "message", "gpu", "engine", "event_id")
        rows = self._db.execute("SELECT time, kind, subject, raised, message, gpu, engine, event_id FROM conditions"
                                " WHERE time >= ? ORDER BY id", (since,)).fetchall()
        return [dict(zip(keys, (*r[:3], bool(r[3]), *r[4:]), strict=True)) for r in rows]

    def save_incident(self, incident: dict[str, Any]) -> None:
        with self._transaction() as db:
            db.execute(_INCIDENT_UPSERT, incident_values(incident))

    def incidents(self, since: float = 0.0, open_only: bool = False) -> list[dict[str, Any]]:
        """Incidents opened at or after `since` (or every one still open), oldest first."""
        rows = self._db.execute("SELECT content FROM incidents WHERE opened >= ?"
                                + (" AND closed IS NULL" if open_only else "") + " ORDER BY opened",
                                (0.0 if open_only else since,)).fetchall()
        return [json.loads(r[0]) for r in rows]

    # --- alerts -----------------------------------------------------------------------------------

    def unalerted_events(self, since: float, below: int | None = None) -> list[tuple[int, Event]]:
        """Events at or after `since` (and with an id below `below`) that the alerter never handled (the daemon
        died first)."""
        rows = self._db.execute(
            "SELECT id, time, kind, severity, gpu, engine, message, evidence, count FROM events"
            " WHERE alerted = 0 AND time >= ? AND id < ? ORDER BY id",
            (since, below if below is not None else 2**63 - 1)).fetchall()
        return [(r[0], Event(r[2], Severity.parse(r[3]), r[6], r[1], r[4], r[5], json.loads(r[7]), r[8]))
                for r in rows]

    def alerted_events(self, since: float, incident: str | None, limit: int = 10_000) -> list[Event]:
        """Events at or after `since` that the alerter handled, of `incident` (None: of no incident), oldest
        first: what a restarted alerter's storm control resumes from. The newest `limit` of them."""
        rows = self._db.execute(ALERTED_EVENTS, (since, incident, limit)).fetchall()
        return [Event(r[1], Severity.parse(r[2]), r[5], r[0], r[3], r[4], json.loads(r[6]), r[7])
                for r in reversed(rows)]

    def kills(self, since: float, limit: int = 1000) -> list[tuple[str, float]]:
        """gpuwarden's real kills (engine_killed, not a dry run) at or after `since`, the newest `limit`, oldest
        first, as (engine, time): what a restarted daemon's kill budgets resume from."""
        rows = self._db.execute(
            "SELECT engine, time FROM events WHERE time >= ? AND kind = 'engine_killed' AND engine IS NOT NULL"
            " AND coalesce(json_extract(evidence, '$.dry_run'), 0) = 0 ORDER BY time DESC, id DESC LIMIT ?",
            (since, limit)).fetchall()
        return [(engine, at) for engine, at in reversed(rows)]

    def mark_alerted(self, event_ids: Iterable[int]) -> None:
        with self._transaction() as db:
            db.executemany("UPDATE events SET alerted = 1 WHERE id = ?", [(i,) for i in event_ids])

    def enqueue_alert(self, alert_id: str, severity: str, payload: dict[str, Any], targets: Iterable[str],
                      event_ids: Iterable[int], now: float) -> list[int]:
        """One outbox row per target, and the events marked as alerted, in one transaction; the rows' ids."""
        with self._transaction() as db:
            ids = [db.execute("INSERT INTO outbox (alert_id, target, created, next_attempt, severity, payload)"
                              " VALUES (?, ?, ?, ?, ?, ?)",
                              (alert_id, t, now, now, severity, json.dumps(payload))).lastrowid for t in targets]
            db.executemany("UPDATE events SET alerted = 1 WHERE id = ?", [(i,) for i in event_ids])
        return ids  # type: ignore[return-value]

    def outbox(self) -> list[OutboxRow]:
        """Every alert waiting in the outbox, oldest first (the alerter keeps them in memory while it runs)."""
        rows = self._db.execute(
            "SELECT id, alert_id, target, created, attempts, next_attempt, severity, payload FROM outbox"
            " ORDER BY id").fetchall()
        return [OutboxRow(*row[:7], json.loads(row[7])) for row in rows]

    def last_ids(self) -> tuple[int, int]:
        """The highest event id and outbox id so far."""
        return (self._db.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0],
                self._db.execute("SELECT coalesce(max(id), 0) FROM outbox").fetchone()[0])

    def delivered(self, row_id: int) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM outbox WHERE id = ?", (row_id,))

    def retry_later(self, row_id: int, next_attempt: float) -> None:
        with self._transaction() as db:
            db.execute("UPDATE outbox SET attempts = attempts + 1, next_attempt = ? WHERE id = ?",
                       (next_attempt, row_id))

    def set_count(self, event_id: int, count: int) -> None:
        """A storm grew: the event that stands for it now counts `count` lines."""
        with self._transaction() as db:
            db.execute("UPDATE events SET count = ? WHERE id = ?", (count, event_id))

    def cursor(self, source: str) -> str | None:
        try:
            row = self._db.execute("SELECT cursor FROM cursors WHERE source = ?", (source,)).fetchone()
        except sqlite3.DatabaseError as exc:
            raise StoreError(_explain(self.path, exc)) from None
        return row[0] if row else None

    def events(self, since: float | None = None, limit: int = 1000, **only: Any) -> list[dict[str, Any]]:
        """The newest `limit` events at or after `since`, oldest first; `only`: `Filter`'s keys."""
        where, values = _filter(since, **only)
        try:
            rows = self._db.execute(
                "SELECT id, time, kind, severity, gpu, engine, message, evidence, count FROM events"
                f" WHERE {where} ORDER BY time DESC, id DESC LIMIT ?", (*values, limit)).fetchall()
        except sqlite3.DatabaseError as exc:
            raise StoreError(_explain(self.path, exc)) from None
        keys = ("id", "time", "kind", "severity", "gpu", "engine", "message", "evidence", "count")
        out = [dict(zip(keys, row, strict=True)) for row in reversed(rows)]
        for row in out:
            row["evidence"] = json.loads(row["evidence"])
        return out

    def count_events(self, since: float | None = None, **only: Any) -> int:
        """How many events `events` would return with no limit (by the time index: a count, not a read)."""
        where, values = _filter(since, **only)
        try:
            return self._db.execute(f"SELECT count(*) FROM events WHERE {where}", values).fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise StoreError(_explain(self.path, exc)) from None

    def close(self) -> None:
        self._db.close()


def _filter(since: float | None, until: float | None = None, kinds: Iterable[str] = (), gpus: Iterable[str] = (),
            engines: Iterable[str] = (), severities: Iterable[str] = ()) -> tuple[str, tuple[Any, ...]]:
    """The WHERE clause of an events query and its values: at or after `since`, before `until`, and of one of
    each list given (an empty list: any)."""
    where, values = ["time >= ?"], [since or 0.0]
    if until is not None:
        where.append("time < ?")
        values.append(until)
    for column, allowed in (("kind", kinds), ("gpu", gpus), ("engine", engines), ("severity", severities)):
        if allowed := list(allowed):
            where.append(f"{column} IN ({', '.join('?' * len(allowed))})")
            values += allowed
    return " AND ".join(where), tuple(values)


def private_folder(folder: Path, ours: bool) -> str | None:
    """Make a state folder private: created 0700; one made before that rule (0755) is tightened when it is
    gpuwarden's own (`ours`: the built-in state dir, the incidents folder), a real folder of this user, by path.
    A folder the user chose is never chmodded (it may be shared): what is wrong with it is returned, to warn."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or not st.st_mode & 0o077:
        return None
    if ours and st.st_uid == os.geteuid():
        os.chmod(folder, 0o700)
        return None
    return f"{folder} is open to other users (mode {stat.S_IMODE(st.st_mode):04o}): its events hold kernel lines " \
           "and process lists; chmod 700 it"


def _private(path: Path) -> None:
    """The events hold kernel lines and process lists: the database is its owner's alone, created 0600 before
    SQLite opens it (SQLite gives -wal and -shm the database's mode). A database or -wal/-shm of ours that others
    may read (made before this rule) is tightened; a link or another user's file is left alone. By path only:
    closing any descriptor of the database would drop the locks of this process's open connections to it."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600))
    except FileExistsError:
        pass
    for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            st = os.lstat(name)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077 and st.st_uid == os.geteuid():
            os.chmod(name, stat.S_IMODE(st.st_mode) & 0o700)


def _explain(path: Path, exc: sqlite3.DatabaseError) -> str:
    """What went wrong, from SQLite's error code (its text is the same for different causes)."""
    code = getattr(exc, "sqlite_errorname", "") or ""
    if code.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return f"{path}: database is locked by another process (is another gpuwarden running?)"
    if code.startswith("SQLITE_FULL"):
        return f"{path}: the disk is full ({exc})"
    damage = _truncated(path)
    if damage or code.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return (f"{path}: database is {damage or 'corrupt'} ({exc}); move it aside (nothing is deleted) and "
                "gpuwarden starts a new one")
    if code.startswith("SQLITE_READONLY"):
        return f"{path}: database is read-only ({exc})"
    if code.startswith("SQLITE_IOERR"):
        return f"{path}: I/O error ({exc}, {code})"
    return f"{path}: database error: {exc}"


def _truncated(path: Path) -> str | None:
    """'truncated (...)' when the file is shorter than its header says (a copy cut short, a full disk)."""
    try:
        with path.open("rb") as f:
            header = f.read(100)
        size = path.stat().st_size
    except OSError:
        return None
    if len(header) < 100 or not header.startswith(b"SQLite format 3\0"):
        return None
    page = int.from_bytes(header[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(header[28:32], "big")
    if size < page * pages:
        return f"truncated ({size} bytes; its header says {page * pages})"
    return None



_BATCH = 500  # writes per transaction
_RETRY_MAX = 30.0  # seconds between attempts while the store cannot be written
SPOOL_BYTES = 1 << 20  # reserved for what a stop could not store: a few hundred events with their evidence
_SPOOL_BLOCK = 64 << 10  # read at a time, up to what was written


class Spool:
    """The reserved file of writes a stop could not store: JSON lines, ended by a NUL, written in place into
    its reserved space (a full disk has no block to give a new file, nor to a file that grows)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reserved = False
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            self._fd = -1
            log.warning("%s: no spool for writes a stop cannot store: %s", path, exc.strerror or exc)
            return
        try:
            if os.fstat(self._fd).st_size < SPOOL_BYTES:
                os.posix_fallocate(self._fd, 0, SPOOL_BYTES)
            self.reserved = True
        except OSError as exc:  # a disk full at start: what a stop cannot store then is lost, as before (said)
            log.warning("%s: cannot reserve %d bytes for the spool (%s): writes a stop cannot store would be "
                        "lost", path, SPOOL_BYTES, exc.strerror or exc)

    def read(self) -> list[dict]:
        if self._fd < 0:
            return []
        # up to the NUL that ends what was written, a block at a time: the reserved megabyte read and split whole
        # cost 1.5 ms of every start, for a spool that is empty but after a stop that could not store
        data, offset = bytearray(), 0
        while block := os.pread(self._fd, _SPOOL_BLOCK, offset):
            end = block.find(b"\0")
            data += block if end < 0 else block[:end]
            if end >= 0:
                break
            offset += len(block)
        records = []
        for line in data.splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                log.error("%s: an unreadable spooled record (%d bytes) skipped", self.path, len(line))
        return records

    def write(self, records: list[dict]) -> int:
        """Write `records` (the newest that fit when not all do), replacing what was there; how many were
        left out."""
        if self._fd < 0 or not self.reserved:
            return len(records)
        lines = [json.dumps(r, default=str).encode() + b"\n" for r in records]
        size, kept = 1, 0  # the final NUL
        while kept < len(lines) and size + len(lines[-1 - kept]) <= SPOOL_BYTES:
            size += len(lines[-1 - kept])
            kept += 1
        os.pwrite(self._fd, b"".join(lines[len(lines) - kept:]) + b"\0", 0)
        os.fsync(self._fd)
        return len(lines) - kept

    def clear(self) -> None:
        if self._fd >= 0:
            os.pwrite(self._fd, b"\0", 0)
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class QueuedStore:
    """The daemon's store. Writes are queued, in order, for one writer thread: the event loop never waits on
    the disk. Ids are handed out at once (the next free ones; a row that another process took first gets the
    next free id and is remembered). Until a write commits, its events and cursors are kept here and seen by
    `events()` and `cursor()`; a failed batch is retried with backoff. At most `limit` writes wait: beyond it
    a write is dropped and counted (the events were logged, alerted and acted on all the same).

    `on_health(error)` is called on the loop when writing starts failing (`error` says why) and with None when
    it works again."""

    def __init__(self, path: Path, loop, on_health: Callable[[str | None], None], limit: int = 100_000) -> None:
        self.path, self.limit, self.dropped = path, limit, 0
        self._writer = Store(path)
        self._reader = Store(path, timeout=0.2)  # the loop's reads: a short wait, then what is in memory
        self._loop, self._on_health = loop, on_health
        last_event, last_outbox = self._writer.last_ids()
        self._next = {"events": last_event + 1, "outbox": last_outbox + 1}
        self.first_id = last_event + 1  # events of this process have ids from here on
        self._moved: dict[tuple[str, int], int] = {}  # (table, id handed out) -> the row's id, where they differ
        self._lost: set[tuple[str, int]] = set()  # rows dropped unwritten: writes about them are skipped
        self._ops: deque[tuple] = deque()
        self._unwritten: dict[int, Event] = {}
        self._cursors: dict[str, str] = {}
        self._cond = threading.Condition()
        self._closing = False
        self.error: str | None = None
        self._spool = Spool(path.with_name(path.name.removesuffix(".db") + ".spool"))
        self._unspool()
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._thread.start()

    # --- the spool: what the last stop could not store, first ------------------------------------

    def _unspool(self) -> None:
        """Store what the last stop spooled, before anything reads the store (its open conditions, the kernel
        source's cursor): events with ids of this process (one already stored, by a stop killed between its
        commit and the spool's clearing, is not stored twice), and what refers to them with those ids. A store
        that still cannot be written gets them queued ahead of everything, and spooled again at this stop."""
        records = self._spool.read()
        if not records:
            return
        new: dict[int, int] = {}
        ops: list[tuple] = []
        for r in records:
            if "event" in r:
                e = Event(r["kind"], Severity.parse(r["severity"]), r["message"], r["time"], r["gpu"], r["engine"],
                          r["evidence"], r["count"])
                if not self._stored(e):
                    [new[r["event"]]] = self._ids("events", 1)
                    ops.append(("events", [(new[r["event"]], e)], tuple(r["cursor"]) if r.get("cursor") else None))
            elif "conditions" in r:
                ops.append(("condition_rows", [(*c[:-1], new.get(c[-1], c[-1]) if c[-1] else None)
                                               for c in r["conditions"]]))
            elif "incident" in r:
                ops.append(("incident", r["incident"]))
            elif "alerted" in r:
                ops.append(("alerted", [new.get(i, i) for i in r["alerted"]]))
        try:
            self._moved.update(self._apply(ops))
        except (StoreError, sqlite3.Error, OSError) as exc:
            log.error("%s: %d event(s) the last stop could not store cannot be stored yet (%s): queued first",
                      self._spool.path, len(new), exc)
            for op in [*ops, ("unspooled",)]:
                self._queue(op)
                if op[0] == "events":
                    self._unwritten.update(op[1])
                    if op[2]:
                        self._cursors[op[2][0]] = op[2][1]
            return
        self._clear_spool()
        log.warning("%s: stored %d event(s) the last stop could not store", self._spool.path, len(new))

    def _stored(self, e: Event) -> bool:
        try:
            return self._writer._db.execute("SELECT 1 FROM events WHERE time = ? AND kind = ? AND message = ?",
                                            (e.time, e.kind, e.message)).fetchone() is not None
        except sqlite3.Error:
            return False

    def _spooled(self, ops: list[tuple]) -> list[dict]:
        """The writes left at a stop, as spool records, with the ids their rows have (or will have)."""
        def real(table: str, i: int) -> int:
            return self._moved.get((table, i), i)

        records: list[dict] = []
        for op in ops:
            if op[0] == "events":
                records += [{"event": i, "kind": e.kind, "severity": str(e.severity), "message": e.message,
                             "time": e.time, "gpu": e.gpu, "engine": e.engine, "evidence": e.evidence,
                             "count": e.count, "cursor": op[2]} for i, e in op[1]]
            elif op[0] in ("conditions", "condition_rows"):
                rows = [condition_values(c) for c in op[1]] if op[0] == "conditions" else op[1]
                records.append({"conditions": [(*r[:-1], r[-1] and real("events", r[-1])) for r in rows]})
            elif op[0] == "incident":
                records.append({"incident": op[1]})
            elif op[0] == "alerted":
                records.append({"alerted": [real("events", i) for i in op[1]]})
            elif op[0] == "outbox":  # the alert itself is gone with this process; its events were alerted
                records.append({"alerted": [real("events", i) for i in op[2]]})
        return records

    # --- writes: queued, never waiting ------------------------------------------------------------

    def _ids(self, table: str, n: int) -> list[int]:
        first = self._next[table]
        self._next[table] += n
        return list(range(first, first + n))

    def _queue(self, op: tuple, lost: Iterable[tuple[str, int]] = ()) -> bool:
        with self._cond:
            if len(self._ops) >= self.limit:
                self.dropped += 1
                self._lost.update(lost)
                return False
            self._ops.append(op)
            self._cond.notify()
            return True

    def add_events(self, events: Iterable[Event], cursor: tuple[str, str] | None = None) -> list[int]:
        events = list(events)
        ids = self._ids("events", len(events))
        if self._queue(("events", list(zip(ids, events, strict=True)), cursor), [("events", i) for i in ids]):
            with self._cond:
                self._unwritten.update(zip(ids, events, strict=True))
                if cursor:
                    self._cursors[cursor[0]] = cursor[1]
        return ids

    def set_count(self, event_id: int, count: int) -> None:
        self._queue(("count", event_id, count))

    def add_changes(self, changes: Iterable[conditions.Change]) -> None:
        self._queue(("conditions", list(changes)))

    def save_incident(self, incident: dict[str, Any]) -> None:
        self._queue(("incident", dict(incident)))

    def mark_alerted(self, event_ids: Iterable[int]) -> None:
        self._queue(("alerted", list(event_ids)))

    def enqueue_alert(self, alert_id: str, severity: str, payload: dict[str, Any], targets: Iterable[str],
                      event_ids: Iterable[int], now: float) -> list[int]:
        targets = list(targets)
        ids = self._ids("outbox", len(targets))
        rows = [(i, alert_id, t, now, now, severity, json.dumps(payload)) for i, t in zip(ids, targets, strict=True)]
        self._queue(("outbox", rows, list(event_ids)), [("outbox", i) for i in ids])
        return ids

    def delivered(self, row_id: int) -> None:
        self._queue(("delivered", row_id))

    def retry_later(self, row_id: int, next_attempt: float) -> None:
        self._queue(("retry", row_id, next_attempt))

    # --- reads: the database plus what is not written yet -----------------------------------------

    def cursor(self, source: str) -> str | None:
        with self._cond:
            if source in self._cursors:
                return self._cursors[source]
        try:
            return self._reader.cursor(source)
        except StoreError as exc:
            log.error("cannot read the %s cursor: %s", source, exc)
            return None

    def events(self, since: float | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        with self._cond:
            unwritten = [_row(i, e) for i, e in self._unwritten.items() if e.time >= (since or 0.0)]
        try:
            stored = self._reader.events(since, limit)
        except StoreError as exc:
            log.error("cannot read events: %s", exc)
            stored = []
        ids = {r["id"] for r in stored}
        rows = stored + [r for r in unwritten if r["id"] not in ids]
        return sorted(rows, key=lambda r: (r["time"], r["id"]))[-limit:]

    def unalerted_events(self, since: float) -> list[tuple[int, Event]]:
        """Only events stored before this store was opened: those of this process reach the alerter directly,
        even when they were stored before the alerter started (the kernel component starts first)."""
        return self._reader.unalerted_events(since, below=self.first_id)

    def outbox(self) -> list[OutboxRow]:
        return self._reader.outbox()

    def alerted_events(self, since: float, incident: str | None) -> list[Event]:
        """Read at the alerter's first run, of what the last process stored (a store another process holds:
        none, said; the storm control then starts afresh)."""
        try:
            return self._reader.alerted_events(since, incident)
        except (StoreError, sqlite3.Error) as exc:
            log.error("cannot read the alerted events: %s", exc)
            return []

    def kills(self, since: float) -> list[tuple[str, float]]:
        """Read at start (off the loop), of what the last process stored. Unreadable: none, said (the budgets
        then start afresh, as before this was read)."""
        try:
            return self._reader.kills(since)
        except (StoreError, sqlite3.Error) as exc:
            log.error("cannot read the kills made before this start (kill budgets start afresh): %s", exc)
            return []

    def open_conditions(self) -> list[conditions.Condition]:
        """Read at start, before this process wrote any. A store another process holds now starts with none
        (said, not fatal: the watch matters more)."""
        try:
            return self._reader.open_conditions()
        except (StoreError, sqlite3.Error) as exc:
            log.error("cannot read the open conditions: %s", exc)
            return []

    def incidents(self, since: float = 0.0, open_only: bool = False) -> list[dict[str, Any]]:
        try:
            return self._reader.incidents(since, open_only)
        except (StoreError, sqlite3.Error) as exc:
            log.error("cannot read incidents: %s", exc)
            return []

    def condition_changes(self, since: float = 0.0) -> list[dict[str, Any]]:
        """Those written (an incident's bundle: what waits in memory comes in its next write)."""
        try:
            return self._reader.condition_changes(since)
        except (StoreError, sqlite3.Error) as exc:
            log.error("cannot read condition changes: %s", exc)
            return []

    @property
    def pending(self) -> int:
        return len(self._ops)

    # --- the writer thread ------------------------------------------------------------------------

    def _run(self) -> None:
        delay = 0.5
        while True:
            with self._cond:
                while not self._ops and not self._closing:
                    self._cond.wait()
                if not self._ops:
                    return
                batch = [self._ops[i] for i in range(min(_BATCH, len(self._ops)))]
            try:
                moved = self._apply(batch)
            except (StoreError, sqlite3.Error, OSError) as exc:
                self._health(exc if isinstance(exc, StoreError) else StoreError(_explain(self.path, exc)))
                with self._cond:
                    if self._closing:
                        return  # close() said how long to try; what is left is reported there
                    self._cond.wait(delay)
                delay = min(delay * 2, _RETRY_MAX)
                continue
            delay = 0.5
            if any(op[0] == "unspooled" for op in batch):
                self._clear_spool()
            with self._cond:
                self._moved.update(moved)
                for op in batch:
                    self._ops.popleft()
                    if op[0] == "events":
                        for i, _ in op[1]:
                            self._unwritten.pop(i, None)
                        if op[2] and self._cursors.get(op[2][0]) == op[2][1]:
                            del self._cursors[op[2][0]]
            self._health(None)

    def _apply(self, batch: list[tuple]) -> dict[tuple[str, int], int]:
        """One transaction for the batch; the ids that rows got where they differ from the ids handed out."""
        moved: dict[tuple[str, int], int] = {}

        def row_id(table: str, i: int) -> int | None:
            key = (table, i)
            return None if key in self._lost else moved.get(key, self._moved.get(key, i))

        db = self._writer._db
        try:
            db.execute("BEGIN IMMEDIATE")
            for op in batch:
                kind = op[0]
                if kind == "events":
                    for i, e in op[1]:
                        values = (e.time, e.kind, str(e.severity), e.gpu, e.engine, e.message,
                                  json.dumps(e.evidence, default=str), e.count, e.dedupe_key)
                        got = _insert(db, "INSERT INTO events (id, time, kind, severity, gpu, engine, message,"
                                      " evidence, count, dedupe_key, alerted) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)",
                                      i, values)
                        if got != i:
                            moved[("events", i)] = got
                    if op[2]:
                        db.execute("INSERT INTO cursors (source, cursor, updated) VALUES (?, ?, ?) ON CONFLICT(source)"
                                   " DO UPDATE SET cursor = excluded.cursor, updated = excluded.updated",
                                   (*op[2], time.time()))
                elif kind == "count":
                    db.execute("UPDATE events SET count = ? WHERE id = ?", (op[2], row_id("events", op[1])))
                elif kind in ("conditions", "condition_rows"):
                    rows = [condition_values(c) for c in op[1]] if kind == "conditions" else op[1]
                    db.executemany(_CONDITION_INSERT, [(*r[:-1], r[-1] and row_id("events", r[-1])) for r in rows])
                elif kind == "incident":
                    db.execute(_INCIDENT_UPSERT, incident_values(op[1]))
                elif kind == "alerted":
                    db.executemany("UPDATE events SET alerted = 1 WHERE id = ?",
                                   [(row_id("events", i),) for i in op[1]])
                elif kind == "outbox":
                    for i, *values in op[1]:
                        got = _insert(db, "INSERT INTO outbox (id, alert_id, target, created, next_attempt, severity,"
                                      " payload) VALUES (?, ?, ?, ?, ?, ?, ?)", i, tuple(values))
                        if got != i:
                            moved[("outbox", i)] = got
                    db.executemany("UPDATE events SET alerted = 1 WHERE id = ?",
                                   [(row_id("events", i),) for i in op[2]])
                elif kind == "delivered":
                    db.execute("DELETE FROM outbox WHERE id = ?", (row_id("outbox", op[1]),))
                elif kind == "retry":
                    db.execute("UPDATE outbox SET attempts = attempts + 1, next_attempt = ? WHERE id = ?",
                               (op[2], row_id("outbox", op[1])))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return moved

    def _health(self, exc: StoreError | None) -> None:
        error = str(exc) if exc else None
        if error != self.error:
            self.error = error
            try:
                self._loop.call_soon_threadsafe(self._on_health, error)
            except RuntimeError:
                pass  # the loop is closed: the daemon is gone

    def close(self, timeout: float = 5.0) -> None:
        """Write what waits (for up to `timeout` s), then close; what could not be written is said."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        with self._cond:
            left = list(self._ops)
        if left:
            events = sum(len(op[1]) for op in left if op[0] == "events")
            try:
                lost = self._spool.write(self._spooled(left))
            except OSError as exc:
                lost, why = len(left), exc.strerror or str(exc)
            else:
                why = "the spool is full" if self._spool.reserved else "no spool could be reserved at start"
            if lost:
                log.error("%s: %d write(s) (%d event(s)) could not be stored before the stop, %d of them not "
                          "spooled either (%s); the events were logged", self.path, len(left), events, lost, why)
            else:
                log.error("%s: %d write(s) (%d event(s)) could not be stored before the stop: kept in %s, stored "
                          "at the next start", self.path, len(left), events, self._spool.path)
        self._spool.close()
        if not self._thread.is_alive():
            self._writer.close()
        self._reader.close()

    def _clear_spool(self) -> None:
        try:
            self._spool.clear()
        except OSError as exc:  # stored already: a next start finds them stored and skips them
            log.warning("%s: cannot clear the spool: %s", self._spool.path, exc.strerror or exc)


def _insert(db: sqlite3.Connection, sql: str, row_id: int, values: tuple) -> int:
    """Insert with the id handed out; when another process took that id first, with the next free one."""
    try:
        db.execute(sql, (row_id, *values))
        return row_id
    except sqlite3.IntegrityError:
        return db.execute(sql, (None, *values)).lastrowid  # type: ignore[return-value]


def _row(row_id: int, e: Event) -> dict[str, Any]:
    return {"id": row_id, "time": e.time, "kind": e.kind, "severity": str(e.severity), "gpu": e.gpu,
            "engine": e.engine, "message": e.message, "evidence": e.evidence, "count": e.count}
