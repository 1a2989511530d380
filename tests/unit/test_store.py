import sqlite3
import stat

import pytest

from faults import LockHolder
from gpuwarden.core.model import Event, Severity
from gpuwarden.store import bundles as report
from gpuwarden.store.sqlite import ALERTED_EVENTS, SCHEMA_VERSION, Store, StoreError, private_folder


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


def test_the_kills_read_back_at_a_start_are_the_real_ones_within_the_window(tmp_path):
    store = Store(tmp_path / "gw.db")
    store.add_events([event("engine_killed", 90.0, engine="a", evidence={"dry_run": False}),  # before the window
                      event("engine_killed", 110.0, engine="a", evidence={"dry_run": False}),
                      event("engine_killed", 120.0, engine="b", evidence={"dry_run": True}),  # a dry run kills none
                      event("kill_refused", 125.0, engine="a"),
                      event("engine_killed", 130.0, engine="b", evidence={"dry_run": False, "survivors": [7]})])
    assert store.kills(since=100.0) == [("a", 110.0), ("b", 130.0)]
    assert store.kills(since=100.0, limit=1) == [("b", 130.0)]  # the newest


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
    from gpuwarden.store.sqlite import _MIGRATIONS

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


def test_a_locked_store_keeps_events_and_cursor_in_memory_and_writes_them_once_free(tmp_path):
    import asyncio

    from gpuwarden.store.sqlite import QueuedStore

    path = tmp_path / "gw.db"
    health = []

    async def scenario():
        store = QueuedStore(path, asyncio.get_running_loop(), health.append)
        holder = LockHolder(path)
        ids = store.add_events([event("ring_timeout", t=1.0), event("sq_intr", t=2.0)], cursor=("journal", "c=7"))
        store.set_count(ids[0], 12)
        while not health:
            await asyncio.sleep(0.02)
        seen_while_locked = ([e["kind"] for e in store.events()], store.cursor("journal"), store.pending)
        holder.release()
        while health[-1] is not None:
            await asyncio.sleep(0.02)
        store.close()
        return ids, seen_while_locked

    ids, (kinds, cursor, pending) = asyncio.run(scenario())
    assert "locked by another process" in health[0] and health[-1] is None
    assert kinds == ["ring_timeout", "sq_intr"] and cursor == "c=7" and pending == 2
    fresh = Store(path)
    assert [(e["id"], e["kind"], e["count"]) for e in fresh.events()] == [(ids[0], "ring_timeout", 12),
                                                                          (ids[1], "sq_intr", 1)]
    assert fresh.cursor("journal") == "c=7"


def test_an_id_taken_by_another_process_is_remapped(tmp_path):
    import asyncio

    from gpuwarden.store.sqlite import QueuedStore

    path = tmp_path / "gw.db"

    async def scenario():
        store = QueuedStore(path, asyncio.get_running_loop(), lambda error: None)
        other = Store(path)  # `gpuwarden quarantine` recording an event while the daemon runs
        [theirs] = other.add_events([event("cache_poisoned")])
        [ours] = store.add_events([event("sq_intr")])
        store.set_count(ours, 5)
        store.close()
        return theirs, ours

    theirs, ours = asyncio.run(scenario())
    assert theirs == ours  # both were handed the same next id
    rows = {e["kind"]: e for e in Store(path).events()}
    assert rows["cache_poisoned"]["count"] == 1 and rows["sq_intr"]["count"] == 5
    assert rows["sq_intr"]["id"] != rows["cache_poisoned"]["id"]


def test_a_truncated_database_is_reported_as_truncated(tmp_path):
    import os

    path = tmp_path / "gw.db"
    store = Store(path)
    store.add_events([event(evidence={"pad": "x" * 4000}) for _ in range(40)])
    store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    os.truncate(path, 8192)  # a copy cut short, or a disk that filled up mid-write
    with pytest.raises(StoreError, match=r"database is truncated \(8192 bytes; its header says \d+\)"):
        Store(path).events()


def test_beyond_its_bound_the_queue_drops_writes_and_counts_them(tmp_path):
    import asyncio

    from gpuwarden.store.sqlite import QueuedStore

    path = tmp_path / "gw.db"

    async def scenario():
        store = QueuedStore(path, asyncio.get_running_loop(), lambda error: None, limit=2)
        holder = LockHolder(path)
        kept = store.add_events([event("ring_timeout")]) + store.add_events([event("sq_intr")])
        store.add_events([event("page_fault")])  # the third write: over the bound
        dropped_writes = store.dropped
        holder.release()
        while store.pending:
            await asyncio.sleep(0.02)
        store.close()
        return kept, dropped_writes

    kept, dropped_writes = asyncio.run(scenario())
    assert dropped_writes == 1
    rows = Store(path).events()
    assert [(r["id"], r["kind"], r["count"]) for r in rows] == [(kept[0], "ring_timeout", 1),
                                                                (kept[1], "sq_intr", 1)]


def test_only_events_stored_before_this_process_count_as_never_alerted(tmp_path):
    """On a first start the log said "alerting 17 event(s) stored before the last stop but never alerted" for
    events stored milliseconds earlier by the same process: the kernel component starts before the alerter."""
    import asyncio

    from gpuwarden.store.sqlite import QueuedStore

    path = tmp_path / "gw.db"
    earlier = Store(path)  # a daemon that stored an event and died before alerting it
    earlier.add_events([event("ring_timeout")])
    earlier.close()

    async def scenario(kind: str) -> list[str]:
        store = QueuedStore(path, asyncio.get_running_loop(), lambda error: None)
        store.add_events([event(kind)])  # this process's own, before its alerter recovers the backlog
        while store.pending:
            await asyncio.sleep(0.01)
        kinds = [e.kind for _, e in store.unalerted_events(since=0)]
        store.close()
        return kinds

    assert asyncio.run(scenario("sq_intr")) == ["ring_timeout"]
    assert asyncio.run(scenario("page_fault")) == ["ring_timeout", "sq_intr"]  # the next start: both earlier


def test_the_state_dir_and_database_are_the_owners_alone(tmp_path):
    """Events hold kernel lines and process lists: a new state dir is 0700, the database and its -wal/-shm
    0600, whatever the umask (`gpuwarden run` by hand, not only under the unit's UMask=0077)."""
    import os

    state = tmp_path / "state"
    old = os.umask(0o022)
    try:
        store = Store(state / "gpuwarden.db")
        store.add_events([event()])
        modes = {p.name: p.stat().st_mode & 0o777 for p in state.iterdir()}
        store.close()
    finally:
        os.umask(old)
    assert state.stat().st_mode & 0o777 == 0o700
    assert modes == {"gpuwarden.db": 0o600, "gpuwarden.db-wal": 0o600, "gpuwarden.db-shm": 0o600}


def test_a_database_others_could_read_is_tightened(tmp_path):
    path = tmp_path / "gpuwarden.db"
    Store(path).close()
    path.chmod(0o644)  # made by a gpuwarden before this rule
    Store(path).close()
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_reader_beside_the_daemon_loses_none_of_its_writes(tmp_path):
    """Making the database private must never close a descriptor of it: that drops the SQLite locks of the
    process's open connections (POSIX locks are per process); a reader in another process (`gpuwarden events`)
    then took itself for the only one and removed the WAL that the daemon went on writing into."""
    import asyncio
    import subprocess
    import sys

    from gpuwarden.store.sqlite import QueuedStore

    path = tmp_path / "gw.db"
    read = (f"from pathlib import Path; from gpuwarden.store.sqlite import Store; "
            f"print(len(Store(Path({str(path)!r})).events()))")
    seen = []

    async def scenario():
        store = QueuedStore(path, asyncio.get_running_loop(), lambda error: None)
        for i in range(4):
            store.add_events([event("sq_intr", t=float(i))])
            while store.pending:
                await asyncio.sleep(0.01)
            seen.append(int(subprocess.run([sys.executable, "-c", read], capture_output=True, text=True,
                                           check=True).stdout))
        store.close()

    asyncio.run(scenario())
    assert seen == [1, 2, 3, 4]
    assert len(Store(path).events()) == 4


def test_a_state_folder_is_made_private_and_an_old_open_one_of_ours_is_tightened(tmp_path):
    new = tmp_path / "new" / "state"
    assert private_folder(new, ours=False) is None and stat.S_IMODE(new.stat().st_mode) == 0o700
    old = tmp_path / "old"  # made 0755 before the 0700 rule
    old.mkdir(mode=0o755)
    old.chmod(0o755)
    assert private_folder(old, ours=True) is None and stat.S_IMODE(old.stat().st_mode) == 0o700


def test_a_folder_the_user_chose_is_never_chmodded_nor_one_reached_through_a_link(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    warning = private_folder(shared, ours=False)
    assert "open to other users (mode 0755)" in warning and stat.S_IMODE(shared.stat().st_mode) == 0o755
    link = tmp_path / "link"
    link.symlink_to(shared)
    assert private_folder(link, ours=True) is None and stat.S_IMODE(shared.stat().st_mode) == 0o755


def test_incident_bundles_live_in_a_private_folder(tmp_path):
    incidents = tmp_path / "incidents"
    incidents.mkdir()
    incidents.chmod(0o755)  # an incidents folder from before the rule
    report.write(incidents / "20261203-120000-sq_intr", {"trigger": {}})
    assert stat.S_IMODE(incidents.stat().st_mode) == 0o700


def test_a_start_reads_the_alerted_events_through_the_time_index(tmp_path):
    """The storm control's resume read at every start: by the time index from `since`, never a scan of every
    stored event (1 M events made it 110-138 ms of each start)."""
    store = Store(tmp_path / "events.db")
    store.add_events([Event("sq_intr", Severity.WARNING, "m", 1000.0 + i) for i in range(50)])
    plan = store._db.execute("EXPLAIN QUERY PLAN " + ALERTED_EVENTS, (1010.0, None, 10)).fetchall()
    assert any("USING INDEX events_time" in row[-1] for row in plan), plan
    assert not any(row[-1] == "SCAN events" for row in plan), plan


def test_the_spool_reads_back_what_it_holds_across_its_read_blocks(tmp_path):
    """Start reads the spool a block at a time up to its end (not the reserved megabyte whole): records longer
    than a block, and records that end on a block's edge, come back whole; an empty spool reads as none."""
    from gpuwarden.store.sqlite import _SPOOL_BLOCK, Spool

    spool = Spool(tmp_path / "s.spool")
    assert spool.read() == []
    records = [{"n": i, "text": "x" * (_SPOOL_BLOCK // 3)} for i in range(7)]
    assert spool.write(records) == 0
    assert spool.read() == records
    spool.close()
    reopened = Spool(tmp_path / "s.spool")
    assert reopened.read() == records
    reopened.clear()
    assert reopened.read() == []
    reopened.close()


def test_two_openers_of_a_new_store_at_once_both_open_it(tmp_path):
    """The daemon makes its store while `gpuwarden events` opens it (a test polls events as the daemon starts):
    both read schema version 0 and both ran the first migration; the second failed ("table ... already exists")."""
    import threading

    def open_it(path, start, errors):
        start.wait()
        try:
            Store(path).close()
        except Exception as exc:
            errors.append(exc)

    for round_ in range(20):
        path, start, errors = tmp_path / f"{round_}.db", threading.Barrier(2), []
        threads = [threading.Thread(target=open_it, args=(path, start, errors)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
