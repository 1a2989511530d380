import sqlite3

import pytest

from gpuwarden.model import Event, Severity
from gpuwarden.store import SCHEMA_VERSION, Store, StoreError


def event(kind="sq_intr", t=100.0, **kw):
    return Event(kind, Severity.WARNING, f"{kind} happened", t, **kw)


def test_events_round_trip_with_evidence_and_count(tmp_path):
    store = Store(tmp_path / "db" / "gw.db")
    [row_id] = store.add_events([event(gpu="0000:03:00.0", evidence={"line": "x", "xid": 13})])
    store.set_count(row_id, 48)
    [row] = store.events()
    assert (row["kind"], row["gpu"], row["count"]) == ("sq_intr", "0000:03:00.0", 48)
    assert row["evidence"] == {"line": "x", "xid": 13}
    assert store.events(since=101.0) == []


def test_cursor_is_saved_with_the_events(tmp_path):
    store = Store(tmp_path / "gw.db")
    store.add_events([event()], cursor=("journal", "s=1;i=9"))
    store.add_events([], cursor=("journal", "s=1;i=10"))
    store.close()
    assert Store(tmp_path / "gw.db").cursor("journal") == "s=1;i=10"


def test_wal_mode_and_schema_version(tmp_path):
    Store(tmp_path / "gw.db").close()
    db = sqlite3.connect(tmp_path / "gw.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_corrupt_database_is_a_clear_error_and_is_left_alone(tmp_path):
    path = tmp_path / "gw.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match=r"corrupt.*move it aside"):
        Store(path)
    assert path.read_bytes().startswith(b"this is not sqlite")


def test_newer_schema_is_refused(tmp_path):
    db = sqlite3.connect(tmp_path / "gw.db")
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="newer gpuwarden"):
        Store(tmp_path / "gw.db")


def test_locked_database_is_a_clear_error(tmp_path):
    store = Store(tmp_path / "gw.db")
    holder = sqlite3.connect(tmp_path / "gw.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    store._db.execute("PRAGMA busy_timeout=100")
    with pytest.raises(StoreError, match="locked by another process"):
        store.add_events([event()])
    holder.execute("ROLLBACK")


def test_a_version_1_store_is_migrated_and_keeps_its_events(tmp_path):
    from gpuwarden.store import _MIGRATIONS

    db = sqlite3.connect(tmp_path / "gw.db", isolation_level=None)
    db.executescript(_MIGRATIONS[1])
    db.execute("INSERT INTO events (time, kind, severity, message, evidence, dedupe_key) "
               "VALUES (1.0, 'sq_intr', 'warning', 'old', '{}', 'sq_intr:host')")
    db.execute("PRAGMA user_version=1")
    db.close()
    store = Store(tmp_path / "gw.db")
    assert [e["message"] for e in store.events()] == ["old"]
    assert store.unalerted_events(since=0) == []  # history is not alerted again
    store.add_events([event()])
    assert [e.kind for _, e in store.unalerted_events(since=0)] == ["sq_intr"]
