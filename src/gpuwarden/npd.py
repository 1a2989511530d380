"""`gpuwarden npd-check`: node-problem-detector's custom-plugin protocol, answered from the daemon's own state.

NPD runs the command every `invoke_interval`, kills it after `timeout` (5 s by default), and reads its exit
status (0 OK, 1 problem, anything else unknown) and the first `max_output_length` (80) bytes of stdout as the
condition's message. It never touches a GPU: `gpu` and `engine` read the store (read-only, a short busy wait),
`daemon` asks the daemon's own /metrics on loopback; the whole check is bounded by `--timeout`, and what cannot
be read in time, or at all, is unknown rather than a hang or a guess.

- gpu: a problem while a GPU has been lost since this boot (a critical `device_lost`, `reset_failed`,
  `gpu_wedged`, `gpu_missing`, `gpu_unresponsive` or Xid, seen live): only a reboot cures it, so it clears at
  the next boot.
- engine: a problem while, within `--window`, an engine stalled or hung and was not killed cleanly, crash-looped,
  or could not be killed (`kill_refused`, survivors): what gpuwarden could not fix by itself.
- daemon: a problem while gpuwarden does not answer, a component keeps failing, or its store cannot be written.
"""

from __future__ import annotations

import http.client
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from gpuwarden import families
from gpuwarden.kinds import ENGINE_KINDS, GPU_LOST_KINDS
from gpuwarden.model import HISTORY
from gpuwarden.sockets import peer_uid

OK, PROBLEM, UNKNOWN = 0, 1, 2
MAX_MESSAGE = 80  # NPD's default max_output_length, in bytes
CONDITIONS = ("gpu", "engine", "daemon")

Verdict = tuple[int, str]
Row = dict[str, Any]


# --- the judgements: pure ------------------------------------------------------------------------------


def judge_gpu(rows: Iterable[Row], boot: float) -> Verdict:
    """Live events only: history (lines logged before gpuwarden started) may be a journal catch-up of an earlier
    boot stamped now, and a condition that remediation acts on must not reboot a box for its last boot's fault.
    A daemon restart hides nothing: the live event of its first run is in the store."""
    lost = [r for r in rows if r["time"] >= boot and r["severity"] == "critical" and r["kind"] in GPU_LOST_KINDS
            and HISTORY not in r["evidence"]]
    if not lost:
        return OK, f"no GPU lost since boot ({_clock(boot)})"
    first = lost[0]
    subject = f" {first['gpu']}" if first["gpu"] else ""
    more = f" (+{len(lost) - 1} more)" if len(lost) > 1 else ""
    return PROBLEM, f"{first['kind']}{subject} at {_clock(first['time'])}{more}: reboot"


def _fixes(r: Row) -> bool:
    """A clean kill (every process gone; a kill is critical since the engine is down) or the engine back."""
    evidence = r["evidence"]
    return r["kind"] == "engine_back" or (r["kind"] == "engine_killed" and not evidence.get("dry_run")
                                          and not evidence.get("survivors"))


def judge_engine(rows: Iterable[Row], since: float) -> Verdict:
    """The newest unfixed critical event per engine: a clean (not dry-run) kill fixes a stall or a hang, the
    engine back fixes what came before."""
    unfixed: dict[str, Row] = {}
    for r in rows:
        if r["time"] < since or r["kind"] not in ENGINE_KINDS:
            continue
        name = r["engine"] or "?"
        if _fixes(r):
            unfixed.pop(name, None)
        elif r["severity"] == "critical":
            unfixed[name] = r
    if not unfixed:
        return OK, "no engine problem left unfixed"
    name, r = max(unfixed.items(), key=lambda item: item[1]["time"])
    more = f" (+{len(unfixed) - 1} more)" if len(unfixed) > 1 else ""
    return PROBLEM, f"engine {name}: {r['kind']} at {_clock(r['time'])}, not fixed{more}"


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
        return PROBLEM, f"gpuwarden component(s) failing: {', '.join(sorted(down))}"
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


def read_events(db: Path, since: float, timeout: float, kinds: Iterable[str]) -> list[Row]:
    """Events of `kinds` at or after `since`, oldest first, from a read-only connection that creates no file.
    The kinds are picked in SQL (beside the time index): a store of every event since boot, JSON decoded in
    Python, took longer than NPD's timeout at 300,000 rows (bench/npd_bench.py)."""
    if not db.is_file():
        raise LookupError(f"no store at {db} (has gpuwarden run here?)")
    # Even read-only, a WAL reader creates the -wal and -shm files when no one else has them open (a stopped
    # daemon: its last close checkpointed everything into the database and removed them). Then the database
    # is complete on its own: read it as immutable, which touches nothing (and works on a read-only mount).
    immutable = "" if db.with_name(f"{db.name}-wal").exists() else "&immutable=1"
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro{immutable}", uri=True, timeout=timeout)
    try:
        kinds = sorted(kinds)
        rows = conn.execute("SELECT time, kind, severity, gpu, engine, evidence FROM events WHERE time >= ? AND kind"
                            f" IN ({', '.join('?' * len(kinds))}) ORDER BY time, id", (since, *kinds)).fetchall()
    finally:
        conn.close()
    keys = ("time", "kind", "severity", "gpu", "engine", "evidence")
    return [dict(zip(keys, (*row[:5], json.loads(row[5] or "{}")), strict=True)) for row in rows]


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


def check(condition: str, config, window: float, timeout: float, now: float | None = None) -> Verdict:
    now = time.time() if now is None else now
    db = config.daemon.state_dir / "gpuwarden.db"
    wait = max(0.1, timeout / 2)
    if condition == "gpu":
        boot = boot_time()
        return judge_gpu(read_events(db, boot, wait, GPU_LOST_KINDS), boot)
    if condition == "engine":
        return judge_engine(read_events(db, now - window, wait, ENGINE_KINDS), now - window)
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
