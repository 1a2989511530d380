"""`gpuwarden npd-check`: node-problem-detector's custom-plugin protocol, answered from the daemon's own state.

NPD runs the command every `invoke_interval`, kills it after `timeout` (5 s by default), and reads its exit
status (0 OK, 1 problem, anything else unknown) and the first `max_output_length` (80) bytes of stdout as the
condition's message. It never touches a GPU: `gpu` and `engine` read the open conditions from the store (read-only,
a short busy wait; docs/conditions.md),
`daemon` asks the daemon's own /metrics on loopback; the whole check is bounded by `--timeout`, and what cannot
be read in time, or at all, is unknown rather than a hang or a guess.

- gpu: a problem while a `gpu_lost` condition raised since this boot is open (a critical `device_lost`,
  `reset_failed`, `gpu_wedged`, `gpu_missing`, `gpu_unresponsive` or Xid, seen live); it clears at the next boot
  (the condition stays open in the store until gpuwarden sees the GPU back).
- engine: a problem while an engine is stalled or hung and was not killed cleanly (or could not be), or is
  down and not being restarted by gpuwarden (it exited, crash-looped, a restart failed, or it was killed with
  no restart asked: nobody but its own supervisor, if any, brings it back): what it could not fix by itself.
- daemon: a problem while gpuwarden does not answer, a component keeps failing, or its store cannot be written.
"""

from __future__ import annotations

import http.client
import sqlite3
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.core import families
from gpuwarden.core.conditions import Kind
from gpuwarden.runtime.sockets import peer_uid
from gpuwarden.store.sqlite import open_conditions

OK, PROBLEM, UNKNOWN = 0, 1, 2
MAX_MESSAGE = 80  # NPD's default max_output_length, in bytes
CONDITIONS = ("gpu", "engine", "daemon")

Verdict = tuple[int, str]
Row = dict[str, Any]


# --- the judgements: pure ------------------------------------------------------------------------------


def judge_gpu(rows: Iterable[Row], boot: float) -> Verdict:
    """Open gpu_lost conditions raised since this boot. One of an earlier boot stays open in the store until
    gpuwarden sees the GPU back, but a condition that remediation acts on must not reboot a box again for its
    last boot's fault. A daemon restart hides nothing: the condition is in the store."""
    lost = [r for r in rows if r["condition"] == Kind.GPU_LOST and r["time"] >= boot]
    if not lost:
        return OK, f"no GPU lost since boot ({_clock(boot)})"
    first = lost[0]
    subject = f" {first['subject']}" if first["subject"] != "host" else ""
    more = f" (+{len(lost) - 1} more)" if len(lost) > 1 else ""
    return PROBLEM, f"{_cause(first)}{subject} at {_clock(first['time'])}{more}: reboot"


def judge_engine(rows: Iterable[Row]) -> Verdict:
    """Open engine conditions that gpuwarden is not fixing by itself: a stall or a hang not (cleanly) killed, an
    engine down that gpuwarden is not restarting (it exited, crash-looped, a restart failed, or it was killed
    and nothing was asked to start it). Only an engine down by gpuwarden's own kill and being restarted (an
    open engine_restarting condition, which a failed restart ends) is being dealt with."""
    rows = list(rows)
    restarting = {r["subject"] for r in rows if r["condition"] == Kind.ENGINE_RESTARTING}
    unfixed = [r for r in rows if r["condition"] in (Kind.ENGINE_STALLED, Kind.ENGINE_UNRESPONSIVE)
               or (r["condition"] == Kind.ENGINE_DOWN and (set(r["causes"]) - {"engine_killed"}
                                                           or r["subject"] not in restarting))]
    if not unfixed:
        return OK, "no engine problem left unfixed"
    r = max(unfixed, key=lambda r: r["time"])
    others = {u["subject"] for u in unfixed} - {r["subject"]}
    more = f" (+{len(others)} more)" if others else ""
    how = "not restarted" if r["condition"] == Kind.ENGINE_DOWN else "not fixed"
    return PROBLEM, f"engine {r['subject']}: {r['condition']} at {_clock(r['time'])}, {how}{more}"


def _cause(row: Row) -> str:
    return row["causes"][0] if row["causes"] else str(row["condition"])


def judge_daemon(metrics: str) -> Verdict:
    down, store, ours = [], None, False
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            ours = ours or sample.name == families.BUILD_INFO.name
            if sample.name == families.COMPONENT_UP.name and sample.value == 0:
                down.append(sample.labels.get("component", "?"))
            elif sample.name == families.STORE_WRITABLE.name:
                store = sample.value
    if not ours:  # another exporter on gpuwarden's port says nothing about gpuwarden
        return UNKNOWN, "unknown: what answers on the exporter's port is not gpuwarden"
    if down:
        parts = "component" if len(down) == 1 else "components"
        return PROBLEM, f"gpuwarden {parts} failing: {', '.join(sorted(down))}"
    if store == 0:
        return PROBLEM, "gpuwarden cannot write its event store"
    return OK, "gpuwarden runs, every component up"


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%H:%M:%S")


def message(text: str) -> str:
    """One line of at most MAX_MESSAGE bytes (NPD cuts bytes, which could split a character)."""
    line = " ".join(text.split())
    return line.encode()[:MAX_MESSAGE].decode(errors="ignore")


# --- the thin edges: the store, /proc, the exporter ----------------------------------------------------


def read_conditions(db: Path, timeout: float) -> list[Row]:
    """The open conditions, oldest first, from a read-only connection that creates no file."""
    if not db.is_file():
        raise LookupError(f"no store at {db} (has gpuwarden run here?)")
    # Even read-only, a WAL reader creates the -wal and -shm files when no one else has them open (a stopped
    # daemon: its last close checkpointed everything into the database and removed them). Then the database
    # is complete on its own: read it as immutable, which touches nothing (and works on a read-only mount).
    immutable = "" if db.with_name(f"{db.name}-wal").exists() else "&immutable=1"
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro{immutable}", uri=True, timeout=timeout)
    try:
        if conn.execute("PRAGMA user_version").fetchone()[0] < 3:
            raise LookupError("the store has no conditions yet: start this gpuwarden version once")
        found = open_conditions(conn)
    finally:
        conn.close()
    return [{"time": c.since, "condition": c.key.kind, "subject": c.key.subject, "gpu": c.gpu, "engine": c.engine,
             "causes": sorted(c.causes)} for c in found]


def boot_time(stat: Path = Path("/proc/stat")) -> float:
    for line in stat.read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise LookupError(f"no btime in {stat}")


def metrics_url(listen: str, port: int) -> str:
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(listen, listen)  # a wildcard: loopback
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"


def fetch(url: str, timeout: float, limit: int = 4 << 20) -> tuple[str, int | None]:
    """The body of GET `url`, and the uid of the socket that answered (None: not found in /proc/net)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.connect()
        uid = peer_uid(conn.sock)
        conn.request("GET", parts.path)
        response = conn.getresponse()
        if response.status != 200:
            raise OSError(f"HTTP {response.status}")
        return response.read(limit).decode(errors="replace"), uid
    finally:
        conn.close()


# --- the command ---------------------------------------------------------------------------------------


def check(condition: str, config, timeout: float) -> Verdict:
    db = config.daemon.state_dir / "gpuwarden.db"
    wait = max(0.1, timeout / 2)
    if condition == "gpu":
        return judge_gpu(read_conditions(db, wait), boot_time())
    if condition == "engine":
        return judge_engine(read_conditions(db, wait))
    if not config.exporter.enabled:
        return UNKNOWN, "unknown: [exporter] is disabled, so the daemon cannot be asked"
    url = metrics_url(config.exporter.listen, config.exporter.port)
    try:
        text, uid = fetch(url, wait)
    except (OSError, http.client.HTTPException) as exc:
        return PROBLEM, f"gpuwarden is not running: no answer at {url[7:-8]} ({getattr(exc, 'strerror', None) or exc})"
    # Its port is unprivileged: anyone can serve a healthy-looking gpuwarden there while it is down. The daemon is
    # the owner of its state dir (root, as a service).
    state = config.daemon.state_dir
    owner = state.stat().st_uid if state.exists() else 0
    if uid != owner:
        who = "an unknown socket" if uid is None else f"uid {uid}"
        return PROBLEM, f"gpuwarden is not what answers at {url[7:-8]}: {who} does, not uid {owner}"
    return judge_daemon(text)


def bounded(run: Callable[[], Verdict], timeout: float) -> Verdict:
    """`run()` in a thread, given up on after `timeout` s: a hung disk or socket answers unknown, in time."""
    result: list[Verdict] = []

    def body() -> None:
        try:
            result.append(run())
        except sqlite3.DatabaseError as exc:
            result.append((UNKNOWN, f"unknown: store unreadable: {exc}"))
        except Exception as exc:
            result.append((UNKNOWN, f"unknown: {exc}"))

    thread = threading.Thread(target=body, name="npd-check", daemon=True)
    thread.start()
    thread.join(timeout)
    return result[0] if result else (UNKNOWN, f"unknown: no answer within {timeout:g} s")
